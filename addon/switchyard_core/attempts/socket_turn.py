"""A WebSocket turn's attempt over the upstream's own WebSocket: messages in, the
same decisions out.

Each message is one whole frame of a Responses answer, read through the same
`Gate` (in message mode) and classifier as an HTTP stream's frames, against the
same deadlines (the first output from the attempt's start, then silence after
output).  A turn that may not be re-sent (an earlier turn of the connection
produced output) gets one attempt on the connection's upstream through a gate
that is open from the start: its messages pass as they come, and failures in
them are still recognised, logged and have their capacity codes rewritten.

The socket itself belongs to the session (relay/websocket_session.py); this
attempt only says when its later messages must reach nobody (`drop_socket`),
and the turn keeps the attempt that answered, whose socket serves the next turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from multidict import CIMultiDict

from ..apis import Classification, ErrorInfo, FrameKind
from ..apis.errors import http_error_info
from ..apis.openai_responses import ResponsesStream
from ..exchange import AttemptRecord
from ..gate import Gate
from ..redaction import redact_bytes
from ..sse import SseEvent
from ..upstreams.messages import ConnectionBroke, display_url, transport_failure
from ..upstreams.websocket import NOT_A_WEBSOCKET
from ..ws_items import Binary, Closed, redact_message
from .attempt import Attempt, Core
from .carry import response_id
from .commands import Expect, Pipe, UseHttp
from .policy import UpstreamTry
from .turn_context import WARM_UP_HERE, TurnContext

Phase = Literal["connect", "staging", "output"]


@dataclass(slots=True, eq=False)
class SocketAttempt(Attempt):
    turn: TurnContext | None = None
    phase: Phase = "connect"
    gate: Gate | None = None
    classifier: ResponsesStream | None = None
    watch: ResponsesStream | None = None  # a turn never re-sent: says when its real output begins
    failed_after: bool = False  # a failure after output reached the client: the turn's end is near
    drop_socket: bool = False
    named: str | None = None  # the response id its messages named (the turn's, once they reach the client)

    @property
    def drops_on_stop(self) -> bool:
        return self.drop_socket

    def lose(self) -> None:
        self.drop_socket = True  # what it sends from now on must reach nobody

    def _turn(self) -> TurnContext:
        assert self.turn is not None
        return self.turn

    def head_timeout(self, core: Core) -> ErrorInfo:
        if self.deadlines.head_waits_for == "output":
            return self.deadlines.no_head()  # the first output's bound came first
        return ErrorInfo(status=504, message=f"no WebSocket handshake answer within {core.settings.headers_timeout_s:g}s",
                         event_type="timeout", retryable_hint=True)

    def refused(self, core: Core, status: int, headers: list[tuple[str, str]], body: bytes, now: float) -> None:
        """The upgrade was answered otherwise: an upstream that speaks only HTTP is asked
        over HTTP (where the rules leave it to find out); any other answer is its failure."""
        if status in NOT_A_WEBSOCKET and self.upstream.websocket is None:
            core.out(UseHttp(self.upstream.name, status))
            core.reopen_over_http(self, now)
            return
        record = self.record
        record.reached("headers")
        record.answered(status, None, now)
        record.kept(status, list(headers), body)
        core.failed(self, http_error_info(status, body), now, headers=CIMultiDict(headers))

    def opened(self, core: Core, status: int, headers: Mapping[str, str], now: float) -> None:
        turn = self._turn()
        settings = core.settings
        self.record.upgraded(now)
        self.record.reached("staging")
        self.classifier = ResponsesStream()
        self.gate = Gate(self.classifier, staging_limit=settings.staging_limit,
                         rewrite_capacity_codes=settings.rewrite_capacity_codes)
        if not turn.resendable:
            self.gate.open_from_start()
            self.watch = ResponsesStream()
            self.phase = "output"
            self.record.reached("output")
            core.end.passing(self.record)
        core.out(Expect(self.number, by=self.deadlines.staged_by), Pipe(self.number))

    def passes(self, chunk: bytes) -> bool:
        """After output: plain answer content goes to the client from the socket's own callback."""
        classifier = self.classifier
        return (self.phase == "output" and self._turn().output and not self.failed_after and classifier is not None
                and not isinstance(chunk, Binary) and not classifier.worth_a_look(chunk))

    def data(self, core: Core, chunk: bytes, now: float) -> None:
        gate = self.gate
        assert gate is not None
        turn = self._turn()
        event = SseEvent(data="(binary)" if isinstance(chunk, Binary) else chunk.decode("utf-8", "replace"))
        if self.named is None and not turn.output:
            self.named = response_id(chunk)
        watch = self.watch
        if watch is not None and not turn.output:
            seen = watch.classify(event)
            if seen.kind is FrameKind.OUTPUT:
                turn.output = True
                core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output))
            elif seen.kind is FrameKind.FAILURE and self.record.outcome == "pending":
                core.log.failed(self.record, seen.error or ErrorInfo(message="failure"), "not_resent", None)
        step = gate.feed_message(chunk, event)
        if step.failure is not None:
            self._failed_before_output(core, step.failure, now)
            return
        if step.committed:
            self.phase = "output"
            core.commit(self, step.first_event or "output")
            core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output))
        for failure in step.failures_after_output:
            self.failed_after_output(core, failure)
        if self.phase == "output" and turn.response_id is None:
            turn.response_id = self.named  # its messages are the client's: the turn is this response
        for message in step.frames or ():
            core.client.message(message)
        if gate.complete or any(f.event_type == "error" for f in step.failures_after_output):
            # its end; or an `error` after output, often a response's last word: the
            # turn ends here, and what may follow passes between turns (rewritten)
            turn.socket_attempt = self.number
            self._settle(core)
            core.finish()

    def failed_after_output(self, core: Core, failure: Classification) -> None:
        if not self.failed_after:
            self.failed_after = True
            core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output))
        core.log.context["after"] = "output" if self._turn().output else "later_turn"
        try:
            core.log.suppressed(self.record, failure.error, failure.event_type)
        finally:
            del core.log.context["after"]

    def ended(self, core: Core, error: BaseException | None, now: float) -> None:
        closed = error if isinstance(error, Closed) else Closed(1006)
        gate = self.gate
        if gate is None or not gate.committed:
            what = f"upstream closed the WebSocket before output (code {closed.code})"
            self._show_held()
            core.failed(self, transport_failure(ConnectionBroke(what)), now)
            return
        self._settle(core)
        if self._turn().output and not self.failed_after:
            # the upstream closed inside an answer the client has part of: a continuation
            # finishes it and the connection lives on, else the client gets the close
            self.drop_socket = True
            why = f", {closed.reason}" if closed.reason else ""
            core.cut(self, f"upstream closed the WebSocket after output (code {closed.code}{why})", "stream_cut",
                     now, closed=closed)
            return
        core.cut_ends(self.record, "", "stream_cut", closed)

    def timed_out(self, core: Core, now: float) -> None:
        """Nothing came in time.  The silent response cannot be stopped on its
        connection, and whatever it sends late must reach nobody: the connection goes."""
        self.drop_socket = True
        turn = self._turn()
        if self.failed_after:
            self._settle(core)
            core.stop(self)
            core.finish()  # the failure reached the client already; the rest never came
            return
        if turn.output:
            self._settle(core)
            core.stop(self)
            core.cut(self, self.deadlines.stalled_message(), "stream_stalled", now)
            return
        info = self.deadlines.silent_while_staged(now)
        self._show_held()
        if turn.resendable:
            core.failed(self, info, now, timed_out=True)
            return
        core.log.failed(self.record, info, "not_resent", None)
        core.end.stalled_unresent(self.record, info.message)
        core.finish()

    def _show_held(self) -> None:
        """The messages an attempt that failed before output got, one a line: shown with
        the attempt in mitmweb (what a stalled or closed socket had sent), never forwarded."""
        if self.gate is not None:
            self.record.kept(101, [("Content-Type", "application/json")],
                             redact_bytes(b"\n".join(self.gate.held_frames()), self.secrets))

    def _failed_before_output(self, core: Core, failure: Classification, now: float) -> None:
        gate = self.gate
        assert gate is not None
        turn = self._turn()
        info = failure.error or ErrorInfo(message="failure")
        held = gate.held_frames()
        self._show_held()
        named = self.named
        # the response may go on (an `error` mid-way): its connection goes, so that
        # nothing of it can be taken for the next attempt's
        self.drop_socket = failure.event_type != "response.failed" and named is not None
        # forwarded should every later attempt fail, when the socket is another upstream's
        core.end.keep_messages([redact_message(message, self.secrets) for message in held])

        def forward() -> None:
            # the last possible attempt: the client gets it as the upstream sent it
            self.drop_socket = False
            turn.response_id = named
            turn.socket_attempt = self.number
            self.record.reached("forwarded")
            core.end.forwarded(self.record)
            core.client.passing_from(self.secrets)
            core.client.start(200, [], self.upstream.name)
            for message in held:
                core.client.message(message)
            core.finish()

        core.failed(self, info, now, forward=forward)

    def _settle(self, core: Core) -> None:
        """Its answer came to an end: a turn never re-sent passed through, else it committed."""
        if self.record.outcome == "pending":
            if self._turn().resendable:
                self.record.committed()
            else:
                self.record.passed_through()
        core.end.settled()


def warm_up_here(core: Core, turn: TurnContext, step: UpstreamTry, now: float) -> None:
    """A `generate: false` warm-up bound for HTTP, answered by Switchyard: HTTP has
    no connection to warm, and would generate a whole answer.  The turn that names
    it gets its request folded in, as from any connection it does not live on."""
    upstream = step.upstream
    rid = turn.new_response_id()
    exchange = core.exchange
    record = AttemptRecord(attempt=len(exchange.attempts) + 1, upstream=upstream.name,
                           url=display_url(exchange.request, upstream), started=now)
    exchange.add(record)
    core.end.committed(record, WARM_UP_HERE)
    turn.response_id = rid
    response: dict[str, Any] = {"id": rid, "object": "response", "status": "in_progress", "output": [],
                                "model": turn.body.get("model")}
    core.client.start(200, [], upstream.name)
    for kind, status in (("response.created", "in_progress"), ("response.completed", "completed")):
        core.client.message(json.dumps({"type": kind, "response": {**response, "status": status}}).encode())
    core.finish()
