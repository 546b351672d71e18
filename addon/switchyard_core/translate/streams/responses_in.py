"""OpenAI Responses answers, read: its stream events and a whole response.

Read: `response.created` (id, `created_at`), text (`output_text` deltas,
refusals as text), reasoning (`reasoning_summary_text` and `reasoning_text`
deltas), `function_call` items (`call_id`, name, argument deltas; an item's
`*.done` supplies what no delta did), and the end: `response.completed`, or
`response.incomplete` (its reason: `max_output_tokens` is the length limit, any
other a filter), each with its usage.  Server-side tools (web search, file
search, code interpreter, MCP, image generation), custom tool calls and
annotations have no counterpart in the other APIs and are dropped.
"""

from __future__ import annotations

from typing import Any

from . import ir
from .base import Decoder

NAME = "openai-responses"

_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
_STARTS = frozenset({"response.created", "response.in_progress", "response.queued"})
_ENDS = frozenset({"response.completed", "response.incomplete"})
_KNOWN_ITEMS = frozenset({"message", "function_call", "reasoning"})


def usage_in(obj: Any) -> ir.Usage | None:
    if not isinstance(obj, dict):
        return None
    given = obj.get("input_tokens_details")
    taken = obj.get("output_tokens_details")
    return ir.Usage(
        input_tokens=ir.as_int(obj.get("input_tokens")), output_tokens=ir.as_int(obj.get("output_tokens")),
        cached_tokens=ir.as_int(given.get("cached_tokens")) if isinstance(given, dict) else 0,
        cache_write_tokens=ir.as_int(given.get("cache_write_tokens")) if isinstance(given, dict) else 0,
        reasoning_tokens=ir.as_int(taken.get("reasoning_tokens")) if isinstance(taken, dict) else 0,
    )


def _ending(response: dict[str, Any]) -> list[ir.Event]:
    out: list[ir.Event] = []
    usage = usage_in(response.get("usage"))
    if usage is not None:
        out.append(ir.UsageReport(usage))
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        out.append(ir.Finished(ir.Finish.LENGTH if reason in ("max_output_tokens", "max_tokens")
                               else ir.Finish.CONTENT_FILTER))
    else:
        out.append(ir.Finished(ir.Finish.STOP))  # tool calls, if any, make it TOOL_CALLS (ir.Answer.final_reason)
    return out


def _item_text(item: dict[str, Any]) -> str:
    parts = item.get("content")
    return "".join(str(part.get("text") or part.get("refusal") or "") for part in parts
                   if isinstance(part, dict)) if isinstance(parts, list) else ""


def _reasoning_text(item: dict[str, Any]) -> str:
    texts = []
    for key in ("summary", "content"):
        parts = item.get(key)
        if isinstance(parts, list):
            texts += [str(part.get("text") or "") for part in parts if isinstance(part, dict)]
    return "\n\n".join(text for text in texts if text)


class ResponsesDecoder(Decoder):
    api = NAME

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._calls: set[int] = set()  # output indexes of function calls begun
        self._fed: set[int] = set()  # output indexes whose content came in deltas
        self._ended: set[int] = set()

    def _content(self, obj: dict[str, Any], name: str | None) -> list[ir.Event]:
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = name or ""
        index = obj.get("output_index")
        index = index if isinstance(index, int) else 0
        if kind in _TEXT_DELTAS or kind in _REASONING_DELTAS or kind == "response.function_call_arguments.delta":
            delta = obj.get("delta")
            if not isinstance(delta, str) or not delta:
                return []
            self._fed.add(index)
            if kind in _TEXT_DELTAS:
                return [ir.Text(delta)]
            if kind in _REASONING_DELTAS:
                return [ir.Reasoning(delta)]
            return [ir.ToolArgs(index, delta)] if index in self._calls else []
        if kind == "response.output_item.added" or kind == "response.output_item.done":
            item = obj.get("item")
            return self._item(index, item, kind.endswith(".done")) if isinstance(item, dict) else []
        if kind == "response.function_call_arguments.done":
            return self._call_done(index, obj.get("arguments"))
        if kind in _STARTS:
            if self._started:
                return []
            self._started = True
            response = obj.get("response")
            response = response if isinstance(response, dict) else {}
            created = response.get("created_at")
            return [ir.Start(str(response.get("id") or "") or None, created if isinstance(created, int) else None)]
        if kind in _ENDS:
            response = obj.get("response")
            return [*_ending(response if isinstance(response, dict) else {}), ir.END]
        if kind.startswith("response.") and kind.endswith(".added") and "annotation" in kind:
            self.dropped.add("annotations")
        return []

    def _item(self, index: int, item: dict[str, Any], done: bool) -> list[ir.Event]:
        kind = item.get("type")
        if kind == "function_call":
            out: list[ir.Event] = []
            if index not in self._calls:
                self._calls.add(index)
                out.append(ir.ToolStart(index, str(item.get("call_id") or item.get("id") or f"call_{index}"),
                                        str(item.get("name") or "")))
            if done or item.get("arguments"):
                out += self._call_done(index, item.get("arguments"), end=done)
            return out
        if not done or index in self._fed:
            if kind not in _KNOWN_ITEMS:
                self.dropped.add(f"{kind} items")
            return []
        self._fed.add(index)  # a finished item no delta told: its content, whole
        if kind == "message":
            text = _item_text(item)
            return [ir.Text(text)] if text else []
        if kind == "reasoning":
            text = _reasoning_text(item)
            return [ir.Reasoning(text)] if text else []
        return []

    def _call_done(self, index: int, arguments: Any, *, end: bool = True) -> list[ir.Event]:
        if index not in self._calls or index in self._ended:
            return []
        out: list[ir.Event] = []
        if index not in self._fed and isinstance(arguments, str) and arguments:
            self._fed.add(index)
            out.append(ir.ToolArgs(index, arguments))
        if end:
            self._ended.add(index)
            out.append(ir.ToolEnd(index))
        return out


def whole_events(body: dict[str, Any], dropped: set[str]) -> list[ir.Event]:
    """A whole response's events."""
    created = body.get("created_at")
    out: list[ir.Event] = [ir.Start(str(body.get("id") or "") or None, created if isinstance(created, int) else None)]
    for index, item in enumerate(body.get("output") or ()):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            text = _item_text(item)
            out += [ir.Text(text)] if text else []
        elif kind == "reasoning":
            text = _reasoning_text(item)
            out += [ir.Reasoning(text)] if text else []
        elif kind == "function_call":
            out.append(ir.ToolStart(index, str(item.get("call_id") or item.get("id") or f"call_{index}"),
                                    str(item.get("name") or "")))
            if isinstance(item.get("arguments"), str) and item["arguments"]:
                out.append(ir.ToolArgs(index, item["arguments"]))
        else:
            dropped.add(f"{kind} items")
    return out + _ending(body)
