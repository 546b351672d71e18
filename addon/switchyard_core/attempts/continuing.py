"""Finishing a committed answer that was cut or stalled, when the route asks for it:
one more kind of attempt, decided by the same core.

The strategies of `continue_after_cut`, in order: `prefill` asks each upstream
that declares `prefill: true` (the cut one first, then the ones after it) for
the rest of the text the client has; `regenerate` asks them (every one, in the
same order) for the whole answer again, held until it begins with exactly
what the client has.  Each upstream is asked once per strategy.  A
continuation's own failure (a 400 for the prefill, a different answer) is
logged and shown as its attempt, never told to the client: when nothing
finishes the answer, it ends with the original cut.

A continuation's first continued character is due from its attempt's start, as
an answer's first output is (comments and empty deltas never move it); then
silence after output bounds it.  The pure parts (what the client has, the
request, the matching, the re-framing) live in `continuation/`.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from .. import observe
from ..apis import FrameKind, StreamClassifier
from ..apis.errors import http_error_info
from ..continuation import (Diverged, NotContinuable, Transcript, continuation_body, overlap_for, read_transcript,
                            reframer_for)
from ..continuation.reframe import Reframer
from ..exchange import AttemptRecord
from ..redaction import env_secrets
from ..rules import Upstream
from ..sse import FrameSplitter
from ..translate.request import Untranslatable
from ..translate.streams import StreamTranslator, stream_translator
from ..upstreams.translated import translated_display_url, translated_request
from ..upstreams.messages import (
    build_request,
    display_url,
    forwarded_response_headers,
    request_id,
    secret_header_names,
    transport_failure,
)
from ..ws_items import Closed
from .answer import is_event_stream
from .attempt import Attempt, Core, Cut
from .commands import Expect, Open, Pipe, Read
from .deadlines import Deadlines, effort_over
from .policy import UpstreamTry

ERROR_BODY_LIMIT = 64 * 1024  # of a continuation's failed answer: kept to show in mitmweb


class Outcome(enum.Enum):
    FAILED = "failed"  # nothing reached the client: it has what it had
    PROGRESSED = "progressed"  # some text went out, then this one broke too
    FINISHED = "finished"  # the client's answer is whole


@dataclass(slots=True)
class _Cut:
    record: AttemptRecord
    message: str
    code: Cut
    closed: Closed | None


class Continuing:
    """One exchange's continuation effort after a cut: which upstream is asked how, in order."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.answer: Transcript | None = None  # once finished: the whole answer the client has
        self._cut: _Cut | None = None
        self._tries: Iterator[tuple[str, Upstream]] = iter(())
        self._transcript: Transcript | None = None
        self._cut_at = 0.0

    def begin(self, attempt: Attempt, message: str, code: Cut, closed: Closed | None, now: float) -> bool:
        """A committed answer was cut: True if a continuation is under way.

        A bug here must not cost the client the original cut's clean ending."""
        try:
            return self._begin(attempt, message, code, closed, now)
        except Exception as exc:  # noqa: BLE001 -- logged; the caller ends the answer with the cut
            self._bug(exc, attempt.record.upstream)
            return False

    def _begin(self, attempt: Attempt, message: str, code: Cut, closed: Closed | None, now: float) -> bool:
        core = self.core
        cut = attempt.record
        cut.cut(message)  # the flow's story says what was continued
        self._cut = _Cut(cut, message, code, closed)
        self._cut_at = now
        try:
            self._transcript = self._read()
        except NotContinuable as exc:
            observe.emit(logging.INFO, "switchyard.not_continued", route=core.route.name, upstream=cut.upstream,
                         reason=exc.reason, **core.log.context)
            return False
        upstreams = core.route.upstreams
        first = next((i for i, u in enumerate(upstreams) if u.name == cut.upstream), 0)
        self._tries = ((strategy, upstream) for strategy in core.settings.continue_after_cut
                       for upstream in upstreams[first:] if strategy != "prefill" or upstream.prefill)
        return self._next(now)

    def over(self, attempt: "ContinuationAttempt", outcome: Outcome, now: float) -> None:
        """A continuation attempt came to its end."""
        core = self.core
        core.stop(attempt)
        try:
            if outcome is Outcome.FINISHED:
                transcript = self._transcript
                assert transcript is not None
                whole = attempt.reframer.whole_text  # None: longer than is kept, and carried nowhere
                self.answer = replace(transcript, text=whole) if whole is not None else None
                core.end.continued()
                if core.turn is not None and self.answer is not None:
                    core.turn.carry(self.answer, core.exchange.request.body)
                core.finish()
                return
            if outcome is Outcome.PROGRESSED:  # from now on it is this one's cut that is continued
                self._cut_at = now
                try:
                    self._transcript = self._read()
                except NotContinuable:
                    self._ends()
                    return
            if not self._next(now):
                self._ends()
        except Exception as exc:  # noqa: BLE001 -- logged; the answer ends with the cut
            self._bug(exc, attempt.record.upstream)
            self._ends()

    def _ends(self) -> None:
        cut = self._cut
        assert cut is not None
        self.core.cut_ends(cut.record, cut.message, cut.code, cut.closed)

    def _bug(self, exc: Exception, upstream: str) -> None:
        observe.log.warning(observe.format_event("switchyard.continuation_error", route=self.core.route.name,
                                                 upstream=upstream, error=type(exc).__name__), exc_info=True)

    def _read(self) -> Transcript:
        core = self.core
        raw = core.client.transcript
        if raw is None:
            raise NotContinuable("the answer is longer than what is kept to continue it (staging_limit)")
        try:
            request = json.loads(core.exchange.request.body)
        except (ValueError, RecursionError):
            request = None
        return read_transcript(core.api.name, bytes(raw), request)

    def _next(self, now: float) -> bool:
        """Open the next continuation that can be asked; False when none is left."""
        transcript = self._transcript
        assert transcript is not None
        for strategy, upstream in self._tries:
            if effort_over(self.core.settings, self._cut_at, now):
                return False  # every try since the cut had its time together (deadlines.py)
            attempt = self._attempt(strategy, upstream, transcript, now)
            if attempt is not None:
                return True
        return False

    def _attempt(self, strategy: str, upstream: Upstream, transcript: Transcript,
                 now: float) -> "ContinuationAttempt | None":
        core = self.core
        original = core.exchange.request
        speaks = upstream.api if upstream.api not in (None, core.api.name) else None
        if speaks is not None:
            # asked in its own API: the continuation is made on the translated request, and
            # its answer translated back before it is matched and re-framed
            try:
                request, _ = translated_request(original, upstream, core.api.name)
            except Untranslatable:
                return None
        else:
            request = build_request(original, upstream, core.api.name)
        wanted = continuation_body(speaks or core.api.name, strategy, request.body, transcript.text,
                                   prefill_body=upstream.prefill_body, prefill_message=upstream.prefill_message,
                                   reasoning=transcript.reasoning if speaks is None else ())
        if wanted is None:
            return None  # a request this strategy cannot be made from
        request = replace(request, body=wanted.body)
        exchange = core.exchange
        url = translated_display_url(upstream, True) if speaks is not None else display_url(original, upstream,
                                                                                             core.api.name)
        record = AttemptRecord(attempt=len(exchange.attempts) + 1, upstream=upstream.name, url=url, started=now,
                               request_headers=request.headers, secret_headers=secret_header_names(upstream),
                               request_method=request.method, request_body=request.body, continuation=strategy)
        exchange.add(record)
        overlap = overlap_for(strategy, transcript.text, wanted.echo, wanted.restated)
        deadlines = Deadlines.of(core.settings, streams=True, started=now)
        index = next((i for i, u in enumerate(core.route.upstreams) if u is upstream), 0)
        attempt = ContinuationAttempt(UpstreamTry(index, upstream, 1, False), record, deadlines, env_secrets(upstream),
                                      continuing=self, strategy=strategy,
                                      reframer=reframer_for(transcript, overlap, core.settings.staging_limit),
                                      classifier=core.api.stream_classifier(original.wants_usage),
                                      chars_sent=len(transcript.text), cut_at=self._cut_at,
                                      translator=stream_translator(speaks, core.api.name, model=upstream.model or "",
                                                                   usage_wanted=original.wants_usage)
                                      if speaks is not None else None)
        # its head within headers_timeout_s, and never past when its first continued text is due
        dues = [due for due in (deadlines.continued_by(self._cut_at),
                                now + deadlines.headers if deadlines.headers else None) if due is not None]
        core.open_attempt(attempt, Open(record.attempt, request, "http", deadlines.connect,
                                        min(dues) if dues else None))
        return attempt


@dataclass(slots=True, eq=False)
class ContinuationAttempt(Attempt):
    continuing: Continuing | None = None
    strategy: str = "regenerate"
    reframer: Reframer = field(default=None)  # type: ignore[assignment]
    classifier: StreamClassifier = field(default=None)  # type: ignore[assignment]
    chars_sent: int = 0
    cut_at: float = 0.0
    status: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    splitter: FrameSplitter = field(default_factory=FrameSplitter)
    # when the first continued frame went out: from then on the client's stream has
    # changed (text, or only its end when the cut came right before it), so a later
    # failure is this try's cut, to be continued from what the client now has
    first_at: float | None = None
    problem: str | None = None
    # an upstream of another API: its frames, split and translated into the client's first
    translator: StreamTranslator | None = None
    own_splitter: FrameSplitter = field(default_factory=FrameSplitter)

    takes_faults = False

    def _over(self, core: Core, outcome: Outcome, now: float) -> None:
        assert self.continuing is not None
        self.continuing.over(self, outcome, now)

    def _failed(self, core: Core, message: str, now: float, *, code: str | None = None) -> None:
        record = self.record
        progressed = self.first_at is not None
        record.continuation_failed(core.log.redact(message), code=code, progressed=progressed)
        observe.emit(logging.INFO, "switchyard.continuation_failed", route=core.route.name, upstream=record.upstream,
                     attempt=record.attempt, strategy=record.continuation, phase=record.phase, status=record.status,
                     code=record.code, message=record.message, request_id=record.request_id, **core.log.context)
        self._over(core, Outcome.PROGRESSED if progressed else Outcome.FAILED, now)

    def open_failed(self, core: Core, why: str, error: BaseException | None, now: float) -> None:
        if why == "transport":
            self._failed(core, transport_failure(error or ConnectionError()).message, now)
        else:
            self._failed(core, "no response headers in time", now)

    def opened(self, core: Core, status: int, headers: Mapping[str, str], now: float) -> None:
        self.status, self.headers = status, headers
        self.record.answered(status, request_id(headers), now)
        if not 200 <= status < 300:
            core.out(Read(self.number, "error", ERROR_BODY_LIMIT, span_s=self.deadlines.error_body))
        elif not is_event_stream(headers):
            self._failed(core, "the upstream answered with a non-streaming body", now)
        else:
            self.record.reached("staging")
            core.out(Expect(self.number, by=self.deadlines.continued_by(self.cut_at)), Pipe(self.number))

    def body_read(self, core: Core, body: bytes, complete: bool, error: BaseException | None, timed_out: bool,
                  now: float) -> None:
        self.record.kept(self.status, forwarded_response_headers(self.headers), body)
        info = http_error_info(self.status, body)
        self._failed(core, info.message or f"HTTP {self.status}", now, code=info.code or info.type)

    def data(self, core: Core, chunk: bytes, now: float) -> None:
        """The continuation's frames, re-framed, to the client as they arrive."""
        if self.problem is not None:
            return
        if self.translator is not None:
            translator = self.translator
            chunk = b"".join(translator.feed(frame.event) for frame in self.own_splitter.feed(chunk))
            if self.own_splitter.pending > core.settings.staging_limit:
                self._problem(core, f"a frame larger than staging_limit ({core.settings.staging_limit} bytes)", now)
                return
        for frame in self.splitter.feed(chunk):
            event = frame.event
            result = self.classifier.classify(event)
            if result.kind in (FrameKind.FAILURE, FrameKind.EMPTY_END):
                error = result.error
                self._problem(core, error.message if error and error.message else f"a failure ({result.event_type})",
                              now)
                return
            try:
                out = self.reframer.feed(event)
            except Diverged as exc:
                self._problem(core, str(exc), now)
                return
            if out:
                if self.first_at is None:
                    self.first_at = now
                    self._continued(core, now)
                    core.out(Expect(self.number, quiet=self.deadlines.quiet_after_output))
                core.client.write(out)
        limit = core.settings.staging_limit
        if self.splitter.pending > limit:
            # a frame is re-framed only whole: one larger than what the route lets be
            # held is more than this try may cost
            self._problem(core, f"a frame larger than staging_limit ({limit} bytes)", now)

    def ended(self, core: Core, error: BaseException | None, now: float) -> None:
        if self.problem is not None:
            return
        if error is not None:
            self._failed(core, transport_failure(error).message, now)
            return
        if self.translator is not None:
            translator, self.translator = self.translator, None
            ending = b"".join(translator.feed(frame.event) for frame in self.own_splitter.finish())
            self.data(core, ending + translator.finish(), now)  # the client's end, once the upstream's came
            if self.problem is not None:
                return
        if not self.classifier.complete:
            try:
                self.reframer.overlap.ended()
            except Diverged as exc:
                self._failed(core, str(exc), now)
            else:
                self._failed(core, "upstream ended the stream before completing the answer", now)
            return
        self.record.continued()
        self._over(core, Outcome.FINISHED, now)

    def timed_out(self, core: Core, now: float) -> None:
        if self.problem is not None:
            return
        if self.first_at is None:
            self._problem(core, self.deadlines.no_continued_text(self.cut_at), now)
        else:
            self._problem(core, self.deadlines.stalled_message(after_output=False), now)

    def _problem(self, core: Core, message: str, now: float) -> None:
        self.problem = message
        self._failed(core, message, now)

    def _continued(self, core: Core, now: float) -> None:
        record = self.record
        record.reached("output")
        core.client.passing_from(self.secrets)  # what it sends on, its own `${VAR}` values redacted
        # in the API's own way: an SSE comment is a parse error to Google's SDKs
        core.client.write(core.api.comment(f"switchyard continued upstream={record.upstream} strategy={self.strategy}"))
        observe.emit(logging.INFO, "switchyard.continued_after_cut", route=core.route.name, upstream=record.upstream,
                     attempt=record.attempt, strategy=self.strategy, chars_sent=self.chars_sent,
                     first_char_after_s=round(now - self.cut_at, 4), request_id=record.request_id, **core.log.context)
