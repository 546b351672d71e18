"""The intermediate form every request is decoded into and encoded from.

It holds what at least two APIs can say: the system prompt, the turns with their
text, media, tool calls and tool results, the tool definitions and the options.
What only one API can say is left out while decoding, with a reason
(docs/translation.md, "Requests"); what only some upstream APIs take is left out
by the encoders of the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

API_NAMES = ("openai-chat", "openai-responses", "anthropic-messages", "google-gemini")


class Untranslatable(Exception):
    """The client's content cannot be carried into the upstream's API: that upstream
    is not asked.  `reason` is for a log line and, when nothing else answers, the
    client's error: it says what and why, never any of the request's content."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Media:
    """An image, a document (a PDF, a file) or a sound, as the client gave it: its
    bytes (base64), a URL the upstream fetches itself, or a file kept by a vendor
    (`store`), which only that vendor's APIs can read."""

    kind: Literal["image", "file", "audio"]
    media_type: str = ""  # the MIME type, where the client said or the data URL does
    data: str = ""  # base64
    url: str = ""  # http(s), or a vendor's own file URI when `store` names it
    file_id: str = ""
    store: str = ""  # "openai", "anthropic", "google": who keeps `file_id` (or the URI)
    filename: str = ""
    detail: str = ""  # OpenAI's image detail


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as Chat and Responses carry it


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    content: tuple[Text | Media, ...]
    is_error: bool = False
    name: str = ""  # the called tool's name, where known (Gemini needs it)


Part = Text | Media | ToolCall | ToolResult


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["user", "assistant"]
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None  # a JSON Schema; None: takes no arguments
    strict: bool | None = None
    # a Responses "custom" tool (free text in, no schema): carried elsewhere as a
    # function of one string argument, `input`
    freeform: bool = False


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "tool"]
    name: str = ""  # the tool, for mode "tool"


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Structured output: JSON, shaped by `schema` where one is given."""

    schema: Mapping[str, Any] | None = None
    name: str = ""
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class Request:
    system: tuple[str, ...] = ()
    messages: tuple[Message, ...] = ()
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    output_format: OutputFormat | None = None
    # options only one vendor's APIs share (OpenAI's Chat and Responses: `user`,
    # `metadata`, `service_tier`, reasoning effort, ...), by their Chat name
    vendor: str = ""
    vendor_options: Mapping[str, Any] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()  # said while decoding
