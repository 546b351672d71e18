"""A continuation's frames re-framed into the original stream.

The client already has the original stream's lifecycle frames (Chat's role
chunk, Responses' `response.created` … `content_part.added`, Anthropic's
`message_start` and `content_block_start`) and part of its text.  The
continuation's own lifecycle frames are dropped, its text frames carry the
original's ids and indexes (Responses: `sequence_number` goes on counting),
its text is cut to what the client has not seen (`Overlap`), and its terminal
frames (finish reason, usage, `[DONE]`, `response.completed`, `message_delta`
and `message_stop`) end the one stream the client sees.

Responses: reasoning items the continuation produces before its message are
dropped (the client has the original's, or none); the `*.done` events and
`response.completed` carry the whole text the client has, and the output the
client saw (the original's reasoning items, its message).

Gemini's re-framer is in reframe_gemini.py; what every re-framer keeps, in
reframe_base.py.

Pure: each `feed` takes one parsed frame and returns the bytes for the client.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..sse import SseEvent, compact_json
from .overlap import Overlap
from .reframe_base import KEEPALIVE, KEPT_TEXT_LIMIT, BaseReframer, sse_event
from .reframe_gemini import GeminiReframer
from .transcript import Transcript


class Reframer(Protocol):
    overlap: Overlap
    forwarded: int  # characters of text forwarded

    @property
    def whole_text(self) -> str | None:
        """All the text the client has of the answer now; None once that is more than
        is kept (see `BaseReframer`)."""
        ...

    def feed(self, event: SseEvent) -> bytes:
        """The bytes `event` becomes for the client (b"": nothing); raises
        `Diverged` when a regenerated answer turns out to be another one."""
        ...

def reframer_for(transcript: Transcript, overlap: Overlap, keep: int = KEPT_TEXT_LIMIT) -> Reframer:
    """`keep`: how many characters of the continued text are kept to say the whole
    text again (Responses' `*.done` events, a WebSocket turn's carried answer)."""
    kinds: dict[str, type[BaseReframer]] = {"openai-chat": ChatReframer, "openai-responses": ResponsesReframer,
                                     "anthropic-messages": AnthropicReframer, "google-gemini": GeminiReframer}
    return kinds[transcript.api](transcript, overlap, keep)


# --- OpenAI Chat Completions ---------------------------------------------------------


class ChatReframer(BaseReframer):
    def feed(self, event: SseEvent) -> bytes:
        if event.comment_only:
            return self._keepalive(KEEPALIVE)
        if event.data == "[DONE]":
            self.overlap.ended()
            return b"data: [DONE]\n\n"
        chunk = event.json()
        if not isinstance(chunk, dict):
            self.overlap.not_text("a frame that is not JSON")
            return b"data: " + (event.data or "").encode() + b"\n\n"
        choices = chunk.get("choices") or []
        out_choices = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                # the client asked for one choice (several are never continued): another is
                # not part of its answer, and merged into it would garble the text
                self.overlap.not_text("another choice")
                continue
            delta = dict(choice.get("delta") or {})
            delta.pop("role", None)
            content = delta.get("content")
            if any(value for key, value in delta.items() if key != "content"):
                self.overlap.not_text("something other than text")
            if isinstance(content, str) and content:
                delta["content"] = self._text(content)
                if not delta["content"]:
                    del delta["content"]
            else:
                delta.pop("content", None)
            finish = choice.get("finish_reason")
            if finish:
                self.overlap.ended()
            if not any(delta.values()) and not finish and not choice.get("logprobs"):
                continue  # lifecycle, or text the client already has
            out_choices.append({**choice, "index": 0, "delta": delta})
        if choices and not out_choices:
            return b""
        if not choices and not chunk.get("usage"):
            return b""  # an empty or filter chunk: the client had its own
        if not choices:
            self.overlap.ended()
        return b"data: " + compact_json(self._ids(chunk, out_choices)) + b"\n\n"

    def _ids(self, chunk: dict[str, Any], choices: list[Any]) -> dict[str, Any]:
        t = self.transcript
        out = {**chunk, "choices": choices}
        for key, value in (("id", t.response_id), ("model", t.model), ("created", t.created),
                           ("system_fingerprint", t.system_fingerprint)):
            if value is not None:
                out[key] = value
        return out


# --- OpenAI Responses ----------------------------------------------------------------

_RESPONSE_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesReframer(BaseReframer):
    def __init__(self, transcript: Transcript, overlap: Overlap, keep: int = KEPT_TEXT_LIMIT) -> None:
        super().__init__(transcript, overlap, keep)
        self._item: str | None = None  # the continuation's message item that maps onto the original's
        self._output_base: int | None = None  # its output_index
        self._part = False  # its text part began (the client has the original's open)
        self._hidden: set[str] = set()  # ids of the continuation's reasoning items before its message
        self._sequence = (transcript.sequence_number if transcript.sequence_number is not None else -1) + 1

    def feed(self, event: SseEvent) -> bytes:
        if event.comment_only:
            return self._keepalive(KEEPALIVE)
        if event.data == "[DONE]":
            self.overlap.ended()
            return b"data: [DONE]\n\n"
        data = event.json()
        if not isinstance(data, dict):
            self.overlap.not_text("a frame that is not JSON")
            return b""
        kind = str(data.get("type") or event.event or "")
        if kind in _RESPONSE_LIFECYCLE or self._is_hidden(data):
            return b""
        mine = self._item is not None and data.get("item_id") == self._item
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            if (self._item is None and isinstance(item, dict) and item.get("type") == "reasoning"
                    and isinstance(item.get("id"), str) and item["id"]):
                # the upstream reasoned again: the client has the original's reasoning (or none),
                # and a second one before text it already has would be a duplicate
                self._hidden.add(item["id"])
                return b""
            if self._item is None and isinstance(item, dict) and item.get("type") == "message":
                self._item = item.get("id")
                self._output_base = data.get("output_index", 0)
                return b""  # the client has the item open
            self.overlap.not_text(f"a {item.get('type') if isinstance(item, dict) else 'new'} item")
        elif kind == "response.content_part.added" and mine:
            part = data.get("part") or {}
            if isinstance(part, dict) and part.get("type") == "output_text" and not self._part:
                self._part = True
                return b""  # the client has the part open
            self.overlap.not_text("another content part")
        elif kind == "response.output_text.delta" and mine:
            text = self._text(data.get("delta") or "")
            if not text:
                return b""
            data = {**data, "delta": text}
        elif kind in _RESPONSE_ENDS:
            self.overlap.ended()
            response = data.get("response")
            if isinstance(response, dict):
                data = {**data, "response": self._response(response)}
        elif kind.endswith(".delta"):
            self.overlap.not_text(kind)
        elif kind.endswith(".done") and (mine or self._is_message(data.get("item"))):
            self.overlap.ended()
            data = self._whole(kind, data)
        return sse_event(kind, self._ids(data))

    def _is_message(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("id") == self._item and self._item is not None

    def _is_hidden(self, data: dict[str, Any]) -> bool:
        if not self._hidden:
            return False
        item = data.get("item")
        return data.get("item_id") in self._hidden or (isinstance(item, dict) and item.get("id") in self._hidden)

    def _whole(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        """A `.done` event of the message says its whole text: the text the client has
        (a prefilled continuation's own says only the rest)."""
        if kind == "response.output_text.done":
            return {**data, "text": self._whole_from(data.get("text"))}
        part = data.get("part")
        if kind == "response.content_part.done" and isinstance(part, dict) and part.get("type") == "output_text":
            return {**data, "part": {**part, "text": self._whole_from(part.get("text"))}}
        if kind == "response.output_item.done" and self._is_message(data.get("item")):
            return {**data, "item": self._message(data["item"])}
        return data

    def _message(self, item: dict[str, Any]) -> dict[str, Any]:
        """The continuation's message item as the client's: its id, the whole text."""
        content = item.get("content")
        if isinstance(content, list):
            first = next((i for i, part in enumerate(content)
                          if isinstance(part, dict) and part.get("type") == "output_text"), None)
            if first is not None:
                text = self._whole_from(content[first].get("text"))
                content = [*content[:first], {**content[first], "text": text}, *content[first + 1:]]
            item = {**item, "content": content}
        return {**item, "id": self.transcript.item_id}

    def _ids(self, data: dict[str, Any]) -> dict[str, Any]:
        t = self.transcript
        out = dict(data)
        if out.get("item_id") == self._item and self._item is not None:
            out["item_id"] = t.item_id
            if "content_index" in out:
                out["content_index"] = t.content_index
        item = out.get("item")
        if isinstance(item, dict) and self._is_message(item):
            out["item"] = {**item, "id": t.item_id}
        index = out.get("output_index")
        if isinstance(index, int) and self._output_base is not None:
            out["output_index"] = t.output_index + index - self._output_base
        if "sequence_number" in out or t.sequence_number is not None:
            out["sequence_number"] = self._sequence
            self._sequence += 1
        return out

    def _response(self, response: dict[str, Any]) -> dict[str, Any]:
        """The whole response as the client saw it: the original's reasoning items, then
        the message with the client's id and text, then whatever came after it."""
        t = self.transcript
        output = response.get("output")
        if isinstance(output, list):
            kept = [self._message(item) if self._is_message(item) else item for item in output
                    if not (isinstance(item, dict) and item.get("id") in self._hidden)]
            response = {**response, "output": [*t.reasoning, *kept]}
        return {**response, "id": t.response_id}


# --- Anthropic Messages --------------------------------------------------------------


class AnthropicReframer(BaseReframer):
    def __init__(self, transcript: Transcript, overlap: Overlap, keep: int = KEPT_TEXT_LIMIT) -> None:
        super().__init__(transcript, overlap, keep)
        self._block: int | None = None  # the continuation's text block that maps onto the original's

    def feed(self, event: SseEvent) -> bytes:
        if event.comment_only:
            return self._keepalive(KEEPALIVE)
        data = event.json()
        if not isinstance(data, dict):
            self.overlap.not_text("a frame that is not JSON")
            return b""
        kind = str(data.get("type") or event.event or "")
        if kind == "message_start":
            return b""  # the client has the message open
        if kind == "ping":
            return self._keepalive(sse_event(kind, data))
        index = data.get("index")
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if self._block is None and isinstance(block, dict) and block.get("type") == "text":
                self._block = index if isinstance(index, int) else 0
                text = self._text(block.get("text") or "")
                if not text:
                    return b""  # the client has the block open
                data = {"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": text}}
                kind = "content_block_delta"
            else:
                self.overlap.not_text(f"a {block.get('type') if isinstance(block, dict) else 'new'} block")
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if index == self._block and isinstance(delta, dict) and delta.get("type") == "text_delta":
                text = self._text(delta.get("text") or "")
                if not text:
                    return b""
                data = {**data, "delta": {**delta, "text": text}}
            else:
                self.overlap.not_text(str(delta.get("type")) if isinstance(delta, dict) else "a delta")
        elif kind in ("content_block_stop", "message_delta", "message_stop"):
            self.overlap.ended()
        if isinstance(index, int) and self._block is not None:
            data = {**data, "index": self.transcript.content_index + index - self._block}
        return sse_event(kind, data)
