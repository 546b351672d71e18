"""The attempt loop: try upstreams in order until one produces output.

Each attempt either commits (the client gets that upstream's answer, and
nothing is replayed afterwards), fails before output (discarded: retry the
same upstream within budget, or move on), or is the last possible one, in
which case its failure is forwarded as the provider sent it.  The client side
is a `ClientSink`, the upstream side an `Answer`; this module holds the policy
between them and reads each answer through the gate.  How an exchange then
ends for the client (committed, forwarded, exhausted, cut) is `endings.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .. import observe
from ..apis import APIS, Api, Classification, ErrorInfo, ErrorPolicy
from ..apis.errors import http_error_info
from ..exchange import AttemptRecord, Exchange
from ..gate import SAID_NOTHING, Gate, GateStep
from ..redaction import env_secrets, redact_bytes
from ..retry import Plan
from ..rules import Upstream
from ..rules.schema import FaultSpec
from ..upstreams.messages import (
    Answer,
    ConnectTimeout,
    Upstreams,
    build_request,
    display_url,
    forwarded_response_headers,
    read_bounded,
    request_id,
    secret_header_names,
    transport_failure,
)
from .client_stream import ClientSink, ClientStream
from .continuation import Continuation
from .deadlines import Deadlines
from .endings import Endings
from .faulty_answer import FaultyAnswer
from .log import AttemptLog
from .policy import Turn, first_turn, judge, next_turn
from .read_deadline import Silence

ERROR_BODY_LIMIT = 1024 * 1024
WHOLE_BODY_MIN_LIMIT = 64 * 1024 * 1024  # non-streaming answers are held whole up to max(this, staging_limit)


@dataclass(slots=True)
class _Failed:
    info: ErrorInfo
    plan: Plan
    timed_out: bool = False


@dataclass(slots=True)
class _Try:
    """One attempt in progress: its turn, its record and its deadlines."""

    turn: Turn
    record: AttemptRecord
    deadlines: Deadlines
    # what the upstream's `${VAR}`s hold: never passed on, should it echo them (a failure
    # that says which key it refused)
    secrets: tuple[bytes, ...] = ()

    @property
    def upstream(self) -> Upstream:
        return self.turn.upstream


class AttemptLoop:
    """One exchange's attempts, from the first upstream's to its ending.

    The decisions are values from `policy.py` and `deadlines.py`; this class
    awaits the answers, reads them through the gate and writes to the client."""

    def __init__(self, exchange: Exchange, http: Upstreams, sink: ClientSink) -> None:
        self.exchange = exchange
        self.route = exchange.route
        self.settings = exchange.route.settings
        self.api: Api = APIS[exchange.route.api]
        self.policy = ErrorPolicy(self.settings.retry_on)
        self.http = http
        self.client = ClientStream(sink, self.api)
        self.log = AttemptLog(exchange)
        self.end = Endings(exchange, self.client, self.log)
        self.continuation = Continuation(exchange, self.api, http, self.client, self.log, self._pipe, self._silence)
        if self.continuation.wanted:
            self.client.keep_transcript(self.settings.staging_limit)

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        if self.exchange.request.wants_stream and self.settings.pre_answer_keepalive_s > 0:
            self.client.keep_alive(self.settings.pre_answer_keepalive_s)
        try:
            await self._run()
        finally:
            self.client.stop_keepalive()
            self.client.release()

    def _upstreams(self) -> Sequence[Upstream]:
        """The upstreams to try, in order: the route's (a WebSocket turn narrows them)."""
        return self.route.upstreams

    async def _run(self) -> None:
        upstreams = self._upstreams()
        turn: Turn | None = first_turn(upstreams)
        while turn is not None:
            failed = await self._attempt(turn)
            if failed is None:
                return  # the client got an answer
            turn = next_turn(upstreams, turn, failed.plan)
            if turn is None:
                self.end.exhausted(failed.info.message, failed.timed_out)
            elif failed.plan.action == "retry":
                await asyncio.sleep(failed.plan.delay_s)

    # --- one attempt ----------------------------------------------------------------

    async def _attempt(self, turn: Turn) -> _Failed | None:
        upstream = turn.upstream
        early, self.exchange.early = self.exchange.early, None  # the first attempt's, sent from the hook
        if early is not None and (self.exchange.attempts or upstream is not self.route.upstreams[0]):
            early.discard()
            early = None
        request = early.request if early is not None else build_request(self.exchange.request, upstream, self.api.name)
        record = AttemptRecord(
            attempt=len(self.exchange.attempts) + 1,
            upstream=upstream.name,
            url=display_url(self.exchange.request, upstream, self.api.name),
            started=early.started if early is not None else time.monotonic(),
            request_headers=request.headers,
            secret_headers=secret_header_names(upstream),
        )
        self.exchange.attempts.append(record)
        self.client.attempts = len(self.exchange.attempts)
        deadlines = Deadlines.of(self.settings, streams=self.exchange.request.wants_stream, started=record.started)
        attempt = _Try(turn, record, deadlines, env_secrets(upstream))
        self.client.passing_from(attempt.secrets)
        try:
            head_by = record.started + deadlines.head if deadlines.head else None  # an early attempt began sooner
            async with asyncio.timeout_at(_loop_time(head_by)):
                if early is not None and early.answer is not None:
                    early.tell(record.request_sent)
                    answer: Answer = await early.answer
                else:
                    answer = await self.http.open(request, connect_timeout_s=deadlines.connect,
                                                  sent=record.request_sent)
        except ConnectTimeout:
            return self._fail(attempt, deadlines.no_connection(), timed_out=True)
        except TimeoutError:
            return self._fail(attempt, deadlines.no_head(), timed_out=True)
        except OSError as exc:  # refused, unreachable, TLS, reset, not HTTP (ssl errors are OSErrors)
            return self._fail(attempt, transport_failure(exc))

        fault = self._pick_fault(record)
        if fault is not None:
            answer = FaultyAnswer(answer, fault, self.api.name)
        try:
            record.answered(answer.status, request_id(answer.headers))
            if not 200 <= answer.status < 300:
                return await self._http_failure(answer, attempt)
            if "text/event-stream" in answer.headers.get("Content-Type", "").lower():
                return await self._stream(answer, attempt)
            return await self._whole(answer, attempt)
        finally:
            answer.close()

    def _pick_fault(self, record: AttemptRecord) -> FaultSpec | None:
        """This attempt's fault, if one is due: one pick per attempt, once its upstream
        answered (a fault never invents one), marked on its record and logged."""
        faults = self.exchange.faults
        fault = faults.pick(self.route.name, record.upstream) if faults is not None else None
        if fault is not None:
            record.injected(fault.kind)
            observe.emit(logging.INFO, "switchyard.fault_injected", route=self.route.name, upstream=record.upstream,
                         attempt=record.attempt, kind=fault.kind, after_frames=fault.after_frames,
                         **self.log.context)
        return fault

    def _fail(self, attempt: _Try, info: ErrorInfo, *, timed_out: bool = False,
              headers: Mapping[str, str] | None = None) -> _Failed:
        """Decide what a failure is worth and what comes next; log the decision."""
        verdict = judge(info, attempt.turn, self.settings, self.policy, timed_out=timed_out, headers=headers)
        plan = verdict.plan
        self.log.failed(attempt.record, info, verdict.outcome, plan.delay_s if plan.action == "retry" else None)
        return _Failed(info, plan, timed_out)

    async def _http_failure(self, answer: Answer, attempt: _Try) -> _Failed | None:
        body, complete = await read_bounded(answer, ERROR_BODY_LIMIT, attempt.deadlines.error_body)
        body = redact_bytes(body, attempt.secrets)
        failed = self._fail(attempt, http_error_info(answer.status, body), headers=answer.headers)
        answered = self.end.keep(attempt.record, answer, body, complete=complete)
        if failed.plan.action == "give_up":
            self.end.forward(answered, failed.info)
            return None
        return failed

    async def _whole(self, answer: Answer, attempt: _Try) -> _Failed | None:
        """A non-streaming answer: a 2xx without an error object commits."""
        attempt.record.reached("body")
        limit = max(self.settings.staging_limit, WHOLE_BODY_MIN_LIMIT)
        deadline = attempt.deadlines.whole_by
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    chunk, error = await answer.body.read_some()
            except TimeoutError:
                return self._fail(attempt, attempt.deadlines.incomplete(), timed_out=True)
            if error is not None:
                return self._fail(attempt, transport_failure(error))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                # too large to hold and check: commit and pass the rest through
                if self._commit_whole(attempt, "body_limit"):
                    return None
                self.client.start(answer.status, forwarded_response_headers(answer.headers), attempt.upstream.name)
                self.client.write(b"".join(chunks))
                await self._pass_rest(answer, attempt.deadlines)
                return None
        body = redact_bytes(b"".join(chunks), attempt.secrets)
        body_error: ErrorInfo | None = None
        if "json" in answer.headers.get("Content-Type", "").lower():
            try:
                body_error = self.api.body_error(json.loads(body))
            except (ValueError, RecursionError):
                body_error = None
        if body_error is not None:
            failed = self._fail(attempt, body_error, headers=answer.headers)
            answered = self.end.keep(attempt.record, answer, body)
            if failed.plan.action == "give_up":
                self.end.forward(answered, body_error)
                return None
            return failed
        if not self._commit_whole(attempt, "body"):
            self.client.send_whole(answer.status, forwarded_response_headers(answer.headers), body,
                                   attempt.upstream.name)
        return None

    def _commit_whole(self, attempt: _Try, first_event: str) -> bool:
        """Commit a non-streaming answer; True if the client already had a stream's
        headers (keepalive promised one), and was told in-band that this is none."""
        self.end.committed(attempt.record, first_event)
        self.client.stop_keepalive()
        if not self.client.headers_sent:
            return False
        self.client.announce(attempt.upstream.name)
        self.client.error_event("switchyard: the upstream answered a streaming request "
                                "with a non-streaming body", "non_streaming_answer")
        return True

    async def _stream(self, answer: Answer, attempt: _Try) -> _Failed | None:
        """A streamed answer, pushed through the gate as it arrives: staged until the
        first output, then forwarded.  Every read is handled in the upstream
        connection's own callback; this task wakes only when the stream ends,
        fails before output, or goes silent."""
        settings = self.settings
        record = attempt.record
        gate = Gate(
            self.api.stream_classifier(self.exchange.request.wants_usage),
            staging_limit=settings.staging_limit,
            rewrite_capacity_codes=settings.rewrite_capacity_codes,
        )
        record.reached("staging")
        deadlines = attempt.deadlines
        body = answer.body
        silence = self._silence(answer)
        touch = silence.touch
        write = self.client.write
        passes = gate.passes
        failures: list[Classification] = []

        def staging_bound() -> None:
            silence.expect_by(deadlines.staged_wait(time.monotonic()))

        def through(chunk: bytes) -> None:
            if passes(chunk):  # committed, and plain answer content: the hot path
                touch()
                write(chunk)
                return
            if gate.committed:
                touch()
            else:
                staging_bound()
            step = gate.feed(chunk)
            if step.failure is not None:  # before output: this attempt is discarded
                failures.append(step.failure)
                body.stop()
                return
            self._output(step, attempt, answer)
            if step.committed:
                silence.expect_by(deadlines.quiet_after_output)

        staging_bound()
        try:
            error = await self._pipe(answer, through, silence)
        except TimeoutError:
            if gate.committed:
                if not gate.complete:  # after the API's end marker, quiet is no stall: the answer is whole
                    answer.close()  # given up on: it must not go on generating while another finishes the answer
                    await self._cut(record, deadlines.stalled_message(), "stream_stalled")
                return None
            return self._fail(attempt, deadlines.silent_while_staged(time.monotonic()), timed_out=True)
        if failures:
            return await self._failed_in_stream(failures[0], gate, answer, attempt)
        if error is not None:
            if not gate.committed:
                return self._fail(attempt, transport_failure(error))
            if not gate.complete:
                await self._cut(record, "upstream connection broke after output", "stream_cut")
            return None
        # the upstream body ended
        # an end marker in an unterminated last frame reaches no client (an event is
        # dispatched at its blank line): the answer is whole only if it was before
        whole = gate.complete
        step = gate.finish()
        if step.failure is not None:
            return await self._failed_in_stream(step.failure, gate, answer, attempt)
        if not whole:
            # the unterminated last frame of a cut stream: clients discard it,
            # and the in-band error must not run into it
            step.emit = b""
        self._output(step, attempt, answer)
        if not whole and not self.exchange.suppressed_failover:
            await self._cut(record, "upstream ended the stream before completing the answer", "stream_cut")
        return None

    async def _cut(self, record: AttemptRecord, message: str, code: Literal["stream_cut", "stream_stalled"]) -> None:
        """A committed answer broke off: finished by a continuation where the route asks
        for one and it succeeds, else ended with this (the original) cut."""
        if not await self._continued(record, message):
            self.end.cut(record, message, code)

    async def _continued(self, record: AttemptRecord, message: str) -> bool:
        """Whether a continuation finished the answer cut so (where the route asks for one)."""
        self.client.release()  # the client's bytes are what a continuation must not repeat
        if self.continuation.wanted and await self.continuation.finish(record, message):
            self.end.continued()
            return True
        return False

    async def _failed_in_stream(self, failure: Classification, gate: Gate, answer: Answer,
                                attempt: _Try) -> _Failed | None:
        info = failure.error or ErrorInfo(message="failure")
        failed = self._fail(attempt, info, headers=answer.headers)
        if info in SAID_NOTHING:
            # shown in mitmweb, never forwarded: as sent it would read as an empty success;
            # the last failure that said something is forwarded, else Switchyard's own error
            self.end.show(attempt.record, answer, redact_bytes(gate.held(), attempt.secrets))
            return failed
        answered = self.end.keep(attempt.record, answer, redact_bytes(gate.held(), attempt.secrets))
        if failed.plan.action != "give_up":
            return failed
        # the last possible attempt: the client gets it as the provider sent it
        attempt.record.reached("forwarded")
        self.end.gave_up(answered)
        self.client.stop_keepalive()
        if not self.client.headers_sent:
            self.client.start(answer.status, answered.headers, attempt.upstream.name)
        self.client.write(gate.pass_through())
        await self._pass_rest(answer, attempt.deadlines)
        return None

    def _output(self, step: GateStep, attempt: _Try, answer: Answer) -> None:
        if step.committed:
            self.end.committed(attempt.record, step.first_event or "output")
            self.client.stop_keepalive()
            if self.client.headers_sent:
                self.client.announce(attempt.upstream.name)
            else:
                self.client.start(answer.status, forwarded_response_headers(answer.headers), attempt.upstream.name)
        if step.failures_after_output:
            self._suppressed(step, attempt)
        if step.emit:
            self.client.write(step.emit)

    def _suppressed(self, step: GateStep, attempt: _Try) -> None:
        for failure in step.failures_after_output:
            self.log.suppressed(attempt.record, failure.error, failure.event_type)

    async def _pass_rest(self, answer: Answer, deadlines: Deadlines) -> None:
        """The rest of an answer forwarded as sent (but for the upstream's own secrets:
        `ClientStream.passing_from`); if it breaks or stalls, so does the client's (a
        clean end would claim a complete answer)."""
        silence = self._silence(answer)
        touch = silence.touch
        write = self.client.write

        def timed(chunk: bytes) -> None:
            touch()
            write(chunk)

        silence.expect_by(deadlines.quiet_after_output)
        try:
            broke = await self._pipe(answer, timed, silence) is not None
        except TimeoutError:  # stalled
            broke = True
        if broke:
            self.client.cut()

    def _silence(self, answer: Answer) -> Silence:
        """A read deadline for `answer`; quiet while the client holds it back does not count."""
        body = answer.body
        return Silence(excused=lambda: body.paused_for_client)

    async def _pipe(self, answer: Answer, sink: Callable[[bytes], None], silence: Silence) -> BaseException | None:
        """Push the rest of `answer` into `sink` until it ends (None) or breaks (the
        error); TimeoutError once `silence`'s bound passes.  While the client cannot
        keep up, the upstream waits."""
        self.client.sink.pace(answer.body)
        try:
            return await silence.wait(answer.body.pipe(sink))
        finally:
            silence.close()
            self.client.sink.pace(None)



def _loop_time(deadline: float | None) -> float | None:
    """A time.monotonic() deadline on the event loop's clock, for asyncio.timeout_at."""
    if deadline is None:
        return None
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
