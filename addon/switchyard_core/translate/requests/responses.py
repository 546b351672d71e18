"""OpenAI Responses requests, to and from the intermediate form
(docs/translation.md, "Requests")."""

from __future__ import annotations

from typing import Any, Mapping

from .chat import FREEFORM_SCHEMA, OPENAI_OPTIONS
from .common import (arguments_object, arguments_text, bool_or_none, data_url, float_or_none, int_or_none, json_output_format,
                     obj, option, parse_data_url, refuse_media, text_of, unknown_options)
from .ir import (Media, Message, OutputFormat, Part, Request, Text, Tool, ToolCall, ToolChoice, ToolResult,
                 Untranslatable)

API = "openai-responses"
MIN_OUTPUT_TOKENS = 16  # OpenAI refuses a lower `max_output_tokens` (docs/translation.md)
_CARRIED = {"model", "input", "instructions", "stream", "max_output_tokens", "temperature", "top_p", "tools",
            "tool_choice", "parallel_tool_calls", "text", "reasoning", "user", "metadata", "service_tier",
            "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "store"}
# the client's conversation is kept by OpenAI, where no other upstream can read it
_STORED = {"previous_response_id": "it continues a stored response (`previous_response_id`)",
           "conversation": "it continues a stored conversation (`conversation`)",
           "prompt": "it uses a stored prompt (`prompt`)"}


def decode(body: Mapping[str, Any]) -> Request:
    for key, why in _STORED.items():
        if body.get(key):
            raise Untranslatable(f"the request cannot be carried out of OpenAI's Responses API: {why}")
    left_out = unknown_options({k: v for k, v in body.items() if k not in _STORED}, _CARRIED, API)
    given = body.get("input")
    system = [body["instructions"]] if isinstance(body.get("instructions"), str) and body["instructions"] else []
    turns: list[Message] = []
    if isinstance(given, str):
        turns.append(Message("user", (Text(given),)))
    elif isinstance(given, list):
        for item in given:
            if not isinstance(item, dict):
                raise Untranslatable("an `input` item is not an object")
            _item(item, system, turns, left_out)
    elif given is not None:
        raise Untranslatable("the request's `input` is neither text nor a list of items")
    tools: list[Tool] = []
    _tools(body.get("tools"), tools, left_out)
    for item in given if isinstance(given, list) else ():
        if item.get("type") == "additional_tools":  # tools declared in the input (Codex sends its own so)
            _tools(item.get("tools"), tools, left_out)
    text = obj(body.get("text"))
    reasoning = obj(body.get("reasoning"))
    options = {k: body[k] for k in OPENAI_OPTIONS if body.get(k) is not None}
    if text.get("verbosity"):
        options["verbosity"] = text["verbosity"]
    if reasoning.get("effort"):
        options["reasoning_effort"] = reasoning["effort"]
    if reasoning.get("summary") or reasoning.get("generate_summary"):
        left_out.append("`reasoning.summary`: no other API returns reasoning summaries")
    return Request(
        system=tuple(system),
        messages=tuple(turns),
        tools=tuple(tools),
        tool_choice=_tool_choice(body.get("tool_choice"), left_out),
        parallel_tool_calls=bool_or_none(body.get("parallel_tool_calls")),
        max_tokens=int_or_none(body.get("max_output_tokens")),
        temperature=float_or_none(body.get("temperature")),
        top_p=float_or_none(body.get("top_p")),
        output_format=_output_format(text.get("format")),
        vendor="openai",
        vendor_options=options,
        left_out=tuple(left_out),
    )


def _tools(given: Any, tools: list[Tool], left_out: list[str]) -> None:
    """Function and free-text tool definitions, a namespace's flattened (its tools keep their
    names; a name already taken is left out: the other APIs have no namespaces)."""
    for tool in given if isinstance(given, list) else ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            _tools(tool.get("tools"), tools, left_out)
            continue
        if kind not in ("function", "custom"):
            if isinstance(tool, dict):
                left_out.append(f"the built-in tool {option(str(kind))}: a tool of {API} only")
            continue
        name = str(tool.get("name") or "")
        if any(known.name == name for known in tools):
            left_out.append(f"a second tool named {option(name)} (in another namespace)")
        elif kind == "function":
            parameters = tool.get("parameters")
            tools.append(Tool(name, str(tool.get("description") or ""),
                              parameters if isinstance(parameters, dict) else None,
                              tool.get("strict") if isinstance(tool.get("strict"), bool) else None))
        else:
            tools.append(Tool(name, str(tool.get("description") or ""), freeform=True))


def _item(item: dict[str, Any], system: list[str], turns: list[Message], left_out: list[str]) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        content = item.get("content")
        if role in ("system", "developer"):
            system.append(text_of(_parts(content)))
        elif role in ("user", "assistant"):
            turns.append(Message(role, _parts(content)))
        else:
            raise Untranslatable(f"an input message has a role ({option(str(role))}) no other API has")
    elif kind in ("function_call", "custom_tool_call"):
        arguments = (str(item.get("arguments") or "") if kind == "function_call"
                     else arguments_text({"input": str(item.get("input") or "")}))
        turns.append(Message("assistant", (ToolCall(str(item.get("call_id") or ""), str(item.get("name") or ""),
                                                    arguments),)))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        content = (Text(output),) if isinstance(output, str) else tuple(
            p for p in _parts(output) if isinstance(p, (Text, Media)))
        turns.append(Message("user", (ToolResult(str(item.get("call_id") or ""), content,
                                                 name=str(item.get("name") or "")),)))
    elif kind == "reasoning":
        left_out.append("reasoning items in the conversation: only the model that wrote them can read them back")
    elif kind == "additional_tools":
        pass  # its tools are read with the request's (`_tools`)
    else:
        left_out.append(f"an input item of type {option(str(kind))}: a built-in tool's or OpenAI's own record")


def _parts(content: Any) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (Text(content),)
    if not isinstance(content, list):
        return ()
    return tuple(_content_part(p) for p in content if isinstance(p, dict))


def _content_part(part: dict[str, Any]) -> Text | Media:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return Text(str(part.get("text") or ""))
    if kind == "refusal":
        return Text(str(part.get("refusal") or ""))
    if kind == "input_image":
        detail = str(part.get("detail") or "")
        if part.get("file_id"):
            return Media("image", file_id=str(part["file_id"]), store="openai", detail=detail)
        url = str(part.get("image_url") or "")
        inline = parse_data_url(url)
        if inline:
            return Media("image", media_type=inline[0], data=inline[1], detail=detail)
        return Media("image", url=url, detail=detail)
    if kind == "input_file":
        filename = str(part.get("filename") or "")
        if part.get("file_id"):
            return Media("file", file_id=str(part["file_id"]), store="openai", filename=filename)
        inline = parse_data_url(str(part.get("file_data") or ""))
        if inline:
            return Media("file", media_type=inline[0], data=inline[1], filename=filename)
        if part.get("file_url"):
            return Media("file", url=str(part["file_url"]), filename=filename)
    raise Untranslatable(f"a content part of type {option(str(kind))} has no counterpart in the other APIs")


def _tool_choice(value: Any, left_out: list[str]) -> ToolChoice | None:
    if value in ("auto", "none", "required"):
        return ToolChoice(value)
    if isinstance(value, dict):
        if value.get("type") in ("function", "custom") and value.get("name"):
            return ToolChoice("tool", str(value["name"]))
        if value.get("type") == "allowed_tools":
            left_out.append("`tool_choice` allowed_tools: the list of allowed tools (its mode is carried)")
            return ToolChoice("required" if value.get("mode") == "required" else "auto")
        left_out.append(f"`tool_choice` naming the built-in tool {option(str(value.get('type')))}")
    return None


def _output_format(value: Any) -> OutputFormat | None:
    return json_output_format(value.get("type"), value) if isinstance(value, dict) else None


def encode(request: Request, *, model: str, stream: bool) -> tuple[dict[str, Any], list[str]]:
    left_out: list[str] = []
    freeform = {t.name for t in request.tools if t.freeform}
    items: list[dict[str, Any]] = []
    for turn in request.messages:
        # a user turn's results come before its message; an assistant's text before its calls
        media = next((p for p in turn.parts if isinstance(p, Media)), None)
        if turn.role == "assistant" and media is not None:
            raise refuse_media(media, API, "it takes media only from the user")
        content = [_content_param(p) for p in turn.parts if isinstance(p, (Text, Media))]
        message = [_message(turn.role, content)] if content else []
        calls = [_call_item(p, freeform) for p in turn.parts if isinstance(p, ToolCall)]
        results = [_result_item(p, freeform, left_out) for p in turn.parts if isinstance(p, ToolResult)]
        items.extend(message + calls if turn.role == "assistant" else results + message)
    body: dict[str, Any] = {"model": model, "input": items}
    if request.system:
        body["instructions"] = "\n\n".join(request.system)
    if request.tools:
        body["tools"] = [_tool_param(t) for t in request.tools]
        if request.tool_choice:
            body["tool_choice"] = _tool_choice_param(request.tool_choice, freeform)
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_tokens is not None:
        body["max_output_tokens"] = max(request.max_tokens, MIN_OUTPUT_TOKENS)
        if request.max_tokens < MIN_OUTPUT_TOKENS:
            left_out.append(f"an output limit below {MIN_OUTPUT_TOKENS}: sent as {MIN_OUTPUT_TOKENS}, "
                            f"the least {API} takes")
    for key in ("temperature", "top_p"):
        if getattr(request, key) is not None:
            body[key] = getattr(request, key)
    for key in ("top_k", "seed", "presence_penalty", "frequency_penalty"):
        if getattr(request, key) is not None:
            left_out.append(f"`{key}`: {API} has no such option")
    if request.stop:
        left_out.append(f"stop sequences: {API} has no such option")
    options = dict(request.vendor_options) if request.vendor == "openai" else {}
    text: dict[str, Any] = {}
    if request.output_format is not None:
        text["format"] = _format_param(request.output_format)
    if options.get("verbosity"):
        text["verbosity"] = options.pop("verbosity")
    if text:
        body["text"] = text
    if options.get("reasoning_effort"):
        body["reasoning"] = {"effort": options.pop("reasoning_effort")}
    body.update(options)
    # OpenAI keeps a response by default: only where the client asked for it
    body.setdefault("store", False)
    if stream:
        body["stream"] = True
    return body, left_out


def _message(role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    if role == "assistant" or (len(content) == 1 and content[0]["type"] == "input_text"):
        return {"type": "message", "role": role, "content": "".join(c.get("text", "") for c in content)}
    return {"type": "message", "role": role, "content": content}


def _call_item(call: ToolCall, freeform: set[str]) -> dict[str, Any]:
    if call.name in freeform:
        return {"type": "custom_tool_call", "call_id": call.id, "name": call.name,
                "input": str(arguments_object(call, API).get("input") or "")}
    return {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": call.arguments or "{}"}


def _result_item(result: ToolResult, freeform: set[str], left_out: list[str]) -> dict[str, Any]:
    if result.is_error:
        left_out.append(f"a tool result's error flag: {API} has none (its text is carried)")
    kind = "custom_tool_call_output" if result.name in freeform else "function_call_output"
    if all(isinstance(p, Text) for p in result.content):
        return {"type": kind, "call_id": result.call_id, "output": text_of(result.content)}
    return {"type": kind, "call_id": result.call_id, "output": [_content_param(p) for p in result.content]}


def _content_param(part: Part) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "input_text", "text": part.text}
    if not isinstance(part, Media):
        raise TypeError(part)
    if part.store and part.store != "openai":
        raise refuse_media(part, API, f"it is a file kept by {part.store}")
    if part.kind == "image":
        image: dict[str, Any] = {"type": "input_image",
                                 "detail": part.detail if part.detail in ("low", "high", "auto") else "auto"}
        if part.file_id:
            image["file_id"] = part.file_id
        else:
            image["image_url"] = part.url or data_url(part.media_type, part.data)
        return image
    if part.kind == "audio":
        raise refuse_media(part, API, "it takes no sound")
    file: dict[str, Any] = {"type": "input_file"}
    if part.file_id:
        file["file_id"] = part.file_id
    elif part.url:
        file["file_url"] = part.url
    else:
        file["file_data"] = data_url(part.media_type, part.data)
        file["filename"] = part.filename or "file"
    return file


def _tool_param(tool: Tool) -> dict[str, Any]:
    if tool.freeform:
        custom: dict[str, Any] = {"type": "custom", "name": tool.name}
        if tool.description:
            custom["description"] = tool.description
        return custom
    function: dict[str, Any] = {"type": "function", "name": tool.name,
                                "parameters": dict(tool.parameters) if tool.parameters is not None
                                else {"type": "object", "properties": {}},
                                # Responses makes a tool strict unless told: the other APIs' schemas seldom fit
                                "strict": bool(tool.strict)}
    if tool.description:
        function["description"] = tool.description
    return function


def _tool_choice_param(choice: ToolChoice, freeform: set[str]) -> Any:
    if choice.mode == "tool":
        return {"type": "custom" if choice.name in freeform else "function", "name": choice.name}
    return choice.mode


def _format_param(fmt: OutputFormat) -> dict[str, Any]:
    if fmt.schema is None:
        return {"type": "json_object"}
    spec: dict[str, Any] = {"type": "json_schema", "name": fmt.name or "output", "schema": dict(fmt.schema)}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return spec


__all__ = ["API", "FREEFORM_SCHEMA", "decode", "encode"]
