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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .. import observe
from ..apis import APIS, Api, Classification, Decision, ErrorInfo, ErrorPolicy
from ..apis.errors import http_error_info
from ..exchange import AttemptRecord, Exchange
from ..gate import SAID_NOTHING, Gate, GateStep
from ..retry import Plan, plan_after_failure, retry_after_s
from ..rules import Upstream
from ..upstreams.client import UpstreamClient
from ..upstreams.messages import (
    Answer,
    ConnectTimeout,
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
from .endings import Endings
from .faulty_answer import FaultyAnswer
from .log import AttemptLog
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
    """One attempt in progress: which upstream, how much budget is used."""

    upstream: Upstream
    tries: int
    has_next: bool
    record: AttemptRecord


class AttemptLoop:
    def __init__(self, exchange: Exchange, http: UpstreamClient, sink: ClientSink) -> None:
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

    async def _run(self) -> None:
        upstreams = self.route.upstreams
        last: _Failed | None = None
        for index, upstream in enumerate(upstreams):
            tries = 0
            while True:
                tries += 1
                last = await self._attempt(upstream, tries, has_next=index + 1 < len(upstreams))
                if last is None:
                    return  # the client got an answer
                if last.plan.action == "retry":
                    await asyncio.sleep(last.plan.delay_s)
                    continue
                if last.plan.action == "next":
                    break
                self.end.exhausted(last.info.message, last.timed_out)
                return
        if last is not None:
            self.end.exhausted(last.info.message, last.timed_out)

    # --- one attempt ----------------------------------------------------------------

    async def _attempt(self, upstream: Upstream, tries: int, has_next: bool) -> _Failed | None:
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
        attempt = _Try(upstream, tries, has_next, record)
        settings = self.settings
        if self.exchange.request.wants_stream:
            # streams: headers and first output are bounded from the attempt's start
            bounds = [t for t in (settings.headers_timeout_s, settings.first_output_timeout_s) if t > 0]
            open_s = min(bounds) if bounds else None
            waiting_for = "output" if open_s and open_s == settings.first_output_timeout_s else "response headers"
        else:
            open_s = settings.request_timeout_s or None  # the whole answer, headers included
            waiting_for = "complete answer"
        try:
            async with asyncio.timeout_at(_loop_time(record.started + open_s) if open_s else None):
                if early is not None and early.answer is not None:
                    early.tell(record.request_sent)
                    answer: Answer = await early.answer
                else:
                    answer = await self.http.open(request, connect_timeout_s=settings.connect_timeout_s,
                                                  sent=record.request_sent)
        except ConnectTimeout:
            info = ErrorInfo(status=504, message=f"no connection within {settings.connect_timeout_s:g}s",
                             event_type="timeout", retryable_hint=True)
            return self._fail(attempt, info, timed_out=True)
        except TimeoutError:
            limit = f"{open_s:g}s" if open_s else "the time limit"
            info = ErrorInfo(status=504, message=f"no {waiting_for} within {limit}", event_type="timeout",
                             retryable_hint=True)
            return self._fail(attempt, info, timed_out=True)
        except OSError as exc:  # refused, unreachable, TLS, reset, not HTTP (ssl errors are OSErrors)
            return self._fail(attempt, transport_failure(exc))

        fault = self.exchange.faults.pick(self.route.name, upstream.name) if self.exchange.faults else None
        if fault is not None:
            record.fault = fault.kind
            observe.emit(logging.INFO, "switchyard.fault_injected", route=self.route.name, upstream=upstream.name,
                         attempt=record.attempt, kind=fault.kind, after_frames=fault.after_frames)
            answer = FaultyAnswer(answer, fault, self.api.name)
        try:
            record.phase = "headers"
            record.status = answer.status
            record.request_id = request_id(answer.headers)
            if not 200 <= answer.status < 300:
                return await self._http_failure(answer, attempt)
            if "text/event-stream" in answer.headers.get("Content-Type", "").lower():
                return await self._stream(answer, attempt)
            return await self._whole(answer, attempt)
        finally:
            answer.close()

    def _fail(self, attempt: _Try, info: ErrorInfo, *, timed_out: bool = False,
              headers: Mapping[str, str] | None = None) -> _Failed:
        """Decide what a failure is worth and what comes next; log the decision."""
        should_retry = headers.get("x-should-retry") if headers else None
        decision = self.policy.decide(info, should_retry)
        plan = plan_after_failure(
            decision,
            tries_used=attempt.tries,
            budget=attempt.upstream.retries,
            has_next=attempt.has_next,
            timed_out=timed_out,
            retry_after=_first_set(retry_after_s(headers), info.retry_after_s),
            backoff_ms=self.settings.backoff_ms,
            max_backoff_ms=self.settings.max_backoff_ms,
        )
        failed = _Failed(info, plan, timed_out)
        record = attempt.record
        # a transport failure's 502 is only what the client would get: no upstream sent it
        record.status = None if info.event_type == "transport" else info.status
        record.code, record.message = info.code or info.type, self.log.redact(info.message)
        record.event_type = info.event_type
        outcome = "fatal" if decision is Decision.FATAL else _OUTCOMES[plan.action]
        record.finish(outcome)
        self.log.failed(record, info, outcome, plan.delay_s if plan.action == "retry" else None)
        return failed

    async def _http_failure(self, answer: Answer, attempt: _Try) -> _Failed | None:
        settings = self.settings
        body, complete = await read_bounded(answer, ERROR_BODY_LIMIT,
                                            settings.headers_timeout_s or settings.request_timeout_s)
        failed = self._fail(attempt, http_error_info(answer.status, body), headers=answer.headers)
        answered = self.end.keep(attempt.record, answer, body, complete=complete)
        if failed.plan.action == "give_up":
            self.end.forward(answered, failed.info)
            return None
        return failed

    async def _whole(self, answer: Answer, attempt: _Try) -> _Failed | None:
        """A non-streaming answer: a 2xx without an error object commits."""
        attempt.record.phase = "body"
        limit = max(self.settings.staging_limit, WHOLE_BODY_MIN_LIMIT)
        deadline = attempt.record.started + self.settings.request_timeout_s if self.settings.request_timeout_s else None
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    chunk, error = await answer.body.read_some()
            except TimeoutError:
                info = ErrorInfo(status=504, message=f"no complete answer within {self.settings.request_timeout_s:g}s",
                                 event_type="timeout", retryable_hint=True)
                return self._fail(attempt, info, timed_out=True)
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
                await self._pass_rest(answer)
                return None
        body = b"".join(chunks)
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
        self.end.committed(attempt.record, attempt.upstream.name, first_event)
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
        record.phase = "staging"
        idle_s = settings.idle_timeout_s or None  # silence after output
        # silence before output: reasoning models can think for minutes before their first
        # token, so not `idle_timeout_s`; `request_timeout_s` (an answer's patience), and
        # `first_output_timeout_s` where it is set.  Some bound is needed: behind the
        # pre-answer keepalive a client never times out on its own
        quiet_s = settings.request_timeout_s or None
        first_output_s = settings.first_output_timeout_s
        deadline = record.started + first_output_s if first_output_s else None
        body = answer.body
        silence = self._silence(answer)
        touch = silence.touch
        write = self.client.write
        passes = gate.passes
        failures: list[Classification] = []

        def staging_bound() -> None:
            wait = quiet_s
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            silence.expect_by(wait)

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
                silence.expect_by(idle_s)

        staging_bound()
        try:
            error = await self._pipe(answer, through, silence)
        except TimeoutError:
            if gate.committed:
                if not gate.complete:  # after the API's end marker, quiet is no stall: the answer is whole
                    await self._cut(record, f"upstream sent nothing for {settings.idle_timeout_s:g}s after output",
                                    "stream_stalled")
                return None
            silent = deadline is None or time.monotonic() < deadline
            what = f"nothing for {settings.request_timeout_s:g}s" if silent else f"no output within {first_output_s:g}s"
            info = ErrorInfo(status=504, message=what, event_type="timeout", retryable_hint=True)
            return self._fail(attempt, info, timed_out=True)
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

    async def _cut(self, record: AttemptRecord, message: str, code: str) -> None:
        """A committed answer broke off: finished by a continuation where the route asks
        for one and it succeeds, else ended with this (the original) cut."""
        if self.continuation.wanted and await self.continuation.finish(record, message):
            return
        self.end.cut(record, message, code)

    async def _failed_in_stream(self, failure: Classification, gate: Gate, answer: Answer,
                                attempt: _Try) -> _Failed | None:
        info = failure.error or ErrorInfo(message="failure")
        failed = self._fail(attempt, info, headers=answer.headers)
        if info in SAID_NOTHING:
            # shown in mitmweb, never forwarded: as sent it would read as an empty success;
            # the last failure that said something is forwarded, else Switchyard's own error
            self.end.show(attempt.record, answer, gate.held())
            return failed
        answered = self.end.keep(attempt.record, answer, gate.held())
        if failed.plan.action != "give_up":
            return failed
        # the last possible attempt: the client gets it as the provider sent it
        attempt.record.phase = "forwarded"
        self.end.gave_up(answered)
        self.client.stop_keepalive()
        if not self.client.headers_sent:
            self.client.start(answer.status, answered.headers, attempt.upstream.name)
        self.client.write(gate.pass_through())
        await self._pass_rest(answer)
        return None

    def _output(self, step: GateStep, attempt: _Try, answer: Answer) -> None:
        if step.committed:
            self.end.committed(attempt.record, attempt.upstream.name, step.first_event or "output")
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
        record = attempt.record
        for failure in step.failures_after_output:
            if not self.exchange.suppressed_failover:  # the first one is the attempt's story
                info = failure.error
                record.event_type = failure.event_type
                if info is not None:  # only what it says: the answer's own status stands otherwise
                    record.status = info.status or record.status
                    record.code = info.code or info.type
                    record.message = self.log.redact(info.message) if info.message else None
            self.exchange.suppressed_failover = True
            self.log.suppressed(record, failure.error, failure.event_type)

    async def _pass_rest(self, answer: Answer) -> None:
        """The rest of an answer forwarded as sent; if it breaks or stalls, so does the
        client's (a clean end would claim a complete answer)."""
        silence = self._silence(answer)
        touch = silence.touch
        write = self.client.write

        def timed(chunk: bytes) -> None:
            touch()
            write(chunk)

        silence.expect_by(self.settings.idle_timeout_s or None)
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


_OUTCOMES = {"retry": "retry", "next": "next_upstream", "give_up": "give_up"}


def _first_set(header: float | None, body: float | None) -> float | None:
    """A Retry-After header wins over a delay the body asks for (Gemini's RetryInfo)."""
    return header if header is not None else body


def _loop_time(deadline: float | None) -> float | None:
    """A time.monotonic() deadline on the event loop's clock, for asyncio.timeout_at."""
    if deadline is None:
        return None
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
