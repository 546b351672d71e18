"""How an exchange ends for the client.

The attempt loop decides *which* ending; this module says it, once, in the
API's shape, and records it on the exchange for the flow's story:

- an upstream's output was committed: the story names who answered;
- a provider's failure is forwarded as it was sent (the last possible attempt,
  or a fatal error), or, once keepalive headers have left, told in band;
- every upstream is exhausted: the last failure that said something, as sent,
  else Switchyard's own 502/504 (in band after keepalive headers);
- a stream broke or stalled after output: an in-band error, never a clean end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..apis import ErrorInfo
from ..apis.errors import code_and_type_for_status
from ..exchange import AttemptRecord, Exchange, ExchangeOutcome
from ..upstreams.messages import forwarded_response_headers
from .client_stream import ClientStream
from .log import AttemptLog


@dataclass(slots=True)
class Answered:
    """A failure as the provider sent it, kept in case it turns out to be the last."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    record: AttemptRecord
    complete: bool = True  # False: the body broke off, stalled or passed the limit while it was read


class Endings:
    def __init__(self, exchange: Exchange, client: ClientStream, log: AttemptLog) -> None:
        self.exchange = exchange
        self.client = client
        self.log = log
        self.last_answered: Answered | None = None  # what exhaustion forwards, if anything
        self.last_messages: list[bytes] | None = None  # a WebSocket turn's, instead

    def keep(self, record: AttemptRecord, status: int, headers: Mapping[str, str], body: bytes, *,
             complete: bool = True) -> Answered:
        """Remember a failed answer: for exhaustion, and to show the attempt in mitmweb."""
        answered = Answered(status, forwarded_response_headers(headers), body, record, complete)
        self.last_answered = answered
        self.last_messages = None
        record.kept(answered.status, answered.headers, answered.body)
        return answered

    def keep_messages(self, messages: list[bytes]) -> None:
        """A WebSocket turn's failed answer, message by message: what exhaustion forwards
        (as the upstream sent it) should every later attempt fail."""
        self.last_messages = messages

    @staticmethod
    def show(record: AttemptRecord, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """An answer shown with its attempt in mitmweb, never forwarded (it said nothing)."""
        record.kept(status, forwarded_response_headers(headers), body)

    def committed(self, record: AttemptRecord, first_event: str) -> None:
        self._ended("committed", record)
        self.log.committed(record, first_event)

    def passing(self, record: AttemptRecord) -> None:
        """A WebSocket turn that may not be re-sent: its answer is the client's as it comes."""
        self.exchange.answered_by = record.upstream
        self.exchange.answered_url = record.url

    def settled(self) -> None:
        """A WebSocket turn's answer came to its end: committed, unless it ended otherwise."""
        if self.exchange.outcome == "pending":
            self.exchange.outcome = "committed"

    def forwarded(self, record: AttemptRecord) -> None:
        """A failure the client gets as the upstream sent it (a WebSocket turn's messages)."""
        self._ended("gave_up", record)

    def stalled_unresent(self, record: AttemptRecord, message: str) -> None:
        """A turn that may not be re-sent got no output in time: the client is told in band."""
        self._ended("exhausted")
        self.client.start(200, [], record.upstream)
        self.client.error_event(f"switchyard: {message}", "upstream_timeout")

    def gave_up(self, answered: Answered) -> None:
        """The client gets this (failed) answer: say whose it is."""
        self._ended("gave_up", answered.record)

    def cut(self, record: AttemptRecord, message: str, code: Literal["stream_cut", "stream_stalled"]) -> None:
        """A stream that broke after output must not look like a clean end."""
        self._ended(code)
        self.log.cut(record, code, message)
        self.client.error_event(f"switchyard: {message}", code)

    def forward(self, answered: Answered, info: ErrorInfo) -> None:
        """A provider's failure, for the client as it was sent."""
        self.gave_up(answered)
        if self.client.headers_sent:
            # the provider's own type, else the one its status stands for: a fatal error
            # must not read as one worth retrying
            error_type = info.type
            if error_type is None and info.status is not None:
                error_type = code_and_type_for_status(self.client.api.name, info.status)[1]
            code = info.code or error_type or "upstream_error"
            self.client.error_event(self.log.redact(info.message) if info.message else "upstream failed", code, error_type)
        else:
            self._send(answered)

    def exhausted(self, last_message: str, timed_out: bool) -> None:
        """Nothing left to try and no upstream response open to forward."""
        if self.last_messages is not None and not self.client.headers_sent:
            # a WebSocket turn's last failure, message by message as the upstream sent it
            self._ended("exhausted")
            self.log.exhausted(last_message)
            self.client.start(200, [], "")
            for sent in self.last_messages:
                self.client.message(sent)
            return
        forwarded = self.last_answered if not self.client.headers_sent else None
        self._ended("exhausted", forwarded.record if forwarded is not None else None)
        self.log.exhausted(last_message)
        last_message = self.log.redact(last_message)
        code = "upstream_timeout" if timed_out else "upstream_unavailable"
        if self.client.headers_sent:
            self.client.error_event(f"switchyard: every upstream failed; last: {last_message}", code)
        elif forwarded is not None:
            self._send(forwarded)
        else:
            message = f"switchyard: no upstream answered; last: {last_message}"
            self.client.send_error(504 if timed_out else 502, message, code, self.exchange.attempts[-1].upstream)

    def continued(self) -> None:
        """A continuation finished the answer a cut left unfinished."""
        self._ended("continued")

    def client_gone(self) -> None:
        """The client left before the end: nothing more is written."""
        self._ended("client_gone")
        self.log.client_gone()

    def internal_error(self, what: str) -> None:
        """A bug: it costs this exchange, told to the client in the API's shape."""
        self._ended("internal_error")
        message = f"switchyard: internal error ({what}); see the mitmproxy log"
        if self.client.headers_sent:
            self.client.error_event(message, "switchyard_internal_error")
        else:
            upstream = self.exchange.attempts[-1].upstream if self.exchange.attempts else "none"
            self.client.send_error(502, message, "switchyard_internal_error", upstream)

    def _ended(self, outcome: ExchangeOutcome, answering: AttemptRecord | None = None) -> None:
        """The one writer of how the exchange ended, and of whose answer the client got."""
        self.exchange.outcome = outcome
        if answering is not None:
            self.exchange.answered_by = answering.upstream
            self.exchange.answered_url = answering.url

    def _send(self, answered: Answered) -> None:
        """A failed answer as the provider sent it; one that broke off while it was
        read reaches the client broken off too, never with a length claiming it whole."""
        if answered.complete:
            self.client.send_whole(answered.status, answered.headers, answered.body, answered.record.upstream)
            return
        self.client.start(answered.status, answered.headers, answered.record.upstream)
        self.client.write(answered.body)
        self.client.cut()
