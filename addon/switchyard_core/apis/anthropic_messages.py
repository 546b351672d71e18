"""Anthropic Messages (`/v1/messages`) streams.

Answer content is any `content_block_delta` (text, tool input, thinking,
signature, citations), a block that starts with content of its own (tool use,
server tool use, redacted thinking, any other or non-empty block), and
`message_delta`: it carries the stop reason, so a refusal with an empty text
block (reference §3.4) commits instead of being mistaken for an empty answer.
`message_start`, an empty text or thinking block start and `content_block_stop`
are lifecycle; `ping` is a keepalive; `message_stop` ends the stream.  The
event type is read from data's "type" and, for data-only frames, from the
`event:` line; either one saying `error` is enough.  JSON is always decoded,
never matched as bytes: Anthropic pads it with whitespace.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..sse import SseEvent
from .base import carries_text, Classification, ErrorInfo, FrameKind, StreamState, sse_comment
from .errors import MESSAGE_LIMIT, error_info

NAME = "anthropic-messages"

_KEEPALIVE = Classification(FrameKind.KEEPALIVE)
_PING = Classification(FrameKind.KEEPALIVE, "ping")
_BLOCK_STOP = Classification(FrameKind.LIFECYCLE, "content_block_stop")
_BLOCK_DELTA = Classification(FrameKind.OUTPUT, "content_block_delta")
_MESSAGE_DELTA = Classification(FrameKind.OUTPUT, "message_delta")
_MESSAGE_STOP = Classification(FrameKind.TERMINAL, "message_stop")

# Block types that start empty and fill through deltas.
_EMPTY_START_BLOCKS = frozenset({"text", "thinking"})


def _block_carries_content(block: Any) -> bool:
    """An empty text or thinking block is a header; anything else is answer."""
    if not isinstance(block, dict) or block.get("type") not in _EMPTY_START_BLOCKS:
        return True
    return carries_text(block)


def _message_carries_content(obj: Mapping[str, Any]) -> bool:
    message = obj.get("message")
    return isinstance(message, dict) and bool(message.get("content"))


class MessagesStream(StreamState):
    """Classifies one Messages stream and tracks its end marker."""

    __slots__ = ()

    def worth_a_look(self, raw: bytes) -> bool:
        return raw.find(b"error") >= 0 or raw.find(b"message_stop") >= 0  # `find` beats `in` on bytes

    def _classify(self, event: SseEvent) -> Classification:
        if event.comment_only:
            return _KEEPALIVE
        data = event.data
        if data is None:
            if event.event == "error":
                return Classification(FrameKind.FAILURE, "error", ErrorInfo(event_type="error"))
            if event.event == "ping":
                return _PING
            # the SDK skips events without data
            return Classification(FrameKind.LIFECYCLE, event.event) if event.event else _KEEPALIVE
        if data.startswith("[DONE]"):
            return self._done()  # not sent by Anthropic, but a gateway may append it
        obj = event.json()
        etype = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(etype, str):
            etype = event.event
        if event.event == "error" or etype == "error":
            info = error_info(obj, event_type="error") or ErrorInfo(
                message=data[:MESSAGE_LIMIT], event_type="error"
            )
            return Classification(FrameKind.FAILURE, "error", info)
        if not isinstance(obj, dict):
            return Classification(FrameKind.OUTPUT, etype or "unknown")
        if etype == "ping":
            return _PING
        if etype == "content_block_delta":
            return _BLOCK_DELTA
        if etype == "content_block_start":
            if _block_carries_content(obj.get("content_block")):
                return Classification(FrameKind.OUTPUT, etype)
            return Classification(FrameKind.LIFECYCLE, etype)
        if etype == "content_block_stop":
            return _BLOCK_STOP
        if etype == "message_start":
            kind = FrameKind.OUTPUT if _message_carries_content(obj) else FrameKind.LIFECYCLE
            return Classification(kind, etype)
        if etype == "message_delta":
            return _MESSAGE_DELTA
        if etype == "message_stop":
            self._complete = True
            return _MESSAGE_STOP
        kind_name = "bare_json" if event.bare_json else (etype or "unknown")
        found = error_info(obj, event_type=kind_name)
        if found is not None:
            # an error object without the error type (a gateway's or a bare body)
            return Classification(FrameKind.FAILURE, kind_name, found)
        return Classification(FrameKind.OUTPUT, kind_name)


class AnthropicMessages:
    name = NAME
    comment = staticmethod(sse_comment)

    def stream_classifier(self, usage_expected: bool = False) -> MessagesStream:
        return MessagesStream()

    def body_error(self, body: Any) -> ErrorInfo | None:
        if not isinstance(body, dict):
            return None
        return error_info(body, event_type="body")

    def error_event(self, message: str, code: str, error_type: str | None = None) -> bytes:
        """Switchyard's own errors are `api_error`: a type the SDK knows and every
        retry policy retries.

        The code is left out: the SDK reads only `error.type`, `message` and
        `details` (a typed union with no slot for a free code), and Anthropic's
        own error objects never carry one.
        """
        return b"event: error\ndata: " + self.error_body(message, code, error_type) + b"\n\n"

    def error_body(self, message: str, code: str, error_type: str | None = None) -> bytes:
        error = {"type": error_type or "api_error", "message": message}
        return json.dumps({"type": "error", "error": error}).encode()
