"""The staging gate: what of an upstream's stream may reach the client, and when.

Pure logic over bytes.  Before the first output, frames are held (staged);
the first output or terminal frame commits: everything staged goes out in
order, and from then on complete frames pass through as they arrive, all
frames of one read in one write.  A failure before commit is reported and
nothing is emitted, so the attempt can be discarded.  After commit failures
are still recognised (to log them and rewrite capacity codes) but never stop
the stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from .apis.base import Classification, ErrorInfo, FrameKind, StreamClassifier
from .apis.errors import CAPACITY_CODES, rewrite_capacity_codes
from .sse import Frame, FrameSplitter, SseEvent

_FRAME_ENDS = (b"\n\n", b"\r\n\r\n")  # the blank lines a read of whole frames ends with (Gemini's: CRLF)
OVERSIZED_HEAD = 64 * 1024  # of a frame too big to hold: where its field lines (its `event:`) are looked for

EOF_BEFORE_OUTPUT = ErrorInfo(
    message="upstream closed the stream before any output", event_type="eof", retryable_hint=True
)
EMPTY_ANSWER = ErrorInfo(
    message="upstream ended the stream ([DONE]) before any output", event_type="[DONE]", retryable_hint=True
)
# failures made of an absence: the provider reported nothing.  Forwarded as sent, such an
# answer reads as an empty success, so the client gets Switchyard's own error instead
SAID_NOTHING = (EOF_BEFORE_OUTPUT, EMPTY_ANSWER)


class Translator(Protocol):
    """An upstream that speaks another API than the client: each of its frames is
    classified by its own API, and what the client gets of it is this (translate/streams/)."""

    def feed(self, event: SseEvent) -> bytes:
        """The client's frames for one upstream event (complete frames, maybe none)."""
        ...

    def finish(self) -> bytes:
        """What closes the client's stream once the upstream's ended."""
        ...


OVERSIZED_TRANSLATED = ErrorInfo(message="upstream sent a frame larger than staging_limit, which cannot be translated",
                                 event_type="oversized", retryable_hint=True)


@dataclass(slots=True)
class GateStep:
    emit: bytes = b""  # bytes for the client now
    committed: bool = False  # this step made the first commit
    failure: Classification | None = None  # a failure before output: discard the attempt
    failures_after_output: tuple[Classification, ...] = ()
    first_event: str | None = None  # the frame that committed, for logs
    frames: list[bytes] | None = None  # `emit` frame by frame, for messages (`feed_message`)


class Gate:
    __slots__ = (
        "_classifier",
        "_splitter",
        "_staged",
        "_staged_size",
        "_limit",
        "_rewrite",
        "committed",
        "_failed_frames",
        "_passthrough",
        "_translator",
        "_staged_raw",
    )

    def __init__(self, classifier: StreamClassifier, *, staging_limit: int, rewrite_capacity_codes: bool,
                 translator: Translator | None = None) -> None:
        self._classifier = classifier
        self._splitter = FrameSplitter()
        self._staged: list[bytes] = []
        self._staged_size = 0
        self._limit = staging_limit
        self._rewrite = rewrite_capacity_codes
        self.committed = False
        self._failed_frames: list[bytes] = []  # the failure frame and what followed it in its read
        self._passthrough = False
        self._translator = translator  # an upstream of another API: the client gets its frames translated
        self._staged_raw: list[bytes] = []  # ... and what it sent, held with them (to show a failed attempt)

    @property
    def complete(self) -> bool:
        return self._classifier.complete

    def feed(self, chunk: bytes) -> GateStep:
        if self._passthrough:
            return GateStep(emit=chunk)
        if self.passes(chunk):
            return GateStep(emit=chunk)
        step = self._frames(self._splitter.feed(chunk))
        if step.failure is None and self._staged_size + self._splitter.pending > self._limit:
            if self._translator is not None:
                self._too_large(step)
            else:
                self._overflow(step)
        return step

    def _too_large(self, step: GateStep) -> None:
        """A translated stream is read whole frames at a time: one larger than what the
        route lets be held cannot be, and fails the attempt (before output, the next
        upstream is asked; after, the stream ends cut)."""
        self._splitter.drain()
        failure = Classification(FrameKind.FAILURE, "oversized", OVERSIZED_TRANSLATED)
        if self.committed:
            step.failures_after_output += (failure,)
        else:
            step.failure = failure

    def feed_message(self, raw: bytes, event: SseEvent) -> GateStep:
        """One WebSocket message: a whole frame already, whose `event` says what it
        is.  What may go to the client is `step.frames`, one message each."""
        if self._passthrough:
            return GateStep(emit=raw, frames=[raw])
        out: list[bytes] = []
        step = self._frames([Frame(raw, event)], out=out)
        step.frames = out
        return step

    def open_from_start(self) -> None:
        """Pass everything from the first frame, as after a commit: for an answer that is
        never held (a WebSocket turn that may not be re-sent), whose failures are still
        recognised and have their capacity codes rewritten."""
        self.committed = True

    def held_frames(self) -> list[bytes]:
        """`held()` frame by frame (messages)."""
        return [*self._staged, *self._failed_frames]

    def passes(self, chunk: bytes) -> bool:
        """After commit, whether a read is whole frames of plain answer content that
        go to the client as they came, unsplit: the hot path.  (The check on all
        of them at once can only say "look" more often than frame by frame, never less.)"""
        return (self.committed and not self._passthrough and not self._splitter.pending and self._translator is None
                and chunk.endswith(_FRAME_ENDS) and not self._classifier.worth_a_look(chunk))

    def _overflow(self, step: GateStep) -> None:
        """More than `staging_limit` held (an endless line, a giant frame): replay is
        no longer safe and holding more is not either, so commit and pass through."""
        if not self.committed:
            self.committed = True
            step.committed = True
            step.first_event = "staging_limit"
        else:
            self._oversized_frame(step)
        held = b"".join(self._staged) + self._splitter.drain()
        self._staged.clear()
        self._staged_size = 0
        step.emit += held

    def finish(self) -> GateStep:
        """End of the upstream body.  Before output it is a failure, retryable: the
        upstream went away without answering.  An unterminated last frame still says
        whether it was a provider's error, but it never commits: a client dispatches an
        event only at its blank line, so output in it would reach nobody."""
        if self._passthrough:
            return GateStep()
        step = self._frames(self._splitter.finish(), may_commit=self.committed)
        if not self.committed and step.failure is None:
            step.failure = Classification(FrameKind.FAILURE, "eof", EOF_BEFORE_OUTPUT)
        elif self._translator is not None and self.complete:
            step.emit += self._translator.finish()
        return step

    def held(self) -> bytes:
        """What a failed attempt sent so far, as the provider sent it (to keep or show)."""
        staged = self._staged if self._translator is None else self._staged_raw
        return b"".join(staged) + b"".join(self._failed_frames) + bytes(self._splitter.peek())

    def pass_through(self) -> bytes:
        """Forward a failed attempt as the provider sent it: everything held, then the
        rest of the stream untouched."""
        held = self.held()
        self._passthrough = True
        self.committed = True
        self._staged.clear()
        self._failed_frames.clear()
        self._splitter.drain()
        return held

    def _frames(self, frames: list[Frame], *, may_commit: bool = True, out: list[bytes] | None = None) -> GateStep:
        step = GateStep()
        if not frames:
            return step
        if out is None:
            out = []
        for index, frame in enumerate(frames):
            if self.committed:
                out.append(self._after_output(frame, step))
                continue
            result = self._classifier.classify(frame.event)
            kind = result.kind
            if kind is FrameKind.FAILURE or kind is FrameKind.EMPTY_END:
                if kind is FrameKind.EMPTY_END:
                    result = Classification(FrameKind.FAILURE, result.event_type, EMPTY_ANSWER)
                step.failure = result
                self._failed_frames = [f.raw for f in frames[index:]]
                return step
            if self._translator is None:
                raw = frame.raw
            else:
                raw = self._translator.feed(frame.event)
                self._staged_raw.append(frame.raw)
            self._staged.append(raw)
            self._staged_size += len(frame.raw)
            if may_commit and (result.commits or self._staged_size > self._limit):
                self.committed = True
                step.committed = True
                step.first_event = result.event_type if result.commits else "staging_limit"
                out.extend(self._staged)
                self._staged.clear()
                self._staged_raw.clear()
                self._staged_size = 0
        if out:
            step.emit = out[0] if len(out) == 1 else b"".join(out)
        return step

    def _oversized_frame(self, step: GateStep) -> None:
        """A frame after output too big to hold goes on in pieces, so it is never
        classified whole.  Its field lines before the giant one still say what it is:
        the Responses API's `response.completed` repeats the whole response (base64
        images included) after `event: response.completed`, and an end marker
        missed here would make a complete answer look cut."""
        head = self._splitter.peek(OVERSIZED_HEAD)
        end = max(head.rfind(b"\n"), head.rfind(b"\r"))
        name = Frame(head[:end + 1]).event.event if end > 0 else None
        if not name:
            return  # no `event:` line before the giant one (Chat's frames have none): nothing to go by
        # classified as the frame would be, by its type alone (what the classifiers read first)
        result = self._classifier.classify(SseEvent(event=name, data=json.dumps({"type": name})))
        if result.kind is FrameKind.FAILURE:
            step.failures_after_output += (result,)

    def _after_output(self, frame: Frame, step: GateStep) -> bytes:
        translator = self._translator
        if translator is not None:
            if self._classifier.worth_a_look(frame.raw):
                result = self._classifier.classify(frame.event)
                if result.kind is FrameKind.FAILURE:
                    step.failures_after_output += (result,)
            return translator.feed(frame.event)
        if not self._classifier.worth_a_look(frame.raw):
            return frame.raw  # plain answer content: forwarded without parsing
        result = self._classifier.classify(frame.event)
        if result.kind is FrameKind.FAILURE:
            step.failures_after_output += (result,)
            info = result.error
            if self._rewrite and info is not None and info.code in CAPACITY_CODES:
                return rewrite_capacity_codes(frame.raw)
        return frame.raw
