"""The request that asks an upstream for the rest of a cut answer.

`prefill`: the original request with the text the client already has as the
final assistant message (Chat Completions, Anthropic Messages; for Responses
the final `input` item, after the reasoning items the client got whole; for
Gemini a final `{"role": "model", "parts": [{"text": …}]}` in `contents`), the
upstream's `prefill_body` merged into the top level and its `prefill_message`
into that message.  `regenerate`: the original request as it was.

Whether Gemini goes on from a final model turn depends on the model: some
continue it word for word, newer ones answer 400 ("Requests ending with a model
turn are not supported"), which only costs that try.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..sse import compact_json

PREFILL_APIS = frozenset({"openai-chat", "openai-responses", "anthropic-messages", "google-gemini"})


@dataclass(frozen=True, slots=True)
class ContinuationRequest:
    body: bytes
    # text the client has that the request does not carry (skipped where the continuation repeats it)
    echo: str = ""
    # the assistant text the prefill request ends with: a provider that restates it first
    # (some OpenAI-compatible servers do) has it skipped (continuation/overlap.py)
    restated: str = ""


def continuation_body(api: str, strategy: str, body: bytes, text: str, *,
                      prefill_body: Mapping[str, Any] | None = None,
                      prefill_message: Mapping[str, Any] | None = None,
                      reasoning: Sequence[Mapping[str, Any]] = ()) -> ContinuationRequest | None:
    """The continuation's body from the attempt's own (`body`, its model already
    rewritten for the upstream); None where the strategy cannot apply.
    `reasoning`: the Responses reasoning items the client got whole, before its text."""
    if strategy == "regenerate":
        return ContinuationRequest(body)
    if strategy != "prefill" or api not in PREFILL_APIS:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if api == "openai-responses":
        return _responses_prefill(data, text, reasoning, prefill_body, prefill_message)
    if api == "google-gemini":
        return _gemini_prefill(data, text, prefill_body, prefill_message)
    messages = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(messages, list):
        return None
    echo = ""
    if api == "anthropic-messages":
        # Anthropic refuses a final assistant message that ends in whitespace: send it
        # without, and skip it where the continuation begins with it
        kept = text.rstrip()
        echo = text[len(kept):]
        text = kept
        if not text and not _ends_with_assistant(messages):
            return None
    data = copy.copy(data)
    data.update(copy.deepcopy(dict(prefill_body or {})))
    messages = list(messages)
    if _ends_with_assistant(messages):
        # the client prefilled the answer itself: the text continues that message
        last = dict(messages[-1])
        content = last.get("content")
        if isinstance(content, str) or content is None:
            last["content"] = (content or "") + text
            if api == "anthropic-messages":
                last["content"] = last["content"].rstrip()
        elif isinstance(content, list) and text:
            last["content"] = [*content, {"type": "text", "text": text}]
        else:
            return None
    else:
        last = {"role": "assistant", "content": text}
        messages.append(last)
    last.update(copy.deepcopy(dict(prefill_message or {})))
    messages[-1] = last
    data["messages"] = messages
    return ContinuationRequest(compact_json(data), echo, said(last.get("content")))


def _ends_with_assistant(messages: list[Any]) -> bool:
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant"


def _responses_prefill(data: Any, text: str, reasoning: Sequence[Mapping[str, Any]],
                       prefill_body: Mapping[str, Any] | None,
                       prefill_message: Mapping[str, Any] | None) -> ContinuationRequest | None:
    """The conversation so far, then what the answer has: its finished reasoning items
    and the partial text as the final assistant message of `input`."""
    if not isinstance(data, dict):
        return None
    given = data.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        items = list(given)
    else:
        return None
    carried = reasoning_input(reasoning, stored=data.get("store") is not False)
    data = copy.copy(data)
    data.update(copy.deepcopy(dict(prefill_body or {})))
    last = items[-1] if items else None
    if not carried and isinstance(last, dict) and last.get("role") == "assistant" and last.get("type", "message") == "message":
        # the client prefilled the answer itself: the text continues that message
        last = dict(last)
        content = last.get("content")
        if isinstance(content, str):
            last["content"] = content + text
        elif isinstance(content, list):
            last["content"] = [*content, {"type": "output_text", "text": text}]
        else:
            return None
        items.pop()
    else:
        last = _assistant_text(text)
    last.update(copy.deepcopy(dict(prefill_message or {})))
    data["input"] = [*items, *carried, last]
    return ContinuationRequest(compact_json(data), restated=said(last.get("content")))


def _gemini_prefill(data: Any, text: str, prefill_body: Mapping[str, Any] | None,
                    prefill_message: Mapping[str, Any] | None) -> ContinuationRequest | None:
    """The conversation so far, then the partial text as the final `model` content.
    `contents` and that content's `role` and `parts` are always the ones built here."""
    contents = data.get("contents") if isinstance(data, dict) else None
    if not isinstance(contents, list):
        return None
    contents = list(contents)
    data = copy.copy(data)
    data.update(copy.deepcopy(dict(prefill_body or {})))
    last = contents[-1] if contents else None
    if isinstance(last, dict) and last.get("role") == "model" and isinstance(last.get("parts"), list):
        # the client prefilled the answer itself: the text continues that content
        parts = [*last["parts"], {"text": text}]
        contents.pop()
    else:
        last, parts = {}, [{"text": text}]
    last = {**last, **copy.deepcopy(dict(prefill_message or {})), "role": "model", "parts": parts}
    data["contents"] = [*contents, last]
    return ContinuationRequest(compact_json(data), restated=said(parts))


def said(content: Any) -> str:
    """The text of a message's content: a string, or the `text` of its parts in order
    (Chat and Anthropic content blocks, Responses `output_text`, Gemini parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))


def _assistant_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def answer_input(reasoning: Sequence[Mapping[str, Any]], text: str, *, stored: bool) -> list[dict[str, Any]]:
    """A Responses answer the client has (its finished reasoning items, its text) as
    the `input` items that stand for it in a later request."""
    return [*reasoning_input(reasoning, stored=stored), _assistant_text(text)]


def reasoning_input(items: Sequence[Mapping[str, Any]], *, stored: bool) -> list[dict[str, Any]]:
    """The reasoning items as the Responses API takes them back as input: their id and
    summary, and their `encrypted_content` (or reasoning text) where they had it.

    Without `encrypted_content` an item is found only by its id among the stored ones:
    when the request said `store: false` none is kept, so none is carried (the
    upstream reasons again, and its new reasoning never reaches the client)."""
    out = []
    for item in items:
        kept: dict[str, Any] = {"type": "reasoning", "id": item.get("id"), "summary": item.get("summary") or []}
        if item.get("encrypted_content"):
            kept["encrypted_content"] = item["encrypted_content"]
        elif not stored:
            return []
        if item.get("content"):
            kept["content"] = item["content"]
        out.append(copy.deepcopy(kept))
    return out
