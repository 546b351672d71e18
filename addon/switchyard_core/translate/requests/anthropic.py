"""Anthropic Messages requests, to and from the intermediate form
(docs/translation.md, "Requests")."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Literal, Mapping

from .chat import FREEFORM_SCHEMA
from .common import (arguments_object, arguments_text, fit_id, float_or_none, int_or_none, is_web_url, merged_turns,
                     obj, option, refuse_media, results_first, stop_list, unknown_options)
from .ir import Media, Message, OutputFormat, Part, Request, Text, Tool, ToolCall, ToolChoice, ToolResult, Untranslatable

API = "anthropic-messages"
# Anthropic requires `max_tokens`; the other APIs let the model's own limit apply.
# Every current Claude model takes this many (docs/translation.md, "Requests").
ANTHROPIC_DEFAULT_MAX_TOKENS = 32_000
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_ID = re.compile(r"[A-Za-z0-9_-]+")
_CARRIED = {"model", "messages", "system", "stream", "max_tokens", "temperature", "top_p", "top_k",
            "stop_sequences", "tools", "tool_choice", "output_config"}
_THINKING = "thinking blocks in the conversation: only the model that wrote them can read them back"
_CACHE = "`cache_control` marks: prompt caching is Anthropic's own"


def decode(body: Mapping[str, Any]) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Untranslatable("the request has no `messages` list")
    left_out = unknown_options(body, _CARRIED, API)
    system = _system(body.get("system"), left_out)
    turns: list[Message] = []
    for message in messages:
        if not isinstance(message, dict):
            raise Untranslatable("a message of the conversation is not an object")
        role = message.get("role")
        if role == "system":
            system.append("".join(p.text for p in _blocks(message.get("content"), left_out) if isinstance(p, Text)))
        elif role in ("user", "assistant"):
            turns.append(Message(role, _blocks(message.get("content"), left_out)))
        else:
            raise Untranslatable(f"a message has a role ({option(str(role))}) no other API has")
    tools: list[Tool] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") in (None, "custom") and "input_schema" in tool:
            schema = tool.get("input_schema")
            tools.append(Tool(str(tool.get("name") or ""), str(tool.get("description") or ""),
                              schema if isinstance(schema, dict) else None,
                              tool.get("strict") if isinstance(tool.get("strict"), bool) else None))
        else:
            left_out.append(f"the built-in tool {option(str(tool.get('type')))}: a tool of {API} only")
        if tool.get("cache_control"):
            left_out.append(_CACHE)
    choice = obj(body.get("tool_choice"))
    config = obj(body.get("output_config"))
    if config.get("effort"):
        left_out.append("`output_config.effort`: Anthropic's own effort setting")
    fmt = obj(config.get("format"))
    return Request(
        system=tuple(s for s in system if s),
        messages=tuple(turns),
        tools=tuple(tools),
        tool_choice=_tool_choice(choice),
        parallel_tool_calls=False if choice.get("disable_parallel_tool_use") is True else None,
        max_tokens=int_or_none(body.get("max_tokens")),
        temperature=float_or_none(body.get("temperature")),
        top_p=float_or_none(body.get("top_p")),
        top_k=int_or_none(body.get("top_k")),
        stop=stop_list(body.get("stop_sequences")),
        output_format=OutputFormat(fmt["schema"]) if isinstance(fmt.get("schema"), dict) else None,
        vendor="anthropic",
        left_out=tuple(left_out),
    )


def _system(value: Any, left_out: list[str]) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if any(isinstance(b, dict) and b.get("cache_control") for b in value):
            left_out.append(_CACHE)
        return [str(b.get("text") or "") for b in value if isinstance(b, dict) and b.get("type") == "text"]
    return []


def _blocks(content: Any, left_out: list[str]) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (Text(content),)
    if not isinstance(content, list):
        return ()
    parts: list[Part] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("cache_control"):
            left_out.append(_CACHE)
        kind = block.get("type")
        if kind == "text":
            parts.append(Text(str(block.get("text") or "")))
        elif kind in ("image", "document"):
            parts.append(_source(kind, block.get("source") or {}))
        elif kind == "tool_use":
            parts.append(ToolCall(str(block.get("id") or ""), str(block.get("name") or ""),
                                  arguments_text(block.get("input"))))
        elif kind == "tool_result":
            inner = block.get("content")
            result = (Text(inner),) if isinstance(inner, str) else _blocks(inner, left_out)
            parts.append(ToolResult(str(block.get("tool_use_id") or ""),
                                    tuple(p for p in result if isinstance(p, (Text, Media))),
                                    is_error=block.get("is_error") is True))
        elif kind in ("thinking", "redacted_thinking"):
            left_out.append(_THINKING)
        elif kind in ("server_tool_use", "mcp_tool_use", "mcp_tool_result") or str(kind).endswith("_tool_result"):
            left_out.append(f"a {option(str(kind))} block: a record of a built-in tool of {API}")
        else:
            raise Untranslatable(f"a content block of type {option(str(kind))} has no counterpart in the other APIs")
    return tuple(parts)


def _source(kind: str, source: dict[str, Any]) -> Part:
    media_kind: Literal["image", "file"] = "image" if kind == "image" else "file"
    what = source.get("type")
    if what == "base64":
        return Media(media_kind, media_type=str(source.get("media_type") or ""), data=str(source.get("data") or ""))
    if what == "url":
        return Media(media_kind, url=str(source.get("url") or ""),
                     media_type="" if kind == "image" else "application/pdf")
    if what == "file":
        return Media(media_kind, file_id=str(source.get("file_id") or ""), store="anthropic")
    if what == "text":  # a plain-text document is its text
        return Text(str(source.get("data") or ""))
    raise Untranslatable(f"a {kind} whose source is of type {option(str(what))} has no counterpart in the other APIs")


def _tool_choice(choice: Mapping[str, Any]) -> ToolChoice | None:
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return ToolChoice(kind)
    if kind == "any":
        return ToolChoice("required")
    if kind == "tool" and choice.get("name"):
        return ToolChoice("tool", str(choice["name"]))
    return None


def encode(request: Request, *, model: str, stream: bool) -> tuple[dict[str, Any], list[str]]:
    left_out: list[str] = []
    freeform = {t.name for t in request.tools if t.freeform}
    messages: list[dict[str, Any]] = []
    for turn in merged_turns(request.messages):
        parts = results_first(turn.parts) if turn.role == "user" else turn.parts
        blocks = [b for b in (_block(p, left_out) for p in parts) if b is not None]
        if blocks:
            messages.append({"role": turn.role, "content": blocks})
    _trim_prefill(messages)
    for message in messages:  # a lone text block as the plain string clients write
        if len(message["content"]) == 1 and message["content"][0]["type"] == "text":
            message["content"] = message["content"][0]["text"]
    body: dict[str, Any] = {"model": model, "messages": messages,
                            "max_tokens": request.max_tokens if request.max_tokens is not None
                            else ANTHROPIC_DEFAULT_MAX_TOKENS}
    if request.system:
        body["system"] = (request.system[0] if len(request.system) == 1
                          else [{"type": "text", "text": s} for s in request.system])
    if request.tools:
        body["tools"] = [_tool_param(t, freeform) for t in request.tools]
        if any(t.strict for t in request.tools):
            left_out.append("strict tool schemas: carried as ordinary schemas")
        choice = _choice_param(request.tool_choice)
        if request.parallel_tool_calls is False and choice.get("type") != "none":
            choice["disable_parallel_tool_use"] = True
        if request.tool_choice or len(choice) > 1:
            body["tool_choice"] = choice
    _sampling(request, left_out)
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    for key in ("seed", "presence_penalty", "frequency_penalty"):
        if getattr(request, key) is not None:
            left_out.append(f"`{key}`: {API} has no such option")
    if request.output_format is not None:
        if request.output_format.schema is None:
            left_out.append(f"JSON output without a schema: {API} takes only a schema")
        else:
            body["output_config"] = {"format": {"type": "json_schema", "schema": dict(request.output_format.schema)}}
    left_out.extend(f"{option(k)}: an option of {request.vendor}'s APIs only" for k in request.vendor_options)
    if stream:
        body["stream"] = True
    return body, left_out


def _sampling(request: Request, left_out: list[str]) -> None:
    """Sampling options are left out: Anthropic's own SDK no longer sends them and its
    newer models refuse them (400), which would end the fallback it was asked for
    (docs/translation.md, "Requests")."""
    for key in ("temperature", "top_p", "top_k"):
        if getattr(request, key) is not None:
            left_out.append(f"`{key}`: {API}'s newer models refuse sampling options")


def _trim_prefill(messages: list[dict[str, Any]]) -> None:
    """Anthropic refuses a final assistant message that ends in whitespace: it is
    sent without (docs/translation.md, "Prefill")."""
    if not messages or messages[-1]["role"] != "assistant":
        return
    blocks = messages[-1]["content"]
    if blocks[-1]["type"] == "text":
        blocks[-1]["text"] = blocks[-1]["text"].rstrip()
        if not blocks[-1]["text"]:
            blocks.pop()
    if not blocks:
        messages.pop()


def anthropic_id(call_id: str) -> str:
    return fit_id(call_id, pattern=_ID)


def _block(part: Part, left_out: list[str]) -> dict[str, Any] | None:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, Media):
        return _media_block(part)
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": anthropic_id(part.id), "name": part.name,
                "input": arguments_object(part, API)}
    content = [b for b in (_block(p, left_out) for p in part.content) if b is not None]
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": anthropic_id(part.call_id)}
    if content:
        result["content"] = content
    if part.is_error:
        result["is_error"] = True
    return result


def _media_block(media: Media) -> dict[str, Any]:
    if media.store and media.store != "anthropic":
        raise refuse_media(media, API, f"it is a file kept by {media.store}")
    if media.kind == "audio":
        raise refuse_media(media, API, "it takes no sound")
    kind = "image" if media.kind == "image" else "document"
    if media.file_id:
        return {"type": kind, "source": {"type": "file", "file_id": media.file_id}}
    if media.url:
        if not is_web_url(media.url):
            raise refuse_media(media, API, "its URL is not one the upstream can fetch")
        if kind == "document" and media.media_type not in ("", "application/pdf"):
            raise refuse_media(media, API, "it takes only PDF documents by URL")
        return {"type": kind, "source": {"type": "url", "url": media.url}}
    if kind == "image":
        if media.media_type not in IMAGE_TYPES:
            raise refuse_media(media, API, "it takes only JPEG, PNG, GIF and WebP images")
        return {"type": "image", "source": {"type": "base64", "media_type": media.media_type, "data": media.data}}
    if media.media_type == "application/pdf":
        return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": media.data}}
    if media.media_type == "text/plain":
        try:
            text = base64.b64decode(media.data, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise refuse_media(media, API, "its text is not UTF-8 base64") from None
        return {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
    raise refuse_media(media, API, "it takes only PDF and plain-text documents")


def _tool_param(tool: Tool, freeform: set[str]) -> dict[str, Any]:
    schema = (FREEFORM_SCHEMA if tool.name in freeform
              else dict(tool.parameters) if tool.parameters is not None else {"type": "object", "properties": {}})
    param: dict[str, Any] = {"name": tool.name, "input_schema": schema}
    if tool.description:
        param["description"] = tool.description
    return param


def _choice_param(choice: ToolChoice | None) -> dict[str, Any]:
    if choice is None or choice.mode == "auto":
        return {"type": "auto"}
    if choice.mode == "none":
        return {"type": "none"}
    if choice.mode == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice.name}
