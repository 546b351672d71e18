"""Finishing a committed answer that was cut or stalled, when the route asks for it.

The strategies of `continue_after_cut`, in order: `prefill` asks each upstream
that declares `prefill: true` (the cut one first, then the ones after it) for
the rest of the text the client has; `regenerate` asks them (every one, in the
same order) for the whole answer again, held until it begins with exactly
what the client has.  Each upstream is asked once per strategy.  A
continuation's own failure (a 400 for the prefill, a different answer) is
logged and shown as its attempt, never told to the client: when nothing
finishes the answer, the caller ends it with the original cut.

The pure parts (what the client has, the request, the matching, the
re-framing) live in `continuation/`; this module only does the I/O.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from .. import observe
from ..apis import Api, FrameKind
from ..apis.errors import http_error_info
from ..continuation import (
    Diverged,
    NotContinuable,
    Transcript,
    continuation_body,
    overlap_for,
    read_transcript,
    reframer_for,
)
from ..continuation.reframe import Reframer
from ..exchange import AttemptRecord, Exchange
from ..redaction import env_secrets
from ..rules import Upstream
from ..sse import FrameSplitter
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
from .client_stream import ClientStream
from .deadlines import Deadlines, effort_over
from .log import AttemptLog
from .read_deadline import Silence

ERROR_BODY_LIMIT = 64 * 1024  # of a continuation's failed answer: kept to show in mitmweb

Pipe = Callable[[Answer, Callable[[bytes], None], Silence], Awaitable[BaseException | None]]


class _Try(enum.Enum):
    FAILED = "failed"  # nothing reached the client: it has what it had
    PROGRESSED = "progressed"  # some text went out, then this one broke too
    FINISHED = "finished"  # the client's answer is whole


class Continuation:
    def __init__(self, exchange: Exchange, api: Api, http: Upstreams, client: ClientStream, log: AttemptLog,
                 pipe: Pipe, silence: Callable[[Answer], Silence]) -> None:
        self.exchange = exchange
        self.route = exchange.route
        self.settings = exchange.route.settings
        self.api = api
        self.http = http
        self.client = client
        self.log = log
        self._pipe = pipe
        self._silence = silence
        self.answer: Transcript | None = None  # once finished: the whole answer the client has

    @property
    def wanted(self) -> bool:
        return bool(self.settings.continue_after_cut) and self.exchange.request.wants_stream

    async def finish(self, cut: AttemptRecord, message: str) -> bool:
        """Try to finish the answer `cut` left unfinished; True if the client's answer is whole.

        A bug here must not cost the client the original cut's clean error."""
        try:
            return await self._finish(cut, message)
        except Exception as exc:  # noqa: BLE001 -- logged; the caller ends the answer with the cut
            observe.log.warning(observe.format_event("switchyard.continuation_error", route=self.route.name,
                                                     upstream=cut.upstream, error=type(exc).__name__),
                                exc_info=True)
            return False

    async def _finish(self, cut: AttemptRecord, message: str) -> bool:
        cut_at = time.monotonic()
        cut.cut(message)  # the flow's story says what was continued
        try:
            transcript = self._transcript()
        except NotContinuable as exc:
            observe.emit(logging.INFO, "switchyard.not_continued", route=self.route.name, upstream=cut.upstream,
                         reason=exc.reason, **self.log.context)
            return False
        upstreams = self.route.upstreams
        first = next((i for i, u in enumerate(upstreams) if u.name == cut.upstream), 0)
        for strategy in self.settings.continue_after_cut:
            for upstream in upstreams[first:]:
                if strategy == "prefill" and not upstream.prefill:
                    continue
                if effort_over(self.settings, cut_at, time.monotonic()):
                    return False  # every try since the cut had its time together (deadlines.py)
                outcome = await self._try(strategy, upstream, transcript, cut_at)
                if outcome is _Try.FINISHED:
                    return True
                if outcome is _Try.PROGRESSED:  # from now on it is this one's cut that is continued
                    cut_at = time.monotonic()
                    try:
                        transcript = self._transcript()
                    except NotContinuable:
                        return False
        return False

    def _transcript(self) -> Transcript:
        raw = self.client.transcript
        if raw is None:
            raise NotContinuable("the answer is longer than what is kept to continue it (staging_limit)")
        try:
            request = json.loads(self.exchange.request.body)
        except (ValueError, RecursionError):
            request = None
        return read_transcript(self.api.name, bytes(raw), request)

    async def _try(self, strategy: str, upstream: Upstream, transcript: Transcript, cut_at: float) -> _Try:
        request = build_request(self.exchange.request, upstream, self.api.name)
        wanted = continuation_body(self.api.name, strategy, request.body, transcript.text,
                                   prefill_body=upstream.prefill_body, prefill_message=upstream.prefill_message,
                                   reasoning=transcript.reasoning)
        if wanted is None:
            return _Try.FAILED  # a request this strategy cannot be made from
        request = replace(request, body=wanted.body)
        record = AttemptRecord(
            attempt=len(self.exchange.attempts) + 1,
            upstream=upstream.name,
            url=display_url(self.exchange.request, upstream, self.api.name),
            started=time.monotonic(),
            request_headers=request.headers,
            secret_headers=secret_header_names(upstream),
            continuation=strategy,
        )
        self.exchange.attempts.append(record)
        overlap = overlap_for(strategy, transcript.text, wanted.echo, wanted.restated)
        reframer = reframer_for(transcript, overlap, self.settings.staging_limit)
        deadlines = Deadlines.of(self.settings, streams=True, started=record.started)
        self.client.passing_from(env_secrets(upstream))
        try:
            async with asyncio.timeout(deadlines.continuation_wait(cut_at, time.monotonic(), head=True)):
                answer = await self.http.open(request, connect_timeout_s=deadlines.connect)
        except (ConnectTimeout, TimeoutError):
            return self._failed(record, "no response headers in time")
        except OSError as exc:
            return self._failed(record, transport_failure(exc).message)
        try:
            record.answered(answer.status, request_id(answer.headers))
            if not 200 <= answer.status < 300:
                body, _ = await read_bounded(answer, ERROR_BODY_LIMIT, deadlines.error_body)
                record.kept(answer.status, forwarded_response_headers(answer.headers), body)
                info = http_error_info(answer.status, body)
                return self._failed(record, info.message or f"HTTP {answer.status}", code=info.code or info.type)
            if "text/event-stream" not in answer.headers.get("Content-Type", "").lower():
                return self._failed(record, "the upstream answered with a non-streaming body")
            return await self._stream(answer, record, reframer, strategy, cut_at, transcript, deadlines)
        finally:
            answer.close()

    async def _stream(self, answer: Answer, record: AttemptRecord, reframer: Reframer, strategy: str,
                      cut_at: float, transcript: Transcript, deadlines: Deadlines) -> _Try:
        """The continuation's frames, re-framed, to the client as they arrive."""
        record.reached("staging")
        classifier = self.api.stream_classifier(self.exchange.request.wants_usage)
        splitter = FrameSplitter()
        body = answer.body
        silence = self._silence(answer)
        touch = silence.touch
        write = self.client.write
        problems: list[str] = []
        # when the first continued frame went out: from then on the client's stream has
        # changed (text, or only its end when the cut came right before it), so a later
        # failure is this try's cut, to be continued from what the client now has
        first: list[float] = []
        limit = self.settings.staging_limit

        def through(chunk: bytes) -> None:
            if first:  # before the first continued character, nothing moves its due time
                touch()
            for frame in splitter.feed(chunk):
                event = frame.event
                result = classifier.classify(event)
                if result.kind in (FrameKind.FAILURE, FrameKind.EMPTY_END):
                    error = result.error
                    problems.append(error.message if error and error.message else f"a failure ({result.event_type})")
                    body.stop()
                    return
                try:
                    out = reframer.feed(event)
                except Diverged as exc:
                    problems.append(str(exc))
                    body.stop()
                    return
                if out:
                    if not first:
                        first.append(time.monotonic())
                        self._continued(record, strategy, cut_at, transcript)
                        silence.expect_by(deadlines.quiet_after_output)
                    write(out)
            if splitter.pending > limit:
                # a frame is re-framed only whole: one larger than what the route lets be
                # held is more than this try may cost
                problems.append(f"a frame larger than staging_limit ({limit} bytes)")
                body.stop()

        silence.expect_by(deadlines.continuation_wait(cut_at, time.monotonic(), head=False))
        try:
            error = await self._pipe(answer, through, silence)
        except TimeoutError:
            error = None
            problems.append(deadlines.stalled_message(after_output=False) if first
                            else deadlines.no_continued_text(cut_at))
        if not problems and error is not None:
            problems.append(transport_failure(error).message)
        if not problems and not classifier.complete:
            try:
                reframer.overlap.ended()
            except Diverged as exc:
                problems.append(str(exc))
            else:
                problems.append("upstream ended the stream before completing the answer")
        if problems:
            return self._failed(record, problems[0], progressed=bool(first))
        record.continued()
        whole = reframer.whole_text  # None: longer than is kept, and not carried to a later turn
        self.answer = replace(transcript, text=whole) if whole is not None else None
        return _Try.FINISHED

    def _continued(self, record: AttemptRecord, strategy: str, cut_at: float, transcript: Transcript) -> None:
        record.reached("output")
        # in the API's own way: an SSE comment is a parse error to Google's SDKs
        self.client.write(self.api.comment(f"switchyard continued upstream={record.upstream} strategy={strategy}"))
        observe.emit(logging.INFO, "switchyard.continued_after_cut", route=self.route.name, upstream=record.upstream,
                     attempt=record.attempt, strategy=strategy, chars_sent=len(transcript.text),
                     first_char_after_s=round(time.monotonic() - cut_at, 4), request_id=record.request_id,
                     **self.log.context)

    def _failed(self, record: AttemptRecord, message: str, *, code: str | None = None, progressed: bool = False) -> _Try:
        record.continuation_failed(self.log.redact(message), code=code, progressed=progressed)
        observe.emit(logging.INFO, "switchyard.continuation_failed", route=self.route.name, upstream=record.upstream,
                     attempt=record.attempt, strategy=record.continuation, phase=record.phase, status=record.status,
                     code=record.code, message=record.message, request_id=record.request_id,
                     **self.log.context)
        return _Try.PROGRESSED if progressed else _Try.FAILED
