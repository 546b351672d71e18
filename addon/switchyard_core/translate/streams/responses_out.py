"""OpenAI Responses answers, written: its stream events and a whole response.

The stream is the one OpenAI sends: `response.created` and
`response.in_progress`; per message `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta`s, then
`response.output_text.done`, `response.content_part.done` and
`response.output_item.done` (Codex keeps the finished items from these); per
function call `response.output_item.added`, `response.function_call_arguments.delta`s,
`response.function_call_arguments.done` and `response.output_item.done`; and
`response.completed` (or `response.incomplete` for a length limit or a filter)
carrying the whole response: its output items and its usage.  Every event has
the next `sequence_number`.

Reasoning is never written: a reasoning item goes back in the next request's
input, where OpenAI looks up its id or decrypts its `encrypted_content`, and
one made from another API's reasoning has neither (docs/translation.md).
"""

from __future__ import annotations

from typing import Any

from ...sse import compact_json
from . import ir
from .base import Encoder

NAME = "openai-responses"


def usage_out(usage: ir.Usage) -> dict[str, Any]:
    return {"input_tokens": usage.input_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                                                    "cache_write_tokens": usage.cache_write_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total_tokens}


def response_object(rid: str, created: int, model: str, status: str, output: list[dict[str, Any]],
                    usage: ir.Usage | None, reason: ir.Finish | None = None) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens" if reason is ir.Finish.LENGTH else "content_filter"}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": incomplete if status == "incomplete" else None, "instructions": None,
            "model": model, "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": usage_out(usage) if usage is not None else None, "metadata": {}}


def _status(reason: ir.Finish) -> str:
    return "incomplete" if reason in (ir.Finish.LENGTH, ir.Finish.CONTENT_FILTER) else "completed"


def _message(item_id: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]
    return {"id": item_id, "type": "message", "status": "in_progress" if text is None else "completed",
            "content": content, "role": "assistant"}


def _call(item_id: str, call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": "in_progress" if arguments is None else "completed",
            "arguments": arguments or "", "call_id": call_id, "name": name}


def whole_body(answer: ir.Answer, model: str, created: int) -> dict[str, Any]:
    base = answer.id or "switchyard"
    output = []
    for index, block in enumerate(answer.blocks):
        if block.kind == "text":
            output.append(_message(f"msg_{base}_{index}", block.text))
        elif block.call is not None:
            output.append(_call(f"fc_{base}_{index}", block.call.id, block.call.name, block.call.json_text or "{}"))
    reason = answer.final_reason()
    return response_object("resp_" + base, answer.created or created, model, _status(reason), output,
                           answer.usage, reason)


class _Item:
    __slots__ = ("index", "id", "call_id", "name", "parts", "head")

    def __init__(self, index: int, item_id: str, call_id: str = "", name: str = "") -> None:
        self.index = index
        self.id = item_id
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []
        self.head = b""  # a delta event's fields after its sequence number, up to its delta


class ResponsesEncoder(Encoder):
    api = NAME
    drops_reasoning = True

    def __init__(self, model: str, created: int, usage_wanted: bool) -> None:
        super().__init__(model, created, usage_wanted)
        self._seq = 0
        self._id = ""
        self._base = ""
        self._output: list[dict[str, Any]] = []  # finished items, by output index
        self._open: _Item | None = None  # the item being streamed (message or call)
        self._calls: dict[int, _Item] = {}  # upstream key -> its function call item
        self._reason = ir.Finish.STOP

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + compact_json(data) + b"\n\n"

    def start(self, event: ir.Start) -> bytes:
        self.started = True
        self._base = event.id or "switchyard"
        self._id = "resp_" + self._base
        if event.created:
            self.created = event.created
        response = response_object(self._id, self.created, self.model, "in_progress", [], None)
        return (self._event("response.created", {"response": response})
                + self._event("response.in_progress", {"response": response}))

    def _close_open(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = None
        common = {"item_id": item.id, "output_index": item.index}
        if item.call_id:
            arguments = "".join(item.parts) or "{}"  # closed by the next item before any came
            done = _call(item.id, item.call_id, item.name, arguments)
            out = self._event("response.function_call_arguments.done",
                              {**common, "name": item.name, "arguments": arguments})
        else:
            done = _message(item.id, "".join(item.parts))
            out = (self._event("response.output_text.done", {**common, "content_index": 0,
                                                               "text": done["content"][0]["text"], "logprobs": []})
                   + self._event("response.content_part.done", {**common, "content_index": 0,
                                                                 "part": done["content"][0]}))
        self._output.append(done)
        return out + self._event("response.output_item.done", {"output_index": item.index, "item": done})

    def _delta(self, item: _Item, kind: bytes, text: str) -> bytes:
        item.parts.append(text)
        seq = self._seq
        self._seq += 1
        return (b"event: " + kind + b'\ndata: {"type":"' + kind + b'","sequence_number":' + str(seq).encode()
                + item.head + ir.json_str(text) + b"}\n\n")

    def text(self, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.call_id:
            out = self._close_open()
            index = len(self._output)
            item = self._open = _Item(index, f"msg_{self._base}_{index}")
            item.head = (b',"item_id":"' + item.id.encode() + b'","output_index":' + str(index).encode()
                         + b',"content_index":0,"logprobs":[],"delta":')
            out += self._event("response.output_item.added", {"output_index": index, "item": _message(item.id, None)})
            out += self._event("response.content_part.added",
                               {"item_id": item.id, "output_index": index, "content_index": 0,
                                "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}})
        return out + self._delta(item, b"response.output_text.delta", text)

    def reasoning(self, text: str) -> bytes:
        return b""

    def tool_start(self, key: int, call_id: str, name: str) -> bytes:
        self.calls += 1
        out = self._close_open()
        index = len(self._output)
        item = self._open = self._calls[key] = _Item(index, f"fc_{self._base}_{index}", call_id, name)
        item.head = b',"item_id":"' + item.id.encode() + b'","output_index":' + str(index).encode() + b',"delta":'
        return out + self._event("response.output_item.added",
                                 {"output_index": index, "item": _call(item.id, call_id, name, None)})

    def tool_args(self, key: int, delta: str) -> bytes:
        item = self._calls.get(key)
        if item is None or item is not self._open:
            self.dropped.add("arguments of a tool call after the next item began")
            return b""
        return self._delta(item, b"response.function_call_arguments.delta", delta)

    def tool_end(self, key: int) -> bytes:
        return self._close_open() if self._calls.get(key) is self._open else b""

    def no_arguments(self, key: int) -> bytes:
        return self.tool_args(key, "{}") if self._calls.get(key) is self._open else b""

    def finish(self, reason: ir.Finish) -> bytes:
        self._reason = reason
        return self._close_open()

    def close(self) -> bytes:
        out = self._close_open()
        status = _status(self._reason)
        response = response_object(self._id, self.created, self.model, status, self._output, self.usage,
                                   self._reason)
        return out + self._event(f"response.{status}", {"response": response})
