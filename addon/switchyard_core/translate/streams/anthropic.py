"""Anthropic Messages answers: its events read, its events written.

Read: `message_start` (id, input usage), text and thinking blocks, `tool_use`
blocks (id, name, `input_json_delta` pieces; an `input` given whole in the start
when no piece follows), `message_delta` (stop reason, usage), `message_stop`.
Nothing else has a counterpart in the other APIs: server tools and their
results, redacted thinking, citations and thinking signatures are dropped.

Written: `message_start`, then per block `content_block_start`, its deltas and
`content_block_stop`, then `message_delta` (stop reason and usage) and
`message_stop`.  A tool block starts at its first argument piece (or its end),
not at its header: Anthropic's clients count a `tool_use` start as the answer
itself, while Chat's and Responses' headers are not yet one.  Reasoning is
never written: a thinking block must carry a signature Anthropic verifies when
the history comes back, and no other API has one (docs/translation.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...sse import compact_json
from . import ir
from .base import Decoder, Encoder

NAME = "anthropic-messages"

_STOP_IN = {"end_turn": ir.Finish.STOP, "stop_sequence": ir.Finish.STOP, "pause_turn": ir.Finish.STOP,
            "tool_use": ir.Finish.TOOL_CALLS, "max_tokens": ir.Finish.LENGTH,
            "model_context_window_exceeded": ir.Finish.LENGTH, "refusal": ir.Finish.CONTENT_FILTER}
_STOP_OUT = {ir.Finish.STOP: "end_turn", ir.Finish.TOOL_CALLS: "tool_use", ir.Finish.LENGTH: "max_tokens",
             ir.Finish.CONTENT_FILTER: "refusal"}
_TOOL_ID = re.compile(r"[^A-Za-z0-9_-]")  # what Anthropic accepts in a tool_use id when it comes back


def usage_in(obj: Any) -> ir.Usage | None:
    """Anthropic counts input without the cache; OpenAI (and `ir.Usage`) with it."""
    if not isinstance(obj, dict):
        return None
    read, written = ir.as_int(obj.get("cache_read_input_tokens")), ir.as_int(obj.get("cache_creation_input_tokens"))
    return ir.Usage(input_tokens=ir.as_int(obj.get("input_tokens")) + read + written,
                    output_tokens=ir.as_int(obj.get("output_tokens")), cached_tokens=read,
                    cache_write_tokens=written)


def usage_out(usage: ir.Usage) -> dict[str, int]:
    fresh = max(usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)
    return {"input_tokens": fresh, "cache_creation_input_tokens": usage.cache_write_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "output_tokens": usage.output_tokens}


def _block_events(index: int, block: dict[str, Any], dropped: set[str]) -> list[ir.Event]:
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if block.get("citations"):
            dropped.add("citations")
        return [ir.Text(text)] if isinstance(text, str) and text else []
    if kind == "thinking":
        thinking = block.get("thinking")
        return [ir.Reasoning(thinking)] if isinstance(thinking, str) and thinking else []
    if kind == "tool_use":
        return [ir.ToolStart(index, str(block.get("id") or f"toolu_{index}"), str(block.get("name") or ""))]
    dropped.add(str(kind))
    return []


class AnthropicDecoder(Decoder):
    api = NAME

    def __init__(self) -> None:
        super().__init__()
        self._tools: dict[int, Any] = {}  # open tool blocks: the input their start gave
        self._streamed: set[int] = set()  # tool blocks whose input came in pieces

    def _content(self, obj: dict[str, Any], name: str | None) -> list[ir.Event]:
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return []
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                return [ir.Text(text)] if isinstance(text, str) and text else []
            if dtype == "input_json_delta":
                piece = delta.get("partial_json")
                index = obj.get("index")
                if not isinstance(piece, str) or not piece or not isinstance(index, int):
                    return []
                self._streamed.add(index)
                return [ir.ToolArgs(index, piece)]
            if dtype == "thinking_delta":
                thinking = delta.get("thinking")
                return [ir.Reasoning(thinking)] if isinstance(thinking, str) and thinking else []
            self.dropped.add({"citations_delta": "citations", "signature_delta": "thinking signatures"}.get(
                str(dtype), f"{dtype} deltas"))
            return []  # a signature: only Anthropic can check it
        if kind == "content_block_start":
            index, block = obj.get("index"), obj.get("content_block")
            if not isinstance(index, int) or not isinstance(block, dict):
                return []
            if block.get("type") == "tool_use":
                self._tools[index] = block.get("input")
            return _block_events(index, block, self.dropped)
        if kind == "content_block_stop":
            index = obj.get("index")
            if not isinstance(index, int) or index not in self._tools:
                return []
            given = self._tools.pop(index)
            out: list[ir.Event] = []
            if index not in self._streamed and isinstance(given, dict) and given:
                out.append(ir.ToolArgs(index, json.dumps(given, ensure_ascii=False)))
            out.append(ir.ToolEnd(index))
            return out
        if kind == "message_delta":
            out = []
            delta = obj.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            usage = usage_in(obj.get("usage"))
            if usage is not None:
                out.append(ir.UsageReport(usage))
            if isinstance(reason, str):
                out.append(ir.Finished(_STOP_IN.get(reason, ir.Finish.STOP)))
            return out
        if kind == "message_start":
            message = obj.get("message")
            message = message if isinstance(message, dict) else {}
            out = [ir.Start(str(message.get("id") or "") or None, None, usage_in(message.get("usage")))]
            for index, block in enumerate(message.get("content") or ()):
                if isinstance(block, dict):
                    out += _block_events(index, block, self.dropped)
            return out
        if kind == "message_stop":
            return [ir.END]
        return []


def whole_events(body: dict[str, Any], dropped: set[str]) -> list[ir.Event]:
    """A whole `message`'s events."""
    out: list[ir.Event] = [ir.Start(str(body.get("id") or "") or None)]
    for index, block in enumerate(body.get("content") or ()):
        if not isinstance(block, dict):
            continue
        out += _block_events(index, block, dropped)
        if block.get("type") == "tool_use":
            given = block.get("input")
            if isinstance(given, dict) and given:
                out.append(ir.ToolArgs(index, json.dumps(given, ensure_ascii=False)))
    usage = usage_in(body.get("usage"))
    if usage is not None:
        out.append(ir.UsageReport(usage))
    reason = body.get("stop_reason")
    if isinstance(reason, str):
        out.append(ir.Finished(_STOP_IN.get(reason, ir.Finish.STOP)))
    return out


def tool_id(call_id: str) -> str:
    """A tool call's id as Anthropic takes it back in the history (letters, digits, `_`, `-`)."""
    return _TOOL_ID.sub("_", call_id) or "toolu_switchyard"


def whole_body(answer: ir.Answer, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for block in answer.blocks:
        if block.kind == "text":
            content.append({"type": "text", "text": block.text})
        elif block.call is not None:
            content.append({"type": "tool_use", "id": tool_id(block.call.id), "name": block.call.name,
                            "input": block.call.args()})
    return {"id": "msg_" + (answer.id or "switchyard"), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": _STOP_OUT[answer.final_reason()], "stop_sequence": None,
            "usage": usage_out(answer.usage or ir.Usage())}


def _event(name: bytes, data: bytes) -> bytes:
    return b"event: " + name + b"\ndata: " + data + b"\n\n"


class AnthropicEncoder(Encoder):
    api = NAME
    drops_reasoning = True

    def __init__(self, model: str, created: int, usage_wanted: bool) -> None:
        super().__init__(model, created, usage_wanted)
        self._index = -1  # the client's index of the open block; -1: none
        self._open: str | None = None  # "text", or "tool" and `_tool`
        self._tool: int | None = None
        self._pending: dict[int, tuple[str, str]] = {}  # tool calls whose block has not started yet
        self._reason = ir.Finish.STOP

    def start(self, event: ir.Start) -> bytes:
        self.started = True
        message: dict[str, Any] = {"id": "msg_" + (event.id or "switchyard"), "type": "message", "role": "assistant",
                   "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": usage_out(self.usage or ir.Usage())}
        return _event(b"message_start", b'{"type":"message_start","message":' + compact_json(message) + b"}")

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = self._tool = None
        return _event(b"content_block_stop", b'{"type":"content_block_stop","index":' + str(self._index).encode()
                      + b"}")

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._index += 1
        self._open = kind
        return out + _event(b"content_block_start", b'{"type":"content_block_start","index":'
                            + str(self._index).encode() + b',"content_block":' + compact_json(block) + b"}")

    def text(self, text: str) -> bytes:
        out = b"" if self._open == "text" else self._open_block("text", {"type": "text", "text": ""})
        return out + _event(b"content_block_delta", b'{"type":"content_block_delta","index":'
                            + str(self._index).encode() + b',"delta":{"type":"text_delta","text":'
                            + ir.json_str(text) + b"}}")

    def reasoning(self, text: str) -> bytes:
        return b""

    def tool_start(self, key: int, call_id: str, name: str) -> bytes:
        self.calls += 1
        self._pending[key] = (call_id, name)
        return b""

    def _tool_block(self, key: int) -> bytes:
        """Open `key`'s block; calls begun before it that have had no argument yet are
        written first, as calls without arguments: blocks go in the order calls began."""
        out = b""
        for earlier in list(self._pending):
            if earlier == key:
                break
            out += self._tool_block(earlier)
        call_id, name = self._pending.pop(key)
        out += self._open_block("tool", {"type": "tool_use", "id": tool_id(call_id), "name": name, "input": {}})
        self._tool = key
        return out

    def tool_args(self, key: int, delta: str) -> bytes:
        out = self._tool_block(key) if key in self._pending else b""
        if self._tool != key:
            self.dropped.add("arguments of a tool call after the next one began")  # blocks never interleave
            return out
        return out + _event(b"content_block_delta", b'{"type":"content_block_delta","index":'
                            + str(self._index).encode() + b',"delta":{"type":"input_json_delta","partial_json":'
                            + ir.json_str(delta) + b"}}")

    def no_arguments(self, key: int) -> bytes:
        """A block closed before any piece came has its `input` already: the start's `{}`."""
        return self.tool_args(key, "{}") if key in self._pending or self._tool == key else b""

    def tool_end(self, key: int) -> bytes:
        out = self._tool_block(key) if key in self._pending else b""
        return out + self._close_block() if self._tool == key else out

    def finish(self, reason: ir.Finish) -> bytes:
        self._reason = reason
        out = b"".join(self.tool_end(key) for key in list(self._pending))
        return out + self._close_block()

    def close(self) -> bytes:
        out = self.finish(self._reason)
        usage = usage_out(self.usage or ir.Usage())
        delta = {"type": "message_delta", "delta": {"stop_reason": _STOP_OUT[self._reason], "stop_sequence": None},
                 "usage": usage}
        return (out + _event(b"message_delta", compact_json(delta))
                + _event(b"message_stop", b'{"type":"message_stop"}'))
