"""One routed client request as recorded: the client's request, each attempt's
record, and how the exchange ended.

Written by the attempt core (attempts/), read by the Router's hooks to show
the flow in mitmweb; both run in mitmproxy's event loop, so no locking is needed.
Where the flow is shown while it streams (mitmweb, the console), the exchange has
a listener (`AttemptListener`) that the record tells when an attempt ends: the
one seam between the sans-io core and the display, which only notes the record
and returns (addons/live_story.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .apis import ErrorInfo
from .redaction import looks_like_credential
from .apis.google_gemini import streams
from .retry import PlanAction
from .rules import Route


@dataclass(frozen=True, slots=True)
class OriginalRequest:
    """The client's request as it reached mitmproxy, before any rewrite."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    wants_stream: bool = False  # the JSON body says "stream": true (Gemini: the URL, `:streamGenerateContent?alt=sse`)
    wants_usage: bool = False  # and "stream_options": {"include_usage": true} (Chat): usage ends the answer
    # where the listener knew only the destination's address (transparent, local, ...): `url`
    # holds the name the client meant, and this the address to reach it at
    address: str | None = None

    @classmethod
    def of(cls, method: str, url: str, headers: tuple[tuple[str, str], ...], body: bytes, json_body: Any,
           address: str | None = None) -> "OriginalRequest":
        stream = isinstance(json_body, dict) and json_body.get("stream") is True
        stream = stream or streams(url)  # Gemini says it in the URL
        options = json_body.get("stream_options") if stream else None
        usage = isinstance(options, dict) and options.get("include_usage") is True
        return cls(method, url, headers, body, stream, usage, address)


AttemptOutcome = Literal["pending", "committed", "passed_through", "not_resent", "fatal", "continued", "continuation_failed",
                         "continuation_broke", "hedge_lost"] | PlanAction
"""How an attempt ended: still going, its output reached the client (committed), or
what its failure led to (fatal, or the plan after it: retry, next_upstream, give_up).
A continuation of a cut answer ends continued, continuation_failed (nothing of it
reached the client) or continuation_broke (some of its text did).  Of two attempts
hedged against each other, the one that did not produce output first ends hedge_lost."""

Phase = Literal["connect", "headers", "staging", "body", "output", "forwarded"]
"""How far an attempt got: no answer yet; the answer's head arrived; a stream held
until its first output; a whole body being read; committed; its failure passed on
to the client as the provider sent it."""

ExchangeOutcome = Literal["pending", "committed", "continued", "gave_up", "exhausted", "stream_cut",
                          "stream_stalled", "client_gone", "internal_error"]
"""How the exchange ended for the client (see `attempts/endings.py`)."""


AttemptListener = Callable[["AttemptRecord"], None]
"""Told each attempt's end (a failure, a commit, a lost hedge, a continuation's end),
inside the attempt core's step: for display only, so it must note the record and
return, and never raise (a raise would cost the exchange its answer)."""


@dataclass(slots=True)
class AttemptRecord:
    """One try of one upstream: what a person debugging a failure needs to see.

    Its fields are written only by the methods below, each called where that
    event happens; the flow's story is made from these records and nothing
    decides anything by reading the story back."""

    attempt: int
    upstream: str
    url: str
    started: float  # time.monotonic(), as every time below: the attempt's request was asked for
    outcome: AttemptOutcome = "pending"
    phase: Phase = "connect"
    status: int | None = None
    code: str | None = None
    message: str | None = None
    event_type: str | None = None
    request_id: str | None = None
    duration_s: float | None = None
    fault: str | None = None  # the injected fault, if this attempt's failure was made on purpose
    continuation: str | None = None  # prefill | regenerate: this attempt finishes a cut answer
    hedge: bool = False  # started beside a slow attempt (hedge_after_s), not after a failure
    # for the attempt's own flow in mitmweb (not in metadata): what was sent and what came back
    request_headers: tuple[tuple[str, str], ...] = ()
    secret_headers: frozenset[str] = frozenset()  # names in request_headers never to show
    request_method: str = "POST"
    # what was sent (the bytes the request went with, not a copy); a WebSocket attempt's: the
    # turn's message on the socket.  Shown bounded and redacted (addons/attempt_flows.py)
    request_body: bytes = b""
    answer: tuple[int, list[tuple[str, str]], bytes] | None = None
    sent_at: float | None = None  # the request is on a connection
    answered_at: float | None = None  # the answer's head arrived (a WebSocket's: the upgrade)
    ended_at: float | None = None
    ended_hook: AttemptListener | None = field(default=None, repr=False, compare=False)  # see Exchange.add

    def shown_request_headers(self) -> list[tuple[str, str]]:
        return [(name, "[redacted]" if name.lower() in self.secret_headers or looks_like_credential(name) else value)
                for name, value in self.request_headers]

    _PUBLIC: ClassVar[tuple[str, ...]] = ("attempt", "upstream", "url", "outcome", "phase", "status", "code", "message",
               "event_type", "request_id", "duration_s", "fault", "continuation", "hedge")

    def request_sent(self, sent: bool, at: float) -> None:
        """The request is on a connection (or, False, going to a fresh one): a failure
        from now on happened waiting for the answer's headers, not connecting."""
        self.phase = "headers" if sent else "connect"
        self.sent_at = at if sent else None

    def reached(self, phase: Phase) -> None:
        self.phase = phase

    def injected(self, fault: str) -> None:
        self.fault = fault

    def answered(self, status: int, request_id: str | None, at: float) -> None:
        """The answer's head arrived."""
        self.phase = "headers"
        self.status = status
        self.request_id = request_id
        self.answered_at = at

    def upgraded(self, at: float) -> None:
        """A WebSocket attempt's upgrade was accepted: its answer's first byte."""
        self.answered_at = at

    def failed(self, info: ErrorInfo, outcome: AttemptOutcome, message: str) -> None:
        """Failed before output; `message` is the failure's, redacted.  A transport
        failure's status is only what a client would get: no upstream sent it."""
        self.status = None if info.event_type == "transport" else info.status
        self.code, self.message = info.code or info.type, message
        self.event_type = info.event_type
        self._finish(outcome)

    def failed_after_output(self, info: ErrorInfo | None, event_type: str | None, message: str | None) -> None:
        """The first failure after output, forwarded: only what it says replaces what the answer said."""
        self.event_type = event_type
        if info is not None:
            self.status = info.status or self.status
            self.code = info.code or info.type
            self.message = message

    def committed(self) -> None:
        self.phase = "output"
        self._finish("committed")

    def passed_through(self) -> None:
        """A later WebSocket turn's answer, forwarded as it came: never held, never re-sent."""
        self.phase = "output"
        self._finish("passed_through")

    def cut(self, message: str) -> None:
        """Its output was cut: what the story says was continued, if a continuation follows."""
        self.message = message

    def continued(self) -> None:
        """A continuation that finished the client's answer."""
        self.phase = "output"
        self._finish("continued")

    def continuation_failed(self, message: str, *, code: str | None = None, progressed: bool = False) -> None:
        """A continuation that did not finish the answer; `progressed`: some of its text reached the client."""
        if code is not None:
            self.code = code
        self.message = message
        self._finish("continuation_broke" if progressed else "continuation_failed")

    def lost_hedge(self) -> None:
        """Another attempt produced output first: this one was stopped, nothing of it sent."""
        self._finish("hedge_lost")

    def kept(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """The failed answer, shown with the attempt's own flow in mitmweb."""
        self.answer = (status, headers, body)

    def _finish(self, outcome: AttemptOutcome) -> None:
        self.outcome = outcome
        self.ended_at = time.monotonic()
        self.duration_s = round(self.ended_at - self.started, 4)
        if self.ended_hook is not None:
            self.ended_hook(self)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._PUBLIC}


@dataclass(slots=True)
class Exchange:
    """One routed request's record: what the attempt core writes as it decides (the
    attempts, how the exchange ended, whose answer the client got), and what the
    flow's story and the log are made from.  The relay's ticket and the Router's
    view of the flow are kept apart, each by its own writer."""

    route: Route
    request: OriginalRequest
    attempts: list[AttemptRecord] = field(default_factory=list)
    answered_by: str | None = None  # upstream name whose answer the client got
    answered_url: str | None = None
    suppressed_failover: bool = False
    outcome: ExchangeOutcome = "pending"
    # upstreams this request did not ask because an earlier one learnt they are out
    # (attempts/outages.py): each "upstream: why; how long left"
    skipped: list[str] = field(default_factory=list)
    # told each attempt's end, where someone watches the flow live (see AttemptListener)
    listener: AttemptListener | None = field(default=None, repr=False, compare=False)

    def add(self, record: AttemptRecord) -> None:
        """A new attempt joins the exchange; its end will be told to the listener, if any.
        The record holds the listener itself, not the exchange: no reference cycle."""
        record.ended_hook = self.listener
        self.attempts.append(record)
