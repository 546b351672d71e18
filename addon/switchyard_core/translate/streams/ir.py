"""What an answer says, whatever API carried it: the events between a decoder and an encoder.

Each upstream API has a decoder (its events in, these out) and each client API an
encoder (these in, its SSE frames out), so four of each serve all twelve ordered
pairs.  The events are what every API can say about an answer as it streams:
text, reasoning, a tool call (its start, pieces of its JSON arguments, its end),
the finish reason, token usage, an error, a keepalive, the end.

A tool call is named by its `key`, the upstream's own handle for it (Chat's
`tool_calls[].index`, Anthropic's block index, Responses' `output_index`, a count
for Gemini's whole calls); each encoder gives it the client's own index.

`Answer` folds the events into a whole answer: the non-streaming translation
renders one, and the Responses encoder keeps one for `response.completed`.
"""

from __future__ import annotations

import enum
import json
from json.encoder import encode_basestring, encode_basestring_ascii
from dataclasses import dataclass, field
from typing import Any

from ...apis.base import ErrorInfo


class Finish(enum.Enum):
    """Why the answer ended, in the words every API has one for."""

    STOP = "stop"  # a natural end or a stop sequence
    TOOL_CALLS = "tool_calls"  # the answer is tool calls to run
    LENGTH = "length"  # the token limit (or the context window) cut it
    CONTENT_FILTER = "content_filter"  # refused or filtered


@dataclass(slots=True)
class Usage:
    """Token counts, as OpenAI counts them: `input_tokens` includes the cached and the
    cache-written ones, `output_tokens` includes reasoning."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # read from a prompt cache
    cache_write_tokens: int = 0  # written to Anthropic's prompt cache
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def merged(self, later: Usage) -> Usage:
        """Later counts win where they say something (Anthropic's `message_delta` repeats
        `message_start`'s input count only sometimes)."""
        return Usage(later.input_tokens or self.input_tokens, later.output_tokens or self.output_tokens,
                     later.cached_tokens or self.cached_tokens,
                     later.cache_write_tokens or self.cache_write_tokens,
                     later.reasoning_tokens or self.reasoning_tokens)


@dataclass(frozen=True, slots=True)
class Start:
    """The upstream's answer began: its id and creation time where it says them, and
    any usage it knows already (Anthropic's and Gemini's input count)."""

    id: str | None = None
    created: int | None = None
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class ToolStart:
    key: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArgs:
    key: int
    delta: str  # a piece of the arguments' JSON text; never empty


@dataclass(frozen=True, slots=True)
class ToolEnd:
    key: int


@dataclass(frozen=True, slots=True)
class Finished:
    reason: Finish


@dataclass(frozen=True, slots=True)
class UsageReport:
    usage: Usage


@dataclass(frozen=True, slots=True)
class Failed:
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Keepalive:
    pass


@dataclass(frozen=True, slots=True)
class End:
    """The upstream's own end marker: the client's stream can be closed."""


Event = Start | Text | Reasoning | ToolStart | ToolArgs | ToolEnd | Finished | UsageReport | Failed | Keepalive | End

KEEPALIVE = Keepalive()
END = End()


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    @property
    def json_text(self) -> str:
        return "".join(self.arguments)

    def args(self) -> dict[str, Any]:
        """The arguments as an object (Gemini's `args`, Anthropic's `input`); {} when
        they are empty or not a JSON object (a model can stream broken JSON)."""
        text = self.json_text
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class Block:
    """One piece of a whole answer, in order: text, reasoning or a tool call."""

    kind: str  # "text" | "reasoning" | "tool"
    parts: list[str] = field(default_factory=list)
    call: ToolCall | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(slots=True)
class Answer:
    """A whole answer, folded from the events in order."""

    id: str | None = None
    created: int | None = None
    blocks: list[Block] = field(default_factory=list)
    finish: Finish | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    _calls: dict[int, ToolCall] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        if isinstance(event, Text) or isinstance(event, Reasoning):
            kind = "text" if isinstance(event, Text) else "reasoning"
            if not self.blocks or self.blocks[-1].kind != kind:
                self.blocks.append(Block(kind))
            self.blocks[-1].parts.append(event.text)
        elif isinstance(event, ToolStart):
            call = ToolCall(event.id, event.name)
            self._calls[event.key] = call
            self.blocks.append(Block("tool", call=call))
        elif isinstance(event, ToolArgs):
            found = self._calls.get(event.key)
            if found is not None:
                found.arguments.append(event.delta)
        elif isinstance(event, Start):
            self.id = self.id or event.id
            self.created = self.created or event.created
            if event.usage is not None:
                self.usage = event.usage if self.usage is None else self.usage.merged(event.usage)
        elif isinstance(event, UsageReport):
            self.usage = event.usage if self.usage is None else self.usage.merged(event.usage)
        elif isinstance(event, Finished):
            self.finish = event.reason
        elif isinstance(event, Failed):
            self.error = self.error or event.error

    @property
    def calls(self) -> list[ToolCall]:
        return [block.call for block in self.blocks if block.call is not None]

    @property
    def text(self) -> str:
        return "".join(block.text for block in self.blocks if block.kind == "text")

    @property
    def reasoning(self) -> str:
        return "".join(block.text for block in self.blocks if block.kind == "reasoning")

    def final_reason(self) -> Finish:
        """The finish reason a client should see: tool calls whenever the answer has
        some (Gemini says STOP, Responses only `completed`, for a tool-call answer)."""
        if self.calls and self.finish in (None, Finish.STOP):
            return Finish.TOOL_CALLS
        return self.finish or Finish.STOP


def json_str(text: str) -> bytes:
    """A JSON string literal as UTF-8 (what `json.dumps` writes for a string, without
    its per-call set-up: this runs for every delta); a lone surrogate (half an emoji
    whose other half is in the next frame) has no UTF-8, so then it is escaped as it came."""
    try:
        return encode_basestring(text).encode()
    except UnicodeEncodeError:
        return encode_basestring_ascii(text).encode()


def as_int(value: Any) -> int:
    """A token count from JSON: anything but a number is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
