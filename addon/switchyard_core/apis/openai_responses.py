"""OpenAI Responses (`/responses`) streams.

Answer content is any `*.delta` with a non-empty delta, an added or finished
item or part that already carries text, arguments or input, and the events
that add to an answer (annotations, partial images).  Response state events,
items and parts that are still empty, and server-side tool progress are
lifecycle.  `response.completed` / `response.incomplete` end the stream
cleanly; `error` and `response.failed` report failures.  The event type is
read from data's "type" (what openai-python dispatches on) and, when a gateway
stripped it or sent data-only frames, from the `event:` line; either one
saying `error` is enough.  Anything not recognised fails closed as output.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Mapping

from ..sse import SseEvent
from .base import carries_text, Classification, ErrorInfo, FrameKind, StreamState, sse_comment
from .errors import MESSAGE_LIMIT, error_info, openai_error_body

NAME = "openai-responses"

_KEEPALIVE = Classification(FrameKind.KEEPALIVE)

# Response state: nothing a client renders or acts on.
_STATE_EVENTS = frozenset(
    {"response.created", "response.in_progress", "response.queued", "response.metadata"}
)
_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})
_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})
_PART_EVENTS = frozenset(
    {
        "response.content_part.added",
        "response.content_part.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
    }
)
# Events that add to an answer without a `delta` field.
_CONTENT_EVENTS = frozenset(
    {"response.output_text.annotation.added", "response.image_generation_call.partial_image"}
)
# Server-side tool runs: progress only, redone on a retry.
_TOOL_PREFIXES = (
    "response.web_search_call.",
    "response.file_search_call.",
    "response.mcp_list_tools.",
    "response.mcp_call.",
    "response.image_generation_call.",
    "response.code_interpreter_call.",
)
_PROGRESS_SUFFIXES = (".in_progress", ".searching", ".generating", ".interpreting")

# For the item types the Responses API defines, only these fields hold content:
# a function call's name and call_id are a header, like Chat's tool-call header,
# and a reasoning item's encrypted_content is opaque state, not an answer.
_ITEM_CONTENT_FIELDS: dict[str, tuple[str, ...]] = {
    "message": ("content",),
    "reasoning": ("summary", "content"),
    "function_call": ("arguments",),
    "custom_tool_call": ("input",),
}
# Identity and status fields of items of other types.
_ITEM_META = frozenset({"id", "type", "status", "role", "call_id", "name", "server_label"})
# Addressing fields of `*.done` events; everything else is payload.
_EVENT_META = frozenset(
    {
        "type",
        "sequence_number",
        "item_id",
        "output_index",
        "content_index",
        "summary_index",
        "response_id",
        "logprobs",
        "obfuscation",
    }
)

# The ChatGPT backend Codex talks to occasionally streams its overload notice as the answer.
OVERLOAD_OUTPUT_TEXT = "Our servers are currently overloaded. Please try again later."


def _item_carries_content(item: Any) -> bool:
    if not isinstance(item, dict):
        return bool(item)
    fields = _ITEM_CONTENT_FIELDS.get(str(item.get("type")))
    if fields is not None:
        return any(carries_text(item.get(name)) for name in fields)
    return any(carries_text(v) for k, v in item.items() if k not in _ITEM_META)


def _payload_carries_content(obj: Mapping[str, Any]) -> bool:
    return any(carries_text(v) for k, v in obj.items() if k not in _EVENT_META)


def _event_type(event: SseEvent, obj: Any) -> str | None:
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        return str(obj["type"])
    return event.event


def failed_info(obj: Any, *, event_type: str = "response.failed") -> ErrorInfo:
    """The error of a `response.failed` event or a failed response object.

    Reads `response.error`, then a non-standard top-level `error`, then a
    top-level `message` (gateways send all three).  A failed response is the server's own
    statement that generation failed, so with no code or type it is a hint of a
    transient failure, as Chat's `finish_reason: "error"` is.
    """
    found: ErrorInfo | None = None
    top_message = ""
    if isinstance(obj, dict):
        response = obj.get("response")
        if isinstance(response, dict):
            found = error_info({"error": response.get("error")})
        if found is None:
            found = error_info({"error": obj.get("error")})
        message = obj.get("message")
        if isinstance(message, str):
            top_message = message[:MESSAGE_LIMIT]
    if found is None:
        return ErrorInfo(
            message=top_message or event_type, event_type=event_type, retryable_hint=True
        )
    return replace(found, message=found.message or top_message, event_type=event_type, retryable_hint=True)


class ResponsesStream(StreamState):
    """Classifies one Responses stream and tracks its end marker."""

    __slots__ = ()

    def worth_a_look(self, raw: bytes) -> bool:
        find = raw.find  # `find` beats `in` on bytes
        return (find(b"error") >= 0 or find(b"failed") >= 0 or find(b"response.completed") >= 0
                or find(b"response.incomplete") >= 0 or find(b"[DONE]") >= 0)

    def _classify(self, event: SseEvent) -> Classification:
        if event.comment_only:
            return _KEEPALIVE
        data = event.data
        if data is None:
            if event.event == "error":
                return Classification(FrameKind.FAILURE, "error", ErrorInfo(event_type="error"))
            if event.event == "response.failed":
                self._complete = True
                return Classification(FrameKind.FAILURE, event.event, failed_info(None))
            return Classification(FrameKind.LIFECYCLE, event.event) if event.event else _KEEPALIVE
        if data.startswith("[DONE]"):
            return self._done()  # not sent by OpenAI here, but some gateways append it
        obj = event.json()
        etype = _event_type(event, obj)
        if event.event == "error" or etype == "error":
            info = error_info(obj, event_type="error") or ErrorInfo(
                message=data[:MESSAGE_LIMIT], event_type="error"
            )
            return Classification(FrameKind.FAILURE, "error", info)
        if etype == "response.failed" or event.event == "response.failed":
            self._complete = True
            return Classification(FrameKind.FAILURE, "response.failed", failed_info(obj))
        if not isinstance(obj, dict):
            return Classification(FrameKind.OUTPUT, etype or "unknown")
        if obj.get("error"):
            # openai-python raises on a truthy top-level "error" in any frame
            kind = "bare_json" if event.bare_json else (etype or "unknown")
            info = error_info(obj, event_type=kind) or ErrorInfo(event_type=kind)
            return Classification(FrameKind.FAILURE, kind, info)
        if etype is None:
            return Classification(FrameKind.OUTPUT, "unknown")
        return self._classify_typed(etype, obj)

    def _classify_typed(self, etype: str, obj: Mapping[str, Any]) -> Classification:
        if etype in _TERMINAL_EVENTS:
            self._complete = True
            return Classification(FrameKind.TERMINAL, etype)
        if etype in _STATE_EVENTS:
            return Classification(FrameKind.LIFECYCLE, etype)
        if etype.endswith(".delta"):
            delta = obj.get("delta")
            if not delta:
                return Classification(FrameKind.LIFECYCLE, etype)
            if (
                etype == "response.output_text.delta"
                and not self._seen_output
                and isinstance(delta, str)
                and delta.strip() == OVERLOAD_OUTPUT_TEXT
            ):
                info = ErrorInfo(
                    code="server_is_overloaded", message=OVERLOAD_OUTPUT_TEXT, event_type=etype
                )
                return Classification(FrameKind.FAILURE, etype, info)
            return Classification(FrameKind.OUTPUT, etype)
        if etype in _ITEM_EVENTS:
            kind = FrameKind.OUTPUT if _item_carries_content(obj.get("item")) else FrameKind.LIFECYCLE
            return Classification(kind, etype)
        if etype in _PART_EVENTS:
            kind = FrameKind.OUTPUT if carries_text(obj.get("part")) else FrameKind.LIFECYCLE
            return Classification(kind, etype)
        if etype in _CONTENT_EVENTS:
            return Classification(FrameKind.OUTPUT, etype)
        if etype.startswith(_TOOL_PREFIXES) or etype.endswith(_PROGRESS_SUFFIXES):
            return Classification(FrameKind.LIFECYCLE, etype)
        if etype.endswith(".done"):
            # repeats what deltas sent; content only if no delta carried it
            kind = FrameKind.OUTPUT if _payload_carries_content(obj) else FrameKind.LIFECYCLE
            return Classification(kind, etype)
        return Classification(FrameKind.OUTPUT, etype)


def error_event_payload(message: str, code: str, error_type: str | None = None) -> bytes:
    """An `error` event's JSON: flat spec fields for the Node SDK and typed clients,
    plus a nested `error` so openai-python (which raises only on a truthy `error`
    key) raises too.  The same over SSE and over WebSocket."""
    payload = {
        "type": "error",
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": 0,
        "error": {"type": error_type or "server_error", "code": code, "message": message, "param": None},
    }
    return json.dumps(payload).encode()


def websocket_error(status: int, body: bytes) -> bytes:
    """An HTTP error answer as the `error` message a Responses WebSocket server sends
    for it: `{"type": "error", "status": 429, "error": {...}}`, the HTTP body's error
    object beside the status (what Codex reads as that HTTP error)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        obj = None
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict):
        error = {"type": "server_error" if status >= 500 else "invalid_request_error", "code": None,
                 "message": body.decode("utf-8", "replace")[:1000] or f"HTTP {status}"}
    return json.dumps({"type": "error", "status": status, "error": error}).encode()


class OpenAIResponses:
    name = NAME
    comment = staticmethod(sse_comment)

    def stream_classifier(self, usage_expected: bool = False) -> ResponsesStream:
        return ResponsesStream()

    def body_error(self, body: Any) -> ErrorInfo | None:
        if not isinstance(body, dict):
            return None
        if body.get("status") == "failed":
            return failed_info({"response": body}, event_type="body")
        return error_info(body, event_type="body")

    def error_event(self, message: str, code: str, error_type: str | None = None) -> bytes:
        return b"event: error\ndata: " + error_event_payload(message, code, error_type) + b"\n\n"

    def error_body(self, message: str, code: str, error_type: str | None = None) -> bytes:
        return openai_error_body(message, code, error_type)
