"""What the client of a cut stream has received, read back from the bytes it got.

Only plain text continues: the answer so far must be one text part that is
still open (a single Chat choice with only `content`, one Responses message
item with one `output_text` part, one Anthropic text block), and the request
must not ask for what a continuation cannot match (several choices,
logprobs).  Anything else (a tool call, reasoning or thinking, a refusal, an
end already sent) is `NotContinuable`, with the reason for the log.

One exception: a Responses message may follow reasoning items the client has
whole (their `response.output_item.done` arrived).  They are finished, so the
continuation can carry them back as input and the client keeps them as they
are.  A cut inside a reasoning item is not continued: what the client has of it
cannot be sent back (only a finished item is accepted as input), and another
upstream's reasoning could not be joined to it.  Chat's `reasoning_content`,
Anthropic's thinking and Gemini's thought parts stay refused: DeepSeek rejects
`reasoning_content` in a request, Anthropic does not take a prefilled answer
while thinking is on, and Gemini's thoughts are not part of the answer it takes
back (they would be lost, or another upstream's joined to them).

Gemini: the text parts of candidate 0, the one candidate asked for; every frame
is a whole `GenerateContentResponse`, so its `responseId` and `modelVersion`
are what the continuation's frames are given.

The ids and indexes found here are what the continuation's frames are
re-framed with, so the client sees one stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..sse import FrameSplitter


class NotContinuable(Exception):
    """Why this answer ends with the clean error instead (`reason` is logged)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Transcript:
    api: str
    text: str  # the plain text the client has, exactly
    # what the original stream's frames carry, to re-frame a continuation with
    response_id: str | None = None  # Chat `id`, Responses `response.id`, Anthropic `message.id`, Gemini `responseId`
    model: str | None = None  # Chat; Gemini `modelVersion`
    created: int | None = None  # Chat
    system_fingerprint: str | None = None  # Chat
    item_id: str | None = None  # Responses
    output_index: int = 0  # Responses
    content_index: int = 0  # Responses; Anthropic: the text block's index
    sequence_number: int | None = None  # Responses: the last one the client got
    # Responses: the reasoning items before the message, each as its `output_item.done` carried it
    reasoning: tuple[dict[str, Any], ...] = field(default=(), hash=False)


def read_transcript(api: str, raw: bytes, request: Any) -> Transcript:
    """The plain text in `raw` (every byte the client got) and its stream's ids."""
    if not isinstance(request, dict):
        raise NotContinuable("the request is not a JSON object")
    splitter = FrameSplitter()
    frames = splitter.feed(raw)
    if splitter.pending:
        raise NotContinuable("the client holds part of a frame")
    events = [frame.event for frame in frames]
    reader = _READERS.get(api)
    if reader is None:
        raise NotContinuable(f"continuation is not supported for {api}")
    transcript = reader(events, request)
    if not transcript.text:
        raise NotContinuable("no plain text reached the client")
    return transcript


def _objects(events: list[Any]) -> list[tuple[str | None, Any]]:
    """(event name, JSON data) of every frame that is not a comment."""
    out = []
    for event in events:
        if event.comment_only:
            continue
        if event.data == "[DONE]":
            raise NotContinuable("the answer had ended")
        data = event.json()
        if not isinstance(data, dict):
            raise NotContinuable("a frame the client got is not a JSON object")
        if "error" in data and data.get("error") is not None:
            raise NotContinuable("the client got an error")
        out.append((event.event, data))
    return out


# --- OpenAI Chat Completions ---------------------------------------------------------

_CHAT_OTHER = {"tool_calls": "a tool call", "function_call": "a tool call", "refusal": "a refusal",
               "reasoning_content": "reasoning", "reasoning": "reasoning", "audio": "audio"}


def _chat(events: list[Any], request: dict[str, Any]) -> Transcript:
    n = request.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        raise NotContinuable("several choices were asked for (n > 1)")
    if request.get("logprobs") or request.get("top_logprobs"):
        raise NotContinuable("logprobs were asked for")
    text: list[str] = []
    ids: dict[str, Any] = {}
    for _, chunk in _objects(events):
        if not ids and chunk.get("id"):  # not Azure's prompt-filter chunk: its id and model are empty
            ids = {"response_id": chunk.get("id"), "model": chunk.get("model"), "created": chunk.get("created"),
                   "system_fingerprint": chunk.get("system_fingerprint")}
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                raise NotContinuable("a choice is not a JSON object")
            if choice.get("index", 0) != 0:
                raise NotContinuable("the answer has several choices")
            if choice.get("finish_reason"):
                raise NotContinuable("the answer had ended")
            if choice.get("logprobs"):
                raise NotContinuable("the answer carries logprobs")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise NotContinuable("a delta is not a JSON object")
            for key, value in delta.items():
                if key in ("role", "content") or not value:
                    continue
                raise NotContinuable(f"the answer has {_CHAT_OTHER.get(key, repr(key))}")
            content = delta.get("content")
            if isinstance(content, str):
                text.append(content)
            elif content:
                raise NotContinuable("content that is not text")
    return Transcript("openai-chat", "".join(text), **ids)


# --- OpenAI Responses ----------------------------------------------------------------

_RESPONSE_LIFECYCLE = ("response.created", "response.in_progress", "response.queued")


def _responses(events: list[Any], request: dict[str, Any]) -> Transcript:
    if request.get("top_logprobs"):
        raise NotContinuable("logprobs were asked for")
    include = request.get("include")
    if isinstance(include, list) and "message.output_text.logprobs" in include:
        raise NotContinuable("logprobs were asked for")
    response_id = item_id = None
    output_index = content_index = 0
    parts = 0
    sequence: int | None = None
    text: list[str] = []
    reasoning: list[dict[str, Any]] = []
    thinking: str | None = None  # the reasoning item still open, if any
    for name, data in _objects(events):
        kind = str(data.get("type") or name or "")
        number = data.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            sequence = number if sequence is None else max(sequence, number)
        if kind in _RESPONSE_LIFECYCLE:
            response = data.get("response")
            if isinstance(response, dict) and response.get("id"):
                response_id = response["id"]
            continue
        if thinking is not None:
            thinking = _in_reasoning(kind, data, thinking, reasoning)
            continue
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            if item_id is not None:
                raise NotContinuable("the answer has more than one output item")
            what = item.get("type") if isinstance(item, dict) else None
            if what == "reasoning" and isinstance(item.get("id"), str) and item["id"]:
                thinking = item["id"]
                continue
            if what != "message":
                raise NotContinuable(f"the answer has a {what or 'non-message'} item")
            item_id, output_index = item.get("id"), data.get("output_index", 0)
            continue
        if kind == "response.content_part.added":
            part = data.get("part") or {}
            parts += 1
            if parts > 1 or not isinstance(part, dict) or part.get("type") != "output_text":
                raise NotContinuable("the answer has a part that is not its one output_text")
            content_index = data.get("content_index", 0)
            continue
        if kind == "response.output_text.delta":
            if data.get("item_id") != item_id or data.get("logprobs"):
                raise NotContinuable("the text carries logprobs or belongs to another item")
            delta = data.get("delta")
            if isinstance(delta, str):
                text.append(delta)
            continue
        if kind.endswith(".delta"):
            raise NotContinuable(f"the answer has {kind}")
        raise NotContinuable(f"the text had ended ({kind})")
    if thinking is not None:
        raise NotContinuable("the cut came inside a reasoning item")
    if item_id is None or response_id is None:
        raise NotContinuable("no message item reached the client")
    return Transcript("openai-responses", "".join(text), response_id=response_id, item_id=item_id,
                      output_index=output_index, content_index=content_index, sequence_number=sequence,
                      reasoning=tuple(reasoning))


def _in_reasoning(kind: str, data: dict[str, Any], thinking: str, done: list[dict[str, Any]]) -> str | None:
    """One event while the reasoning item `thinking` is open: the item still open
    afterwards (None once its `output_item.done` came, kept in `done`)."""
    if kind == "response.output_item.done":
        item = data.get("item")
        if isinstance(item, dict) and item.get("id") == thinking and item.get("type") == "reasoning":
            done.append(item)
            return None
    elif kind.startswith("response.reasoning") and data.get("item_id") == thinking:
        return thinking  # its summary or text, which the client keeps as it came
    raise NotContinuable(f"the answer has {kind} inside a reasoning item")


# --- Anthropic Messages --------------------------------------------------------------


def _anthropic(events: list[Any], request: dict[str, Any]) -> Transcript:
    message_id = None
    index: int | None = None
    text: list[str] = []
    for name, data in _objects(events):
        kind = str(data.get("type") or name or "")
        if kind == "ping":
            continue
        if kind == "message_start":
            message = data.get("message") or {}
            message_id = message.get("id") if isinstance(message, dict) else None
            continue
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if index is not None:
                raise NotContinuable("the answer has more than one content block")
            if not isinstance(block, dict) or block.get("type") != "text":
                what = block.get("type") if isinstance(block, dict) else None
                raise NotContinuable(f"the answer has a {what or 'non-text'} block")
            index = data.get("index", 0)
            if block.get("text"):
                text.append(block["text"])
            continue
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if data.get("index") != index or not isinstance(delta, dict) or delta.get("type") != "text_delta":
                what = delta.get("type") if isinstance(delta, dict) else None
                raise NotContinuable(f"the answer has {what or 'a delta that is not text'}")
            if isinstance(delta.get("text"), str):
                text.append(delta["text"])
            continue
        raise NotContinuable(f"the text had ended ({kind})")
    if index is None or message_id is None:
        raise NotContinuable("no text block reached the client")
    return Transcript("anthropic-messages", "".join(text), response_id=message_id, content_index=index)


# --- Google Gemini -------------------------------------------------------------------

# part fields that are no plain text, as the reason says them
_GEMINI_OTHER = {"functionCall": "a function call", "functionResponse": "a function response",
                 "inlineData": "inline data", "fileData": "file data", "executableCode": "code",
                 "codeExecutionResult": "a code result"}
# the fields of a plain text part: a signature rides on text too, and `thought: false` is no thinking
GEMINI_TEXT_FIELDS = frozenset({"text", "thoughtSignature", "thought"})


def _gemini(events: list[Any], request: dict[str, Any]) -> Transcript:
    config = request.get("generationConfig") or request.get("generation_config") or {}
    if isinstance(config, dict):
        count = config.get("candidateCount", config.get("candidate_count"))
        if isinstance(count, int) and not isinstance(count, bool) and count > 1:
            raise NotContinuable("several candidates were asked for (candidateCount > 1)")
        if config.get("responseLogprobs") or config.get("response_logprobs") or config.get("logprobs"):
            raise NotContinuable("logprobs were asked for")
    text: list[str] = []
    ids: dict[str, Any] = {}
    for _, chunk in _objects(events):
        for key, name in (("response_id", "responseId"), ("model", "modelVersion")):
            if key not in ids and isinstance(chunk.get(name), str) and chunk[name]:
                ids[key] = chunk[name]
        candidates = chunk.get("candidates")
        if candidates is None:
            continue  # usage, prompt feedback: no answer
        if not isinstance(candidates, list):
            raise NotContinuable("candidates is not a list")
        for position, candidate in enumerate(candidates):
            if not isinstance(candidate, dict):
                raise NotContinuable("a candidate is not a JSON object")
            if candidate.get("index", position) != 0:
                raise NotContinuable("the answer has several candidates")
            reason = candidate.get("finishReason")
            if reason and reason != "FINISH_REASON_UNSPECIFIED":
                raise NotContinuable("the answer had ended")
            if candidate.get("logprobsResult"):
                raise NotContinuable("the answer carries logprobs")
            text.extend(_gemini_text(candidate.get("content")))
    return Transcript("google-gemini", "".join(text), **ids)


def _gemini_text(content: Any) -> list[str]:
    """The plain text of one candidate's content; NotContinuable for any other part."""
    if content is None:
        return []
    parts = content.get("parts") if isinstance(content, dict) else None
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise NotContinuable("content that is not a list of parts")
    out = []
    for part in parts:
        if not isinstance(part, dict):
            raise NotContinuable("a part is not a JSON object")
        if part.get("thought"):
            raise NotContinuable("the answer has thinking (a thought part)")
        for key, value in part.items():
            if key not in GEMINI_TEXT_FIELDS and value is not None:
                raise NotContinuable(f"the answer has {_GEMINI_OTHER.get(key, repr(key))}")
        value = part.get("text")
        if isinstance(value, str):
            out.append(value)
        elif value is not None:
            raise NotContinuable("a text part that is not text")
    return out


_READERS = {"openai-chat": _chat, "openai-responses": _responses, "anthropic-messages": _anthropic,
            "google-gemini": _gemini}
