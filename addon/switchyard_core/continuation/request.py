"""The request that asks an upstream for the rest of a cut answer.

`prefill`: the original request with the text the client already has as the
final assistant message (Chat Completions, Anthropic Messages), the upstream's
`prefill_body` merged into the top level and its `prefill_message` into that
message.  `regenerate`: the original request as it was.  The Responses API has
no prefill.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ..sse import compact_json

PREFILL_APIS = frozenset({"openai-chat", "anthropic-messages"})


@dataclass(frozen=True, slots=True)
class ContinuationRequest:
    body: bytes
    # text the client has that the request does not carry (skipped where the continuation repeats it)
    echo: str = ""


def continuation_body(api: str, strategy: str, body: bytes, text: str, *,
                      prefill_body: Mapping[str, Any] | None = None,
                      prefill_message: Mapping[str, Any] | None = None) -> ContinuationRequest | None:
    """The continuation's body from the attempt's own (`body`, its model already
    rewritten for the upstream); None where the strategy cannot apply."""
    if strategy == "regenerate":
        return ContinuationRequest(body)
    if strategy != "prefill" or api not in PREFILL_APIS:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
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
    return ContinuationRequest(compact_json(data), echo)


def _ends_with_assistant(messages: list[Any]) -> bool:
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant"
