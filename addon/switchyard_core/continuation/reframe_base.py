"""What every API's continuation re-framer keeps (see reframe.py)."""

from __future__ import annotations

from typing import Any

from ..sse import SseEvent, compact_json
from .overlap import Overlap
from .transcript import Transcript

KEPT_TEXT_LIMIT = 8 * 1024 * 1024  # characters of continued text kept, unless the caller says (staging_limit)


def sse_event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + compact_json(data) + b"\n\n"


KEEPALIVE = b": switchyard keepalive\n\n"


class BaseReframer:
    """What every API's re-framer keeps: the original's ids, the overlap, and the text
    that went out while it is short.

    A continuation must cost what an uncut answer does, however long it runs: the
    text forwarded is kept only up to `keep` characters (the route's staging_limit),
    and past that only counted.  What needs the whole text then takes it from the
    continuation's own frame instead (`_whole_from`)."""

    def __init__(self, transcript: Transcript, overlap: Overlap, keep: int = KEPT_TEXT_LIMIT) -> None:
        self.transcript = transcript
        self.overlap = overlap
        self.forwarded = 0
        self._sent: list[str] | None = []  # the text forwarded, in order; None once past `keep`
        self._keep = keep - len(transcript.text)

    def _keepalive(self, frame: bytes) -> bytes:
        """A keepalive (a comment, a ping) once the continuation's text flows; before,
        nothing: a try that fails leaves no trace with the client."""
        return frame if self.forwarded else b""

    def feed(self, event: SseEvent) -> bytes:
        raise NotImplementedError

    def _text(self, text: str) -> str:
        new = self.overlap.take(text)
        self.forwarded += len(new)
        if new and self._sent is not None:
            if self.forwarded > self._keep:
                self._sent = None  # longer than is kept: from now on only counted
            else:
                self._sent.append(new)
        return new

    @property
    def whole_text(self) -> str | None:
        """All the text the client has of the answer now; None once it is longer than is kept."""
        if self._sent is None:
            return None
        return self.transcript.text + "".join(self._sent)

    def _whole_from(self, own: Any) -> str:
        """The whole text the client has, from a continuation frame's own `own` (a `.done`
        event's whole text) where it is no longer kept: the client's text before the
        continuation, then what it got of `own` (all but what the overlap skipped)."""
        whole = self.whole_text
        if whole is not None or not isinstance(own, str):
            return whole if whole is not None else self.transcript.text
        return self.transcript.text + own[self.overlap.skipped:]
