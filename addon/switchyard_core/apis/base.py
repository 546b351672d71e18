"""What every API classifier speaks: frame kinds, error facts, the Api interface.

Classifiers only *describe* what a frame or body says (`ErrorInfo`); whether
that is worth a retry is decided by `errors.ErrorPolicy`, because the answer
depends on the user's `retry_on` and on response headers, not on the API.

Values come from `json.loads`: objects are tested with `isinstance(x, dict)`,
not against the `Mapping` ABC, whose check costs several times more on a path
taken for every frame before output.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

from ..sse import SseEvent


class FrameKind(enum.Enum):
    KEEPALIVE = "keepalive"  # comment-only: never commits
    LIFECYCLE = "lifecycle"  # staged until output
    OUTPUT = "output"  # answer content: commits
    TERMINAL = "terminal"  # a legitimate end with no content: commits
    FAILURE = "failure"  # an error the provider reported
    EMPTY_END = "empty_end"  # an end marker with nothing before it ([DONE] alone)


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The facts of one provider error, as found on the wire."""

    status: int | None = None  # HTTP status, or a numeric code inside the body
    code: str | None = None
    type: str | None = None
    message: str = ""
    event_type: str | None = None  # the SSE event or frame type that carried it
    retryable_hint: bool = False  # the carrier itself says "transient" (finish_reason "error")
    retry_after_s: float | None = None  # how long the body asks to wait (Gemini's RetryInfo), like Retry-After


@dataclass(frozen=True, slots=True)
class Classification:
    kind: FrameKind
    event_type: str | None = None
    error: ErrorInfo | None = None

    @property
    def commits(self) -> bool:
        return self.kind in (FrameKind.OUTPUT, FrameKind.TERMINAL)


class StreamClassifier(Protocol):
    """Classifies the frames of one stream, in order; holds per-stream state."""

    def classify(self, event: SseEvent) -> Classification: ...

    def worth_a_look(self, raw: bytes) -> bool:
        """After output, whether a frame's raw bytes might end the stream or report a
        failure; only those are parsed (a byte-level check, cheap on the hot path)."""
        ...

    @property
    def complete(self) -> bool:
        """The API's end marker has been seen: a later EOF is a clean end."""
        ...


def carries_text(value: Any) -> bool:
    """Text, or a container holding text; numbers, flags and `type` tags are not
    answer content (an item or block that carries any text has started)."""
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, dict):
        return any(carries_text(v) for k, v in value.items() if k != "type")
    if isinstance(value, list):
        return any(carries_text(v) for v in value)
    return False


_DONE = Classification(FrameKind.TERMINAL, "[DONE]")
_DONE_EMPTY = Classification(FrameKind.EMPTY_END, "[DONE]")


class StreamState:
    """What every stream classifier keeps: whether output was seen, whether the
    API's end marker was.  Subclasses classify one frame in `_classify`."""

    __slots__ = ("_seen_output", "_complete")

    def __init__(self) -> None:
        self._seen_output = False
        self._complete = False

    @property
    def complete(self) -> bool:
        return self._complete

    def classify(self, event: SseEvent) -> Classification:
        result = self._classify(event)
        if result.kind is FrameKind.OUTPUT:
            self._seen_output = True
        return result

    def _classify(self, event: SseEvent) -> Classification:
        raise NotImplementedError

    def _done(self) -> Classification:
        """`[DONE]`: Chat's end marker, which some gateways append to the other APIs'
        streams too.  Alone, before any output, it ends an empty answer."""
        self._complete = True
        return _DONE if self._seen_output else _DONE_EMPTY


class Api(Protocol):
    name: str

    def stream_classifier(self, usage_expected: bool = False) -> StreamClassifier:
        """A classifier for one stream; `usage_expected`: the client asked for a usage
        report at the end (Chat's `stream_options.include_usage`), so the answer is
        complete only once it came.  The other APIs always end with their usage."""
        ...

    def body_error(self, body: Any) -> ErrorInfo | None:
        """The error a 2xx non-streaming JSON answer carries, if any."""
        ...

    def error_event(self, message: str, code: str, error_type: str | None = None) -> bytes:
        """An in-band SSE error frame in this API's own shape; `error_type` is a
        provider's own (`invalid_request_error`, `authentication_error`) when its
        error is forwarded, else one that every client's retry policy retries."""
        ...

    def error_body(self, message: str, code: str, error_type: str | None = None) -> bytes:
        """A JSON error body in this API's own shape."""
        ...

    def comment(self, text: str) -> bytes:
        """A frame this API's clients skip, saying `text` where they can: the pre-answer
        keepalive, and the name of the winner when headers left before it was known."""
        ...


def sse_comment(text: str) -> bytes:
    """An SSE comment: skipped by every client that follows the SSE spec."""
    return b": " + text.encode() + b"\n\n"
