"""OpenAI Chat Completions requests, to and from the intermediate form
(docs/translation.md, "Requests")."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .common import (arguments_text, bool_or_none, data_url, fit_id, float_or_none, int_or_none, json_output_format, option,
                     parse_data_url, refuse_media, stop_list, text_of, unknown_options)
from .ir import (Media, Message, OutputFormat, Part, Request, Text, Tool, ToolCall, ToolChoice, ToolResult,
                 Untranslatable)

API = "openai-chat"
FREEFORM_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
# the options OpenAI's two APIs share, carried between them (by their Chat names)
OPENAI_OPTIONS = ("user", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                  "safety_identifier", "store", "reasoning_effort", "verbosity")
OPENAI_STOP_LIMIT = 4  # OpenAI refuses a request with more stop sequences
_ID_LIMIT = 40  # OpenAI refuses a longer tool-call id
_ID = re.compile(r"[\x21-\x7e]+")  # printable ASCII
_CARRIED = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
            "top_p", "stop", "tools", "tool_choice", "parallel_tool_calls", "response_format", "seed",
            "presence_penalty", "frequency_penalty", "functions", "function_call", "n", *OPENAI_OPTIONS}
_AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mpeg"}


def decode(body: Mapping[str, Any]) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Untranslatable("the request has no `messages` list")
    left_out = unknown_options(body, _CARRIED, API)
    if isinstance(body.get("n"), int) and body["n"] > 1:
        left_out.append("`n`: one answer is asked, not several")
    system: list[str] = []
    turns: list[Message] = []
    legacy_calls: dict[str, str] = {}  # a legacy `function_call`'s id by its name, for its `function` result
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Untranslatable("a message of the conversation is not an object")
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system.append(_plain_text(content))
        elif role == "user":
            turns.append(Message("user", _user_parts(content)))
        elif role == "assistant":
            if message.get("reasoning_content") or message.get("reasoning"):
                left_out.append("reasoning in the conversation: only the model that wrote it can read it back")
            turns.append(Message("assistant", _assistant_parts(message, index, legacy_calls)))
        elif role == "tool":
            turns.append(Message("user", (ToolResult(str(message.get("tool_call_id") or ""),
                                                     (Text(_plain_text(content)),)),)))
        elif role == "function":
            name = str(message.get("name") or "")
            call_id = legacy_calls.pop(name, f"function_{index}")
            turns.append(Message("user", (ToolResult(call_id, (Text(_plain_text(content)),), name=name),)))
        else:
            raise Untranslatable(f"a message has a role ({option(str(role))}) no other API has")
    tools = [_tool(t) for t in body.get("tools") or [] if isinstance(t, dict)]
    tools += [_function(f) for f in body.get("functions") or [] if isinstance(f, dict)]
    if any(isinstance(t, dict) and t.get("type") not in ("function", "custom") for t in body.get("tools") or []):
        left_out.append("a tool of a type other than `function`: only functions are carried")
    return Request(
        system=tuple(s for s in system if s),
        messages=tuple(turns),
        tools=tuple(t for t in tools if t is not None),
        tool_choice=_tool_choice(body.get("tool_choice", body.get("function_call")), left_out),
        parallel_tool_calls=bool_or_none(body.get("parallel_tool_calls")),
        max_tokens=int_or_none(body.get("max_completion_tokens", body.get("max_tokens"))),
        temperature=float_or_none(body.get("temperature")),
        top_p=float_or_none(body.get("top_p")),
        stop=stop_list(body.get("stop")),
        seed=int_or_none(body.get("seed")),
        presence_penalty=float_or_none(body.get("presence_penalty")),
        frequency_penalty=float_or_none(body.get("frequency_penalty")),
        output_format=_output_format(body.get("response_format")),
        vendor="openai",
        vendor_options={k: body[k] for k in OPENAI_OPTIONS if body.get(k) is not None},
        left_out=tuple(left_out),
    )


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or p.get("refusal") or "") for p in content if isinstance(p, dict))
    return ""


def _user_parts(content: Any) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (Text(content),)
    if not isinstance(content, list):
        return ()
    return tuple(_content_part(p) for p in content if isinstance(p, dict))


def _content_part(part: dict[str, Any]) -> Part:
    kind = part.get("type")
    if kind == "text":
        return Text(str(part.get("text") or ""))
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = str(image.get("url") or "") if isinstance(image, dict) else str(image)
        detail = str(image.get("detail") or "") if isinstance(image, dict) else ""
        inline = parse_data_url(url)
        if inline:
            return Media("image", media_type=inline[0], data=inline[1], detail=detail)
        return Media("image", url=url, detail=detail)
    if kind == "input_audio":
        audio = part.get("input_audio") or {}
        fmt = str(audio.get("format") or "")
        return Media("audio", media_type=_AUDIO_FORMATS.get(fmt, f"audio/{fmt}"), data=str(audio.get("data") or ""))
    if kind == "file":
        file = part.get("file") or {}
        inline = parse_data_url(str(file.get("file_data") or ""))
        if inline:
            return Media("file", media_type=inline[0], data=inline[1], filename=str(file.get("filename") or ""))
        if file.get("file_id"):
            return Media("file", file_id=str(file["file_id"]), store="openai", filename=str(file.get("filename") or ""))
    raise Untranslatable(f"a content part of type {option(str(kind))} has no counterpart in the other APIs")


def _assistant_parts(message: dict[str, Any], index: int, legacy_calls: dict[str, str]) -> tuple[Part, ...]:
    parts: list[Part] = []
    text = _plain_text(message.get("content"))
    if text:
        parts.append(Text(text))
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        if call.get("type") == "custom":
            custom = call.get("custom") or {}
            parts.append(ToolCall(str(call.get("id") or ""), str(custom.get("name") or ""),
                                  arguments_text({"input": str(custom.get("input") or "")})))
        else:
            function = call.get("function") or {}
            parts.append(ToolCall(str(call.get("id") or ""), str(function.get("name") or ""),
                                  str(function.get("arguments") or "")))
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        name = str(legacy.get("name") or "")
        legacy_calls[name] = f"function_{index}"
        parts.append(ToolCall(f"function_{index}", name, str(legacy.get("arguments") or "")))
    return tuple(parts)


def _tool(tool: dict[str, Any]) -> Tool | None:
    if tool.get("type") == "custom":
        custom = tool.get("custom") or {}
        return Tool(str(custom.get("name") or ""), str(custom.get("description") or ""), freeform=True)
    if tool.get("type") != "function":
        return None
    return _function(tool.get("function") or {})


def _function(function: Mapping[str, Any]) -> Tool:
    parameters = function.get("parameters")
    return Tool(str(function.get("name") or ""), str(function.get("description") or ""),
                parameters if isinstance(parameters, dict) else None,
                function.get("strict") if isinstance(function.get("strict"), bool) else None)


def _tool_choice(value: Any, left_out: list[str]) -> ToolChoice | None:
    if value in ("auto", "none", "required"):
        return ToolChoice(value)
    if isinstance(value, dict):
        if value.get("type") == "allowed_tools":
            left_out.append("`tool_choice` allowed_tools: the list of allowed tools (its mode is carried)")
            mode = (value.get("allowed_tools") or {}).get("mode")
            return ToolChoice("required" if mode == "required" else "auto")
        named = value.get("function") or value.get("custom") or value
        if isinstance(named, dict) and named.get("name"):
            return ToolChoice("tool", str(named["name"]))
    return None


def _output_format(value: Any) -> OutputFormat | None:
    return json_output_format(value.get("type"), value.get("json_schema")) if isinstance(value, dict) else None



def encode(request: Request, *, model: str, stream: bool) -> tuple[dict[str, Any], list[str]]:
    left_out: list[str] = []
    messages: list[dict[str, Any]] = [{"role": "system", "content": text} for text in request.system]
    for turn in request.messages:
        if turn.role == "assistant":
            messages.extend(_assistant_message(turn))
        else:
            messages.extend(_user_messages(turn, left_out))
    body: dict[str, Any] = {"model": model, "messages": messages}
    if request.tools:
        body["tools"] = [_tool_param(t) for t in request.tools]
        if request.tool_choice:
            body["tool_choice"] = _tool_choice_param(request.tool_choice)
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_tokens is not None:
        body["max_completion_tokens"] = request.max_tokens
    for key in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"):
        if getattr(request, key) is not None:
            body[key] = getattr(request, key)
    if request.stop:
        body["stop"] = list(request.stop[:OPENAI_STOP_LIMIT])
        if len(request.stop) > OPENAI_STOP_LIMIT:
            left_out.append(f"stop sequences past the first {OPENAI_STOP_LIMIT}: {API} takes no more")
    if request.top_k is not None:
        left_out.append(f"`top_k`: {API} has no such option")
    if request.output_format is not None:
        body["response_format"] = _response_format(request.output_format)
    if request.vendor == "openai":
        body.update(request.vendor_options)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body, left_out


def chat_id(call_id: str) -> str:
    return fit_id(call_id, pattern=_ID, limit=_ID_LIMIT)


def _assistant_message(turn: Message) -> list[dict[str, Any]]:
    media = next((p for p in turn.parts if isinstance(p, Media)), None)
    if media is not None:
        raise refuse_media(media, API, "it takes media only from the user")
    message: dict[str, Any] = {"role": "assistant"}
    text = text_of(turn.parts)
    calls = [p for p in turn.parts if isinstance(p, ToolCall)]
    if text or not calls:
        message["content"] = text
    if calls:
        message["tool_calls"] = [{"id": chat_id(c.id), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments or "{}"}} for c in calls]
    return [message]


def _user_messages(turn: Message, left_out: list[str]) -> list[dict[str, Any]]:
    """The tool results as `tool` messages, then the rest as one user message; a
    result's images and files follow in that user message (a `tool` message takes
    only text)."""
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for part in turn.parts:
        if isinstance(part, ToolResult):
            out.append({"role": "tool", "tool_call_id": chat_id(part.call_id), "content": text_of(part.content)})
            if part.is_error:
                left_out.append(f"a tool result's error flag: {API} has none (its text is carried)")
            rest.extend(_content_param(p) for p in part.content if isinstance(p, Media))
        elif isinstance(part, (Text, Media)):
            rest.append(_content_param(part))
    if rest:
        if len(rest) == 1 and rest[0]["type"] == "text":
            out.append({"role": "user", "content": rest[0]["text"]})
        else:
            out.append({"role": "user", "content": rest})
    return out


def _content_param(part: Text | Media) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "text", "text": part.text}
    if part.store and part.store != "openai":
        raise refuse_media(part, API, f"it is a file kept by {part.store}")
    if part.kind == "image":
        if part.file_id:
            raise refuse_media(part, API, "it is an OpenAI file id, which Chat Completions takes only for files")
        image: dict[str, Any] = {"url": part.url or data_url(part.media_type, part.data)}
        if part.detail in ("auto", "low", "high"):
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    if part.kind == "audio":
        fmt = next((f for f, t in _AUDIO_FORMATS.items() if part.media_type in (t, f"audio/{f}")), None)
        if not part.data or fmt is None:
            raise refuse_media(part, API, "it takes only WAV or MP3 sound sent inline")
        return {"type": "input_audio", "input_audio": {"data": part.data, "format": fmt}}
    if part.file_id:
        return {"type": "file", "file": {"file_id": part.file_id}}
    if not part.data:
        raise refuse_media(part, API, "it takes files only inline or as an OpenAI file id, not by URL")
    return {"type": "file", "file": {"file_data": data_url(part.media_type, part.data),
                                     "filename": part.filename or "file"}}


def _tool_param(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.freeform:
        function["parameters"] = FREEFORM_SCHEMA
    elif tool.parameters is not None:
        function["parameters"] = dict(tool.parameters)
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _tool_choice_param(choice: ToolChoice) -> Any:
    if choice.mode == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def _response_format(fmt: OutputFormat) -> dict[str, Any]:
    if fmt.schema is None:
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": fmt.name or "output", "schema": dict(fmt.schema)}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}
