"""Google Gemini answers: its `GenerateContentResponse` frames read and written.

Read: candidate 0's parts (text; text with `thought: true` as reasoning; a
`functionCall`, which arrives whole, as a tool call's start, all its arguments
in one piece and its end), its `finishReason` (the end of the answer: Gemini has
no other end marker) and `usageMetadata`.  Other candidates, inline data, code
execution parts and thought signatures have no counterpart and are dropped.

Written: one frame per text or reasoning delta, one per finished tool call (its
arguments must be whole: Gemini's `args` is an object), and a last frame with an
empty text part, the `finishReason` and the `usageMetadata`, as Gemini ends its
own streams (provider-sse-shapes §4.1); every frame carries `modelVersion` and
`responseId`, is one `data:` line written as Gemini writes JSON (a space after
each colon, none after commas) and ends with CRLF CRLF.  A function call carries
the thought signature Google documents for calls another model made
(`skip_thought_signature_validator`): when the client sends it back to a
Gemini 3 model, that model demands a signature on every call of the turn.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from . import ir
from .base import Decoder, Encoder

NAME = "google-gemini"
FOREIGN_CALL_SIGNATURE = "skip_thought_signature_validator"

_FINISH_IN = {"STOP": ir.Finish.STOP, "MAX_TOKENS": ir.Finish.LENGTH}
_FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
                       "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION"})
_FINISH_OUT = {ir.Finish.STOP: "STOP", ir.Finish.TOOL_CALLS: "STOP", ir.Finish.LENGTH: "MAX_TOKENS",
               ir.Finish.CONTENT_FILTER: "SAFETY"}
_PART_KEYS = frozenset({"text", "thought", "thoughtSignature", "functionCall"})


def dumps(obj: Any) -> bytes:
    """JSON as Gemini writes it."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ": ")).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ": ")).encode()


def finish_in(reason: str) -> ir.Finish:
    if reason in _FILTERED:
        return ir.Finish.CONTENT_FILTER
    return _FINISH_IN.get(reason, ir.Finish.STOP)


def usage_in(obj: Any) -> ir.Usage | None:
    if not isinstance(obj, dict):
        return None
    thoughts = ir.as_int(obj.get("thoughtsTokenCount"))
    return ir.Usage(input_tokens=ir.as_int(obj.get("promptTokenCount")) + ir.as_int(obj.get("toolUsePromptTokenCount")),
                    output_tokens=ir.as_int(obj.get("candidatesTokenCount")) + thoughts,
                    cached_tokens=ir.as_int(obj.get("cachedContentTokenCount")), reasoning_tokens=thoughts)


def usage_out(usage: ir.Usage) -> dict[str, int]:
    out = {"promptTokenCount": usage.input_tokens,
           "candidatesTokenCount": max(usage.output_tokens - usage.reasoning_tokens, 0),
           "totalTokenCount": usage.total_tokens}
    if usage.reasoning_tokens:
        out["thoughtsTokenCount"] = usage.reasoning_tokens
    if usage.cached_tokens:
        out["cachedContentTokenCount"] = usage.cached_tokens
    return out


class _Parts:
    """Reads candidate 0's parts; numbers the function calls, which carry no index."""

    def __init__(self, dropped: set[str]) -> None:
        self.dropped = dropped
        self.calls = 0

    def events(self, frame: dict[str, Any]) -> tuple[list[ir.Event], str | None]:
        """The events of one response (a frame or a whole answer) and its finish reason."""
        candidates = frame.get("candidates")
        if not isinstance(candidates, list):
            return [], None
        out: list[ir.Event] = []
        reason: str | None = None
        for position, candidate in enumerate(candidates):
            if not isinstance(candidate, dict):
                continue
            if candidate.get("index", position) != 0:
                self.dropped.add("candidates after the first")
                continue
            content = candidate.get("content")
            parts = content.get("parts") if isinstance(content, dict) else None
            for part in parts if isinstance(parts, list) else ():
                if isinstance(part, dict):
                    out += self._part(part)
            found = candidate.get("finishReason")
            if isinstance(found, str) and found and found != "FINISH_REASON_UNSPECIFIED":
                reason = found
        return out, reason

    def _part(self, part: dict[str, Any]) -> list[ir.Event]:
        if part.keys() - _PART_KEYS:
            self.dropped.update(f"{key} parts" for key in part.keys() - _PART_KEYS)
        if part.get("thoughtSignature"):
            self.dropped.add("thought signatures")
        call = part.get("functionCall")
        if isinstance(call, dict):
            key = self.calls
            self.calls += 1
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
            out: list[ir.Event] = [ir.ToolStart(key, call_id or "call_" + uuid.uuid4().hex[:24],
                                                str(call.get("name") or ""))]
            args = call.get("args")
            if isinstance(args, dict) and args:
                out.append(ir.ToolArgs(key, json.dumps(args, ensure_ascii=False)))
            return [*out, ir.ToolEnd(key)]
        text = part.get("text")
        if not isinstance(text, str) or not text:
            return []
        return [ir.Reasoning(text) if part.get("thought") is True else ir.Text(text)]


class GeminiDecoder(Decoder):
    api = NAME

    def __init__(self) -> None:
        super().__init__()
        self._parts = _Parts(self.dropped)
        self._started = False
        self._usage: ir.Usage | None = None
        self._ended = False

    def _content(self, obj: dict[str, Any], name: str | None) -> list[ir.Event]:
        if self._ended:
            return []
        out: list[ir.Event] = []
        usage = usage_in(obj.get("usageMetadata"))
        if usage is not None:
            self._usage = usage  # each frame's counts are the answer's so far
        if not self._started:
            self._started = True
            out.append(ir.Start(str(obj.get("responseId") or "") or None, None, usage))
        events, reason = self._parts.events(obj)
        out += events
        if reason is not None:
            self._ended = True
            if self._usage is not None:
                out.append(ir.UsageReport(self._usage))
            out += [ir.Finished(finish_in(reason)), ir.END]
        return out


def whole_events(body: Any, dropped: set[str]) -> list[ir.Event]:
    """A whole answer's events: a `GenerateContentResponse`, or the array of them that
    `streamGenerateContent` sends without `alt=sse`."""
    frames = [frame for frame in (body if isinstance(body, list) else [body]) if isinstance(frame, dict)]
    parts = _Parts(dropped)
    out: list[ir.Event] = [ir.Start(str(frames[0].get("responseId") or "") or None if frames else None)]
    usage: ir.Usage | None = None
    reason: str | None = None
    for frame in frames:
        usage = usage_in(frame.get("usageMetadata")) or usage
        events, found = parts.events(frame)
        out += events
        reason = found or reason
    if usage is not None:
        out.append(ir.UsageReport(usage))
    if reason is not None:
        out.append(ir.Finished(finish_in(reason)))
    return out


def _call_part(call: ir.ToolCall) -> dict[str, Any]:
    return {"functionCall": {"id": call.id, "name": call.name, "args": call.args()},
            "thoughtSignature": FOREIGN_CALL_SIGNATURE}


def _parts_of(answer: ir.Answer) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in answer.blocks:
        if block.call is not None:
            parts.append(_call_part(block.call))
        elif block.kind == "reasoning":
            parts.append({"text": block.text, "thought": True})
        else:
            parts.append({"text": block.text})
    return parts


def whole_body(answer: ir.Answer, model: str) -> dict[str, Any]:
    candidate = {"content": {"parts": _parts_of(answer) or [{"text": ""}], "role": "model"},
                 "finishReason": _FINISH_OUT[answer.final_reason()], "index": 0}
    body: dict[str, Any] = {"candidates": [candidate]}
    if answer.usage is not None:
        body["usageMetadata"] = usage_out(answer.usage)
    return {**body, "modelVersion": model, "responseId": answer.id or "switchyard"}


class GeminiEncoder(Encoder):
    api = NAME

    def __init__(self, model: str, created: int, usage_wanted: bool) -> None:
        super().__init__(model, created, usage_wanted)
        self._tail = b""  # every frame's fields after `candidates`
        self._calls: dict[int, ir.ToolCall] = {}  # calls still streaming their arguments
        self._reason = ir.Finish.STOP

    def start(self, event: ir.Start) -> bytes:
        self.started = True
        self._tail = b',"modelVersion": ' + dumps(self.model) + b',"responseId": ' + dumps(event.id or "switchyard")
        return b""

    def _frame(self, parts: bytes, extra: bytes = b"") -> bytes:
        return (b'data: {"candidates": [{"content": {"parts": [' + parts + b'],"role": "model"}' + extra
                + b',"index": 0}]' + self._tail + b"}\r\n\r\n")

    def text(self, text: str) -> bytes:
        return self._frame(b'{"text": ' + ir.json_str(text) + b"}")

    def reasoning(self, text: str) -> bytes:
        return self._frame(b'{"text": ' + ir.json_str(text) + b',"thought": true}')

    def tool_start(self, key: int, call_id: str, name: str) -> bytes:
        self.calls += 1
        self._calls[key] = ir.ToolCall(call_id, name)
        return b""

    def tool_args(self, key: int, delta: str) -> bytes:
        call = self._calls.get(key)
        if call is not None:
            call.arguments.append(delta)
        return b""

    def tool_end(self, key: int) -> bytes:
        call = self._calls.pop(key, None)
        if call is None:
            return b""
        if call.json_text.strip() and not call.args():
            self.dropped.add("tool call arguments that are no JSON object")
        return self._frame(dumps(_call_part(call)))

    def finish(self, reason: ir.Finish) -> bytes:
        self._reason = reason
        return b"".join(self.tool_end(key) for key in list(self._calls))

    def close(self) -> bytes:
        out = self.finish(self._reason)
        extra = b',"finishReason": "' + _FINISH_OUT[self._reason].encode() + b'"'
        if self.usage is not None:
            self._tail = b',"usageMetadata": ' + dumps(usage_out(self.usage)) + self._tail
        return out + self._frame(b'{"text": ""}', extra)
