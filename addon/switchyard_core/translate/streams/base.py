"""What every decoder and encoder shares.

A decoder reads one upstream API's events with that API's own classifier first
(`apis/`), so failures, keepalives and the end marker are found exactly as the
gate finds them; only what the classifier leaves (lifecycle and output) is read
for content.  An encoder writes one client API's frames; it opens the client's
stream at the upstream's start, closes what is open when the answer finishes,
and ends the client's stream only at the upstream's end.
"""

from __future__ import annotations

from typing import Any

from ...apis import APIS
from ...apis.base import ErrorInfo, FrameKind, StreamClassifier
from ...sse import SseEvent
from . import ir
from .errors import error_frame

_NOTHING: list[ir.Event] = []


class Decoder:
    """Turns one upstream stream's events into answer events, in order."""

    api = ""

    def __init__(self) -> None:
        self._classifier: StreamClassifier = APIS[self.api].stream_classifier()
        self.dropped: set[str] = set()  # what the upstream said that no client API is given

    @property
    def complete(self) -> bool:
        """The upstream's own end marker has been seen."""
        return self._classifier.complete

    def decode(self, event: SseEvent) -> list[ir.Event]:
        result = self._classifier.classify(event)
        kind = result.kind
        if kind is FrameKind.KEEPALIVE:
            return [ir.KEEPALIVE]
        if kind is FrameKind.FAILURE:
            return [ir.Failed(result.error)] if result.error is not None else _NOTHING
        if kind is FrameKind.EMPTY_END or event.data is None or event.data.startswith("[DONE]"):
            return [ir.END] if kind is FrameKind.TERMINAL else _NOTHING  # a gateway's [DONE]
        obj = event.json()
        if not isinstance(obj, dict):
            return _NOTHING  # no JSON object: nothing any client API could be told
        return self._content(obj, event.event)

    def _content(self, obj: dict[str, Any], name: str | None) -> list[ir.Event]:
        raise NotImplementedError


class Encoder:
    """Writes one client API's frames for the answer events, in order."""

    api = ""
    drops_reasoning = False  # the client's API has no way to receive reasoning (see docs/translation.md)

    def __init__(self, model: str, created: int, usage_wanted: bool) -> None:
        self.model = model
        self.created = created
        self.usage_wanted = usage_wanted
        self.started = False
        self.usage: ir.Usage | None = None
        self.calls = 0  # tool calls started
        self.dropped: set[str] = set()  # what the client's API could not be given

    def start(self, event: ir.Start) -> bytes:
        raise NotImplementedError

    def text(self, text: str) -> bytes:
        raise NotImplementedError

    def reasoning(self, text: str) -> bytes:
        raise NotImplementedError

    def tool_start(self, key: int, call_id: str, name: str) -> bytes:
        raise NotImplementedError

    def tool_args(self, key: int, delta: str) -> bytes:
        raise NotImplementedError

    def tool_end(self, key: int) -> bytes:
        raise NotImplementedError

    def no_arguments(self, key: int) -> bytes:
        """A call ended with no arguments: `{}`, where the call is still open to take them."""
        return self.tool_args(key, "{}")

    def finish(self, reason: ir.Finish) -> bytes:
        """The answer finished: close what is open (the end itself waits for `close`,
        since usage may still come)."""
        raise NotImplementedError

    def close(self) -> bytes:
        """The client's stream's end: the finish reason, the usage, the end marker."""
        raise NotImplementedError

    def keepalive(self) -> bytes:
        return APIS[self.api].comment("keepalive")

    def error(self, error: ErrorInfo) -> bytes:
        return error_frame(self.api, error)

    def add_usage(self, usage: ir.Usage) -> None:
        self.usage = usage if self.usage is None else self.usage.merged(usage)
