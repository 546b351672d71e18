"""OpenAI Chat Completions (`/chat/completions`) and its compatibles.

Answer content is anything a client would render or act on: text, refusal,
reasoning, tool-call arguments, a legacy function call, a finish reason.
Role-only chunks, tool-call headers with empty arguments, Azure's
prompt-filter chunk and usage-only chunks are lifecycle.  Anything else in a
delta fails closed as output.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping

from ..sse import SseEvent
from .base import Classification, ErrorInfo, FrameKind, StreamState, sse_comment
from .errors import MESSAGE_LIMIT, error_info, openai_error_body

NAME = "openai-chat"

_KEEPALIVE = Classification(FrameKind.KEEPALIVE)
_LIFECYCLE = Classification(FrameKind.LIFECYCLE, "chunk")
_OUTPUT = Classification(FrameKind.OUTPUT, "chunk")
_FINISH = Classification(FrameKind.OUTPUT, "finish")
_UNKNOWN = Classification(FrameKind.OUTPUT, "unknown")

# a finish_reason with a value (not null): the only chunks after output that matter besides errors
_FINISH_SET = re.compile(rb'"finish_reason"\s*:\s*"')
_OTHER_CHOICE = re.compile(rb'"index"\s*:\s*[1-9]')

# finish reasons that report a failure instead of an end
_FAILED_FINISH = frozenset({"error", "insufficient_system_resource"})


def _failed_finish(choice: dict[str, Any]) -> bool:
    reason = choice.get("finish_reason")
    return isinstance(reason, str) and reason in _FAILED_FINISH  # any JSON may come: an object is not hashable


def _tool_calls_carry_output(calls: Any) -> bool:
    if not isinstance(calls, list):
        return bool(calls)
    for call in calls:
        if not isinstance(call, dict):
            return True
        function = call.get("function")
        if isinstance(function, dict) and function.get("arguments"):
            return True
        for key, value in call.items():
            if key not in ("index", "id", "type", "function") and value:
                return True
    return False


def _delta_carries_output(delta: Any) -> bool:
    if not isinstance(delta, dict):
        return bool(delta)
    for key, value in delta.items():
        if key == "role" or not value:
            continue  # empty content, null refusal, "" reasoning_content ...
        if key == "tool_calls":
            if _tool_calls_carry_output(value):
                return True
            continue
        return True  # content, refusal, reasoning, function_call, audio, anything new
    return False


def _choice_error(choice: Mapping[str, Any], top: Mapping[str, Any]) -> ErrorInfo:
    found = error_info(choice) or error_info(top)
    reason = choice.get("finish_reason")
    if found is not None:
        # the finish reason vouches for "transient" only when the error gives
        # no status of its own: a 400 beside it stays fatal (DESIGN §3)
        return replace(found, event_type="finish_reason", retryable_hint=found.status is None)
    if reason == "insufficient_system_resource":
        return ErrorInfo(
            code="insufficient_system_resource",
            message="finish_reason insufficient_system_resource",
            event_type="finish_reason",
        )
    return ErrorInfo(message="finish_reason error", event_type="finish_reason", retryable_hint=True)


class ChatStream(StreamState):
    """Classifies one Chat Completions stream and tracks its end marker: `[DONE]`,
    or a finish reason on every choice seen, and then the usage chunk if the client
    asked for one (`stream_options.include_usage`): a stream cut before it would
    lose the client's token count without a word."""

    __slots__ = ("_choices", "_finished", "_usage_expected", "_awaiting_usage")

    def __init__(self, usage_expected: bool = False) -> None:
        super().__init__()
        self._choices: set[int] = set()
        self._finished: set[int] = set()
        self._usage_expected = usage_expected
        self._awaiting_usage = False  # every choice finished; the usage chunk is still to come

    @property
    def complete(self) -> bool:
        if self._complete:
            return True
        return bool(self._choices) and self._choices <= self._finished and not self._awaiting_usage

    def worth_a_look(self, raw: bytes) -> bool:
        if self._awaiting_usage:
            return True  # only the few frames after the last finish reason
        # a choice other than the first must be seen too, or n>1 streams look complete early.
        # Plain content, as providers send it, has every finish_reason null and every
        # index 0: counting those is cheaper than searching for the rest (the hot path;
        # `find` too beats `in`), and anything else, spaced JSON included, gets a look
        find, count = raw.find, raw.count
        if find(b"error") >= 0 or find(b"[DONE]") >= 0:
            return True
        return ((count(b'"finish_reason"') != count(b'"finish_reason":null') and _FINISH_SET.search(raw) is not None)
                or (count(b'"index"') != count(b'"index":0') and _OTHER_CHOICE.search(raw) is not None))

    def _classify(self, event: SseEvent) -> Classification:
        if event.comment_only:
            return _KEEPALIVE
        data = event.data
        if data is None:
            return _LIFECYCLE if event.event else _KEEPALIVE
        if data.startswith("[DONE]"):
            return self._done()
        obj = event.json()
        if event.event == "error":
            info = error_info(obj, event_type="error") or ErrorInfo(
                message=data[:MESSAGE_LIMIT], event_type="error"
            )
            return Classification(FrameKind.FAILURE, "error", info)
        if not isinstance(obj, dict):
            return _UNKNOWN
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and _failed_finish(choice):
                    if choice.get("finish_reason") == "error" or not self._seen_output:
                        return Classification(
                            FrameKind.FAILURE, "finish_reason", _choice_error(choice, obj)
                        )
        found = error_info(obj, event_type="bare_json" if event.bare_json else "chunk")
        if found is not None:
            return Classification(FrameKind.FAILURE, found.event_type, found)
        if self._usage_expected and isinstance(obj.get("usage"), dict):
            self._usage_expected = self._awaiting_usage = False  # it came (alone, or beside a finish)
        if choices is None:
            return _LIFECYCLE if "usage" in obj or "prompt_filter_results" in obj else _UNKNOWN
        if not isinstance(choices, list):
            return _UNKNOWN
        result = _LIFECYCLE
        for choice in choices:
            if not isinstance(choice, dict):
                return _UNKNOWN
            index = choice.get("index", 0)
            index = index if isinstance(index, int) else 0
            self._choices.add(index)
            if choice.get("finish_reason"):
                self._finished.add(index)
                result = _FINISH
                if self._usage_expected and self._choices <= self._finished:
                    self._awaiting_usage = True
            elif _delta_carries_output(choice.get("delta")) and result is _LIFECYCLE:
                result = _OUTPUT
        return result


class OpenAIChat:
    name = NAME
    comment = staticmethod(sse_comment)

    def stream_classifier(self, usage_expected: bool = False) -> ChatStream:
        return ChatStream(usage_expected)

    def body_error(self, body: Any) -> ErrorInfo | None:
        if not isinstance(body, dict):
            return None
        found = error_info(body, event_type="body")
        if found is not None:
            return found
        choices = body.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and _failed_finish(choice):
                    message = choice.get("message")
                    if isinstance(message, dict) and message.get("content"):
                        continue
                    return _choice_error(choice, body)
        return None

    def error_event(self, message: str, code: str, error_type: str | None = None) -> bytes:
        return b"data: " + self.error_body(message, code, error_type) + b"\n\n"

    def error_body(self, message: str, code: str, error_type: str | None = None) -> bytes:
        return openai_error_body(message, code, error_type)
