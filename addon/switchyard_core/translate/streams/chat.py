"""OpenAI Chat Completions answers: its chunks read, its chunks written.

Read: choice 0's `content`, `refusal` (as text), `reasoning_content` or
`reasoning` (DeepSeek's, vLLM's, OpenRouter's and Ollama's names), tool calls
by their `index` (a header with id and name, then argument pieces), a legacy
`function_call`, the finish reason, and the usage chunk.  Other choices (`n` > 1)
are dropped: every other API answers with one.  The end is `[DONE]`, or the
usage chunk after the finish reason (what `stream_options.include_usage` makes
the last chunk before `[DONE]`).

Written: `chat.completion.chunk`s with a role chunk first (`content` null, as
OpenAI sends it before tool calls and DeepSeek before text), content and
`reasoning_content` deltas, tool calls with their arguments in pieces, the
finish reason on its own chunk, then the usage chunk when the client asked
for it (`stream_options.include_usage`) and `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

from ...sse import compact_json
from . import ir
from .base import Decoder, Encoder

NAME = "openai-chat"

_FINISH_IN = {"stop": ir.Finish.STOP, "length": ir.Finish.LENGTH, "tool_calls": ir.Finish.TOOL_CALLS,
              "function_call": ir.Finish.TOOL_CALLS, "content_filter": ir.Finish.CONTENT_FILTER}
_FINISH_OUT = {reason: reason.value for reason in ir.Finish}
_LEGACY_CALL = -1  # the key of a legacy `function_call`, which has no index


def usage_in(obj: Any) -> ir.Usage | None:
    if not isinstance(obj, dict):
        return None
    prompt = obj.get("prompt_tokens_details")
    completion = obj.get("completion_tokens_details")
    return ir.Usage(
        input_tokens=ir.as_int(obj.get("prompt_tokens")),
        output_tokens=ir.as_int(obj.get("completion_tokens")),
        cached_tokens=ir.as_int(prompt.get("cached_tokens")) if isinstance(prompt, dict) else 0,
        cache_write_tokens=ir.as_int(prompt.get("cache_write_tokens")) if isinstance(prompt, dict) else 0,
        reasoning_tokens=ir.as_int(completion.get("reasoning_tokens")) if isinstance(completion, dict) else 0,
    )


def usage_out(usage: ir.Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens,
                                      "cache_write_tokens": usage.cache_write_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}


def message_events(message: dict[str, Any], dropped: set[str], started: set[int]) -> list[ir.Event]:
    """The events of a message (a whole answer's) or a delta (a chunk's); `started`:
    the keys of the tool calls begun (some servers repeat a call's id on every chunk)."""
    out: list[ir.Event] = []
    for field in ("reasoning_content", "reasoning"):
        value = message.get(field)
        if isinstance(value, str) and value:
            out.append(ir.Reasoning(value))
            break
    for field in ("content", "refusal"):
        value = message.get(field)
        if isinstance(value, str) and value:
            out.append(ir.Text(value))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for position, call in enumerate(calls):
            if not isinstance(call, dict):
                continue
            index = call.get("index", position)
            key = index if isinstance(index, int) else position
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            if key not in started and (call.get("id") or function.get("name")):
                started.add(key)
                out.append(ir.ToolStart(key, str(call.get("id") or f"call_{key}"), str(function.get("name") or "")))
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(ir.ToolArgs(key, arguments))
            if call.get("type") not in (None, "function"):
                dropped.add(f"tool call of type {call.get('type')}")
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        if legacy.get("name") and _LEGACY_CALL not in started:
            started.add(_LEGACY_CALL)
            out.append(ir.ToolStart(_LEGACY_CALL, "call_function", str(legacy["name"])))
        if isinstance(legacy.get("arguments"), str) and legacy["arguments"]:
            out.append(ir.ToolArgs(_LEGACY_CALL, legacy["arguments"]))
    return out


class ChatDecoder(Decoder):
    api = NAME

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._finished = False
        self._calls: set[int] = set()

    def _content(self, obj: dict[str, Any], name: str | None) -> list[ir.Event]:
        out: list[ir.Event] = []
        if not self._started and obj.get("choices") is not None and obj.get("id"):
            self._started = True  # not Azure's prompt-filter chunk, whose id is ""
            created = obj.get("created")
            out.append(ir.Start(str(obj["id"]), created if isinstance(created, int) and created else None))
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.dropped.add("choices after the first")
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                out += message_events(delta, self.dropped, self._calls)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finished = True
                out.append(ir.Finished(_FINISH_IN.get(reason, ir.Finish.STOP)))
        usage = usage_in(obj.get("usage"))
        if usage is not None:
            out.append(ir.UsageReport(usage))
            if self._finished:
                out.append(ir.END)  # the last chunk before [DONE]: nothing after it matters
        return out


def whole_events(body: dict[str, Any], dropped: set[str]) -> list[ir.Event]:
    """A whole `chat.completion`'s events."""
    created = body.get("created")
    out: list[ir.Event] = [ir.Start(str(body.get("id") or "") or None,
                                    created if isinstance(created, int) else None)]
    for choice in body.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            dropped.add("choices after the first")
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            out += message_events(message, dropped, set())
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            out.append(ir.Finished(_FINISH_IN.get(reason, ir.Finish.STOP)))
    usage = usage_in(body.get("usage"))
    if usage is not None:
        out.append(ir.UsageReport(usage))
    return out


def whole_body(answer: ir.Answer, model: str, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or None, "refusal": None}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.calls:
        message["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.json_text or "{}"}}
                                 for call in answer.calls]
    body: dict[str, Any] = {
        "id": "chatcmpl-" + (answer.id or "switchyard"), "object": "chat.completion",
        "created": answer.created or created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": _FINISH_OUT[answer.final_reason()]}],
    }
    if answer.usage is not None:
        body["usage"] = usage_out(answer.usage)
    return body


class ChatEncoder(Encoder):
    api = NAME

    def __init__(self, model: str, created: int, usage_wanted: bool) -> None:
        super().__init__(model, created, usage_wanted)
        self._head = b""  # every chunk's fields before `choices`
        self._calls: dict[int, int] = {}  # upstream key -> the client's tool_calls index
        self._finished = False

    def start(self, event: ir.Start) -> bytes:
        self.started = True
        head = {"id": "chatcmpl-" + (event.id or "switchyard"), "object": "chat.completion.chunk",
                "created": event.created or self.created, "model": self.model}
        self._head = b'data: ' + compact_json(head)[:-1] + b',"choices":['
        return self._chunk(b'{"role":"assistant","content":null}')

    def _chunk(self, delta: bytes, finish: bytes = b"null") -> bytes:
        return (self._head + b'{"index":0,"delta":' + delta + b',"logprobs":null,"finish_reason":' + finish
                + b"}]}\n\n")

    def text(self, text: str) -> bytes:
        return self._chunk(b'{"content":' + ir.json_str(text) + b"}")

    def reasoning(self, text: str) -> bytes:
        return self._chunk(b'{"reasoning_content":' + ir.json_str(text) + b"}")

    def tool_start(self, key: int, call_id: str, name: str) -> bytes:
        index = self._calls[key] = len(self._calls)
        self.calls += 1
        call = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        return self._chunk(b'{"tool_calls":[' + compact_json(call) + b"]}")

    def tool_args(self, key: int, delta: str) -> bytes:
        index = self._calls.get(key)
        if index is None:
            return b""
        return self._chunk(b'{"tool_calls":[{"index":' + str(index).encode() + b',"function":{"arguments":'
                           + ir.json_str(delta) + b"}}]}")

    def tool_end(self, key: int) -> bytes:
        return b""

    def finish(self, reason: ir.Finish) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        return self._chunk(b"{}", b'"' + _FINISH_OUT[reason].encode() + b'"')

    def close(self) -> bytes:
        out = b"" if self._finished else self.finish(ir.Finish.TOOL_CALLS if self.calls else ir.Finish.STOP)
        if self.usage_wanted and self.usage is not None:
            out += self._head + b"]," + b'"usage":' + compact_json(usage_out(self.usage)) + b"}\n\n"
        return out + b"data: [DONE]\n\n"
