"""One WebSocket turn (a client's `response.create`) as an exchange of the attempt loop.

The loop, its budget and backoff, its failure policy and its log are the HTTP
stream's (`AttemptLoop`); only how one attempt talks to an upstream differs:
over the upstream's WebSocket, each message goes through the same `Gate` (in
message mode) and the same Responses classifier; over HTTP SSE (an upstream
that speaks no WebSocket), the loop's own HTTP attempt runs, and `TurnSink`
turns each SSE event it writes into a message for the client.

A turn that may not be re-sent (an earlier turn of the connection produced
output) gets one attempt, on the connection's upstream, through a gate that
is open from the start: its messages pass as they come, and failures in them
are still recognised, logged and have their capacity codes rewritten.

An answer cut after output (the upstream's socket closed or broke inside it,
or went silent past `idle_timeout_s`) is finished by the loop's
`Continuation` where the route asks for one: the turn keeps a transcript of the
messages the client got, the continuation is asked over HTTP SSE (the cut
socket is gone, and a new one would hold nothing it could use), its re-framed
events reach the client through `TurnSink`, and the turn ends normally.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict

from ..apis import Classification, ErrorInfo, FrameKind
from ..apis.errors import http_error_info, rewrite_capacity_codes
from ..apis.openai_responses import ResponsesStream, websocket_error
from ..continuation import answer_input
from ..exchange import AttemptRecord, Exchange
from ..gate import Gate
from ..redaction import env_secrets, redact_bytes
from ..rules import Upstream
from ..sse import FrameSplitter, SseEvent
from ..upstreams.body import Body
from ..upstreams.client import UpstreamClient
from .deadlines import Deadlines
from .policy import Turn as Step
from ..upstreams.messages import (
    ConnectionBroke,
    ConnectTimeout,
    build_request,
    display_url,
    secret_header_names,
    transport_failure,
)
from ..upstreams.websocket import (NOT_A_WEBSOCKET, Binary, Closed, Refused, UpstreamSocket, redact_message,
                                   websocket_url)
from .carry import is_warm_up, response_id
from .endings import Endings
from .faulty_messages import FaultyMessages
from .loop import AttemptLoop, _Failed, _Try

if TYPE_CHECKING:
    from ..relay.websocket_session import WebSocketSession

TRANSPORT = "websocket"
WARM_UP_HERE = "warm_up_answered_here"
# commits that carry no output: the answer's end alone (a warm-up's), Switchyard's own warm-up answer
_NO_OUTPUT = ("response.completed", "response.incomplete", WARM_UP_HERE)


@dataclass(slots=True)
class Turn:
    """One client `response.create` and what came of it."""

    number: int
    text: str  # the message exactly as the client sent it
    body: dict[str, Any]
    resendable: bool  # no earlier turn of the connection produced output
    upstreams: Sequence[Upstream]
    output: bool = False  # real output reached the client
    response_id: str | None = None  # the answering response's id, once named
    link: UpstreamSocket | None = None  # the socket that answered (None: HTTP)
    # a continuation finished its cut answer: the answer's response id (the client's), and the
    # answer as input items, for a later turn that names that id
    continued: tuple[str, list[dict[str, Any]]] | None = None
    story: dict[str, Any] = field(default_factory=dict)


class TurnSink:
    """The loop's `ClientSink` for a turn: whatever it writes as SSE reaches the
    client as messages, one per event (an HTTP answer's events, Switchyard's own
    in-band errors); a whole error body becomes an `error` message."""

    def __init__(self, session: "WebSocketSession", rewrite: bool) -> None:
        self.session = session
        self._splitter = FrameSplitter()
        self._started = False
        # a turn that may not be re-sent: its failures, forwarded as sent over HTTP, still
        # have their capacity codes rewritten (over WebSocket its gate does that)
        self._rewrite = rewrite

    @property
    def headers_sent(self) -> bool:
        return self._started

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._started = True

    def write(self, data: bytes) -> None:
        for frame in self._splitter.feed(data):
            event = frame.event
            if not event.comment_only and event.data is not None:
                message = event.data.encode()
                self.session.to_client(rewrite_capacity_codes(message) if self._rewrite else message)

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._started = True
        self.session.to_client(websocket_error(status, body) if status >= 300 else body)

    def pace(self, producer: Body | None) -> None:
        """While the client reads nothing, the HTTP answer is held back as a socket's is."""
        self.session.pace(producer)

    def abort(self) -> None:
        self.session.break_client("upstream answer broke off")


class TurnEndings(Endings):
    """Exhaustion forwards the last failure as the upstream sent it, messages too."""

    last_messages: list[bytes] | None = None
    turn: Turn | None = None

    def committed(self, record: AttemptRecord, first_event: str) -> None:
        super().committed(record, first_event)
        if self.turn is not None and first_event not in _NO_OUTPUT:
            self.turn.output = True  # whichever transport: later turns of the connection are never re-sent

    def keep(self, record: AttemptRecord, answer: Any, body: bytes, *, complete: bool = True) -> Any:
        self.last_messages = None
        return super().keep(record, answer, body, complete=complete)

    def exhausted(self, last_message: str, timed_out: bool) -> None:
        if self.last_messages is None or self.client.headers_sent:
            super().exhausted(last_message, timed_out)
            return
        self.exchange.outcome = "exhausted"
        self.log.exhausted(last_message)
        self.client.start(200, [], "")
        sink = self.client.sink
        assert isinstance(sink, TurnSink)
        for message in self.last_messages:
            sink.session.to_client(message)


class TurnLoop(AttemptLoop):
    def __init__(self, exchange: Exchange, http: UpstreamClient, session: "WebSocketSession", turn: Turn) -> None:
        super().__init__(exchange, http, TurnSink(session, rewrite=not turn.resendable
                                                  and exchange.route.settings.rewrite_capacity_codes))
        self.session = session
        self.turn = turn
        self.log.context = {"transport": TRANSPORT, "turn": turn.number}
        self.end = TurnEndings(exchange, self.client, self.log)
        self.end.turn = turn
        if self.continuation.wanted:
            # what the client got of this turn, message by message, whichever way each reached it
            self.client.keep_transcript(self.settings.staging_limit, of_writes=False)
            session.keep_sent(self.client.kept_message)

    def _upstreams(self) -> Sequence[Upstream]:
        return self.turn.upstreams

    async def run(self) -> None:
        try:
            await self._run()  # no pre-answer keepalive: the client's WebSocket is open already
        finally:
            self.client.release()

    async def _attempt(self, step: Step) -> _Failed | None:
        upstream = step.upstream
        if not self.session.speaks_websocket(upstream):
            return await self._http_attempt(step)
        request = build_request(self.exchange.request, upstream)
        record = AttemptRecord(
            attempt=len(self.exchange.attempts) + 1,
            upstream=upstream.name,
            url=websocket_url(display_url(self.exchange.request, upstream)),
            started=time.monotonic(),
            request_headers=request.headers,
            secret_headers=secret_header_names(upstream),
        )
        self.exchange.attempts.append(record)
        attempt = _Try(step, record, Deadlines.of(self.settings, streams=True, started=record.started),
                       env_secrets(upstream))
        settings = self.settings
        try:
            link = await self.session.link(upstream, request)
        except Refused as refused:
            if refused.status in NOT_A_WEBSOCKET and upstream.websocket is None:
                self.exchange.attempts.remove(record)  # not an attempt of the turn: the upstream speaks HTTP
                self.session.use_http(upstream, refused.status)
                return await self._http_attempt(step)
            record.reached("headers")
            record.answered(refused.status, None)
            record.kept(refused.status, list(refused.headers), refused.body)
            return self._fail(attempt, http_error_info(refused.status, refused.body),
                              headers=CIMultiDict(refused.headers))
        except ConnectTimeout:
            info = ErrorInfo(status=504, message=f"no connection within {settings.connect_timeout_s:g}s",
                             event_type="timeout", retryable_hint=True)
            return self._fail(attempt, info, timed_out=True)
        except TimeoutError:
            info = ErrorInfo(status=504, message=f"no WebSocket handshake answer within {settings.headers_timeout_s:g}s",
                             event_type="timeout", retryable_hint=True)
            return self._fail(attempt, info, timed_out=True)
        except OSError as exc:
            return self._fail(attempt, transport_failure(exc))
        record.reached("staging")
        fault = self._pick_fault(record)
        inbox = self.session.receive(FaultyMessages(fault, self.api.name) if fault is not None else None)
        link.send_text(self.session.message_for(self.turn, link))  # the real message, fault or not
        return await self._messages(inbox, link, attempt)

    async def _http_attempt(self, step: Step) -> _Failed | None:
        upstream = step.upstream
        self.turn.link = None
        self.session.receive()
        if is_warm_up(self.turn.body):
            self._warm_up_here(upstream)
            return None
        return await super()._attempt(step)

    def _warm_up_here(self, upstream: Upstream) -> None:
        """A `generate: false` warm-up bound for HTTP, answered by Switchyard: HTTP has
        no connection to warm, and would generate a whole answer.  The turn that names
        it gets its request folded in, as from any connection it does not live on."""
        rid = f"resp_switchyard_{secrets.token_hex(12)}"
        record = AttemptRecord(attempt=len(self.exchange.attempts) + 1, upstream=upstream.name,
                               url=display_url(self.exchange.request, upstream), started=time.monotonic())
        self.exchange.attempts.append(record)
        self.end.committed(record, WARM_UP_HERE)
        self.turn.response_id = rid
        response: dict[str, Any] = {"id": rid, "object": "response", "status": "in_progress", "output": [],
                    "model": self.turn.body.get("model")}
        self.client.start(200, [], upstream.name)
        for kind, status in (("response.created", "in_progress"), ("response.completed", "completed")):
            self.session.to_client(json.dumps({"type": kind, "response": {**response, "status": status}}).encode())

    async def _messages(self, inbox: "asyncio.Queue[bytes | Closed]", link: UpstreamSocket,
                        attempt: _Try) -> _Failed | None:
        """Read one attempt's messages through the gate until the turn's answer ends,
        fails before output, or goes silent."""
        settings = self.settings
        record = attempt.record
        turn = self.turn
        gate_classifier = ResponsesStream()
        gate = Gate(gate_classifier, staging_limit=settings.staging_limit,
                    rewrite_capacity_codes=settings.rewrite_capacity_codes)
        # a turn that is never re-sent passes everything from the start; `watch`
        # says when its real output begins (for the first-output bound and its log)
        watch: ResponsesStream | None = None
        if not turn.resendable:
            gate.committed = True
            watch = ResponsesStream()
            record.reached("output")
            self.exchange.answered_by, self.exchange.answered_url = attempt.upstream.name, record.url
        first_output_s = settings.first_output_timeout_s
        deadline = record.started + first_output_s if first_output_s else None
        quiet_s = settings.request_timeout_s or None
        idle_s = settings.idle_timeout_s or None
        failed_after_output = False
        send = self.session.to_client
        while True:
            if turn.output or failed_after_output:
                wait = idle_s
            else:
                wait = quiet_s
                if deadline is not None:
                    left = max(0.0, deadline - time.monotonic())
                    wait = left if wait is None else min(wait, left)
            try:
                async with asyncio.timeout(wait):
                    item = await inbox.get()
            except TimeoutError:
                if turn.output and wait is not None and (self.session.held_for_client
                                                         or time.monotonic() - self.session.last_passed < wait):
                    continue  # the hot path passed messages meanwhile, or the client holds it back: not silent
                return await self._silent(attempt, link, failed_after_output, deadline)
            if isinstance(item, Closed):
                if not gate.committed:
                    what = f"upstream closed the WebSocket before output (code {item.code})"
                    return self._fail(attempt, transport_failure(ConnectionBroke(what)))
                if turn.output and not failed_after_output and self.continuation.wanted:
                    await self._closed_after_output(record, link, item)
                else:
                    self.session.closed_in_turn(item)  # for the client, after every message before it
                self._finish(record)
                return None
            event = SseEvent(data="(binary)" if isinstance(item, Binary) else item.decode("utf-8", "replace"))
            if turn.response_id is None and not turn.output:
                turn.response_id = response_id(item)
            if watch is not None and not turn.output:
                seen = watch.classify(event)
                if seen.kind is FrameKind.OUTPUT:
                    turn.output = True
                elif seen.kind is FrameKind.FAILURE and record.outcome == "pending":
                    info = seen.error or ErrorInfo(message="failure")
                    self.log.failed(record, info, "not_resent", None)
            step = gate.feed_message(item, event)
            if step.failure is not None:
                return self._failed_before_output(step.failure, gate, attempt, link)
            if step.committed:
                self.end.committed(record, step.first_event or "output")
            if step.failures_after_output:
                failed_after_output = True
                self.log.context["after"] = "output" if turn.output else "later_turn"
                self._suppressed(step, attempt)
                del self.log.context["after"]
            for message in step.frames or ():
                send(message)
            if gate.complete or any(f.event_type == "error" for f in step.failures_after_output):
                # its end; or an `error` after output, often a response's last word: the
                # turn ends here, and what may follow passes between turns (rewritten)
                turn.link = link
                self._finish(record)
                return None
            if turn.output and not failed_after_output:
                self.session.pass_plain_content(gate_classifier.worth_a_look)

    def _finish(self, record: AttemptRecord) -> None:
        if record.outcome == "pending":
            if self.turn.resendable:
                record.committed()
            else:
                record.passed_through()
        if self.exchange.outcome == "pending":
            self.exchange.outcome = "committed"

    async def _closed_after_output(self, record: AttemptRecord, link: UpstreamSocket, closed: Closed) -> None:
        """The upstream closed inside an answer the client has part of: a continuation
        finishes it and the connection lives on, else the client gets the close."""
        self.session.drop(link)
        why = f", {closed.reason}" if closed.reason else ""
        if not await self._continued(record, f"upstream closed the WebSocket after output (code {closed.code}{why})"):
            self.session.closed_in_turn(closed)

    async def _continued(self, record: AttemptRecord, message: str) -> bool:
        if not await super()._continued(record, message):
            return False
        self._carry_answer()
        return True

    def _carry_answer(self) -> None:
        """The continuation's answer is the client's: a later turn naming its response
        id is folded with it (see carry.py)."""
        answer = self.continuation.answer
        if answer is None or answer.response_id is None:
            return
        try:
            stored = json.loads(self.exchange.request.body).get("store") is not False
        except (ValueError, RecursionError, AttributeError):
            stored = False
        self.turn.continued = (answer.response_id, answer_input(answer.reasoning, answer.text, stored=stored))

    async def _silent(self, attempt: _Try, link: UpstreamSocket, failed_after_output: bool,
                      deadline: float | None) -> _Failed | None:
        """Nothing came in time.  The silent response cannot be stopped on its
        connection, and whatever it sends late must reach nobody: the connection goes."""
        settings = self.settings
        record = attempt.record
        self.session.drop(link)
        if failed_after_output:
            self._finish(record)
            return None  # the failure reached the client already; the rest never came
        if self.turn.output:
            # a continuation (where the route asks for one) or the original cut
            await self._cut(record, f"upstream sent nothing for {settings.idle_timeout_s:g}s after output",
                            "stream_stalled")
            self._finish(record)
            return None
        silent = deadline is None or time.monotonic() < deadline
        what = (f"nothing for {settings.request_timeout_s:g}s" if silent
                else f"no output within {settings.first_output_timeout_s:g}s")
        info = ErrorInfo(status=504, message=what, event_type="timeout", retryable_hint=True)
        if self.turn.resendable:
            return self._fail(attempt, info, timed_out=True)
        self.log.failed(record, info, "not_resent", None)
        self.exchange.outcome = "exhausted"
        self.client.start(200, [], attempt.upstream.name)
        self.client.error_event(f"switchyard: {what}", "upstream_timeout")
        return None

    def _failed_before_output(self, failure: Classification, gate: Gate, attempt: _Try,
                              link: UpstreamSocket) -> _Failed | None:
        info = failure.error or ErrorInfo(message="failure")
        failed = self._fail(attempt, info)
        held = gate.held_frames()
        attempt.record.kept(101, [("Content-Type", "application/json")],
                            redact_bytes(b"\n".join(held), attempt.secrets))
        assert isinstance(self.end, TurnEndings)
        if failed.plan.action != "give_up":
            if failure.event_type != "response.failed" and self.turn.response_id is not None:
                # the response may go on (an `error` mid-way): its connection goes, so that
                # nothing of it can be taken for the next attempt's
                self.session.drop(link)
            self.turn.response_id = None
            # forwarded should every later attempt fail, when the socket is another upstream's
            self.end.last_messages = [redact_message(message, attempt.secrets) for message in held]
            return failed
        # the last possible attempt: the client gets it as the upstream sent it
        attempt.record.reached("forwarded")
        self.exchange.answered_by, self.exchange.answered_url = attempt.upstream.name, attempt.record.url
        self.exchange.outcome = "gave_up"
        self.turn.link = link if link.open else None
        self.client.start(200, [], attempt.upstream.name)
        for message in held:
            self.session.to_client(message)
        return None


def narrowed(upstream: Upstream) -> Upstream:
    """An upstream tried once: a turn that may not be re-sent."""
    return replace(upstream, retries=0)
