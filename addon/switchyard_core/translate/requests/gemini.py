"""Google Gemini requests, to and from the intermediate form
(docs/translation.md, "Requests").

Real clients mix the two spellings the REST API takes: the google-genai SDK
writes `inlineData` with a `mime_type` inside, `parameters_json_schema` beside
`functionDeclarations`; curl users write either.  Every field is read under both
names (`_get`), and written camelCase.  Gemini's history has no tool-call ids:
they are made from the call's position and a response is linked to its call by
name and order (`_Calls`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .chat import FREEFORM_SCHEMA
from .common import (arguments_object, arguments_text, call_names, float_or_none, guess_media_type, int_or_none,
                     is_web_url, merged_turns, option, refuse_media, stop_list, text_of, unknown_options)
from .gemini_schema import json_schema
from .ir import Media, Message, OutputFormat, Part, Request, Text, Tool, ToolCall, ToolChoice, ToolResult, Untranslatable

API = "google-gemini"
STOP_LIMIT = 5  # Gemini refuses more stop sequences
# Google's documented stand-in for the signature Gemini 3 wants on every function call
# it is handed back; calls from another API never had one (docs/translation.md)
SKIP_SIGNATURE = "skip_thought_signature_validator"
_CARRIED = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings", "model"}
_GENERATION = {"maxOutputTokens", "temperature", "topP", "topK", "stopSequences", "seed", "presencePenalty",
               "frequencyPenalty", "responseMimeType", "responseJsonSchema", "responseSchema", "candidateCount"}


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _get(data: Any, name: str) -> Any:
    """A field under its camelCase or its snake_case name."""
    if not isinstance(data, dict):
        return None
    value = data.get(name)
    return value if value is not None else data.get(_snake(name))


def _camel(name: str) -> str:
    return "".join(w.capitalize() if i else w for i, w in enumerate(name.split("_")))


def _camel_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    return {_camel(k): v for k, v in data.items()}


class _Calls:
    """Ids for Gemini's id-less calls, made from their place in `contents` (stable
    while the conversation only grows), and each response linked to the earliest
    call of its name not yet answered."""

    def __init__(self) -> None:
        self._open: list[ToolCall] = []

    def call(self, data: Mapping[str, Any], turn: int, index: int) -> ToolCall:
        call = ToolCall(str(_get(data, "id") or f"gemini_call_{turn}_{index}"), str(_get(data, "name") or ""),
                        arguments_text(_get(data, "args")))
        self._open.append(call)
        return call

    def result(self, data: Mapping[str, Any], turn: int, index: int) -> ToolResult:
        name = str(_get(data, "name") or "")
        given = _get(data, "id")
        match = next((c for c in self._open if (c.id == given if given else c.name == name)), None)
        if match is not None:
            self._open.remove(match)
        call_id = str(given or (match.id if match else f"gemini_result_{turn}_{index}"))
        return ToolResult(call_id, _response_content(_get(data, "response")), name=name,
                          is_error=_is_error(_get(data, "response")))


def _response_content(response: Any) -> tuple[Text, ...]:
    if isinstance(response, dict) and len(response) == 1:
        (key, value), = response.items()
        if key in ("output", "error", "result", "content") and isinstance(value, str):
            return (Text(value),)
    return (Text(json.dumps(response, ensure_ascii=False, separators=(",", ":"))),)


def _is_error(response: Any) -> bool:
    return isinstance(response, dict) and set(response) == {"error"}


def decode(body: Mapping[str, Any]) -> Request:
    contents = _get(body, "contents")
    if not isinstance(contents, list):
        raise Untranslatable("the request has no `contents` list")
    if _get(body, "cachedContent"):
        raise Untranslatable("the request uses content cached with Google (`cachedContent`), "
                             "which no other API can read")
    camel = _camel_keys(body)
    left_out = unknown_options(camel, _CARRIED, API)
    if _get(body, "safetySettings"):
        left_out.append("`safetySettings`: Gemini's own safety filters")
    system_content = _get(body, "systemInstruction")
    system = ([system_content] if isinstance(system_content, str)
              else [text_of(_parts(_get(system_content, "parts"), 0, _Calls(), left_out))] if system_content else [])
    calls = _Calls()
    turns = []
    for turn, content in enumerate(contents):
        if not isinstance(content, dict):
            raise Untranslatable("a content of the conversation is not an object")
        parts = _parts(_get(content, "parts"), turn, calls, left_out)
        turns.append(Message("assistant" if content.get("role") == "model" else "user", parts))
    tools: list[Tool] = []
    for tool in _get(body, "tools") or []:
        declarations = _get(tool, "functionDeclarations")
        for declaration in declarations or []:
            tools.append(_tool(declaration))
        others = [k for k in (tool if isinstance(tool, dict) else {}) if _camel(k) != "functionDeclarations"]
        left_out.extend(f"the built-in tool {option(k)}: a tool of {API} only" for k in others)
    config = _get(body, "generationConfig") or {}
    generation = _camel_keys(config) if isinstance(config, dict) else {}
    left_out.extend(f"{option('generationConfig.' + k)}: an option of {API} only"
                    for k in generation if k not in _GENERATION)
    if isinstance(generation.get("candidateCount"), int) and generation["candidateCount"] > 1:
        left_out.append("`candidateCount`: one answer is asked, not several")
    choice, parallel = _tool_choice(_get(_get(body, "toolConfig"), "functionCallingConfig"), left_out)
    return Request(
        system=tuple(s for s in system if s),
        messages=tuple(turns),
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        max_tokens=int_or_none(generation.get("maxOutputTokens")),
        temperature=float_or_none(generation.get("temperature")),
        top_p=float_or_none(generation.get("topP")),
        top_k=int_or_none(generation.get("topK")),
        stop=stop_list(generation.get("stopSequences")),
        seed=int_or_none(generation.get("seed")),
        presence_penalty=float_or_none(generation.get("presencePenalty")),
        frequency_penalty=float_or_none(generation.get("frequencyPenalty")),
        output_format=_output_format(generation),
        vendor="google",
        left_out=tuple(left_out),
    )


def _parts(parts: Any, turn: int, calls: _Calls, left_out: list[str]) -> tuple[Part, ...]:
    out: list[Part] = []
    for index, part in enumerate(parts if isinstance(parts, list) else []):
        if not isinstance(part, dict):
            continue
        if part.get("thought") is True:
            left_out.append("thoughts in the conversation: only the model that wrote them can read them back")
        elif isinstance(part.get("text"), str):
            out.append(Text(part["text"]))
        elif _get(part, "inlineData") is not None:
            blob = _get(part, "inlineData")
            media_type = str(_get(blob, "mimeType") or "")
            out.append(Media(_kind(media_type), media_type=media_type, data=str(_get(blob, "data") or "")))
        elif _get(part, "fileData") is not None:
            file = _get(part, "fileData")
            uri, media_type = str(_get(file, "fileUri") or ""), str(_get(file, "mimeType") or "")
            google = not is_web_url(uri) or "googleapis.com/" in uri
            out.append(Media(_kind(media_type), media_type=media_type, url=uri, store="google" if google else ""))
        elif _get(part, "functionCall") is not None:
            out.append(calls.call(_get(part, "functionCall"), turn, index))
        elif _get(part, "functionResponse") is not None:
            out.append(calls.result(_get(part, "functionResponse"), turn, index))
        elif _get(part, "executableCode") is not None or _get(part, "codeExecutionResult") is not None:
            left_out.append(f"code execution records in the conversation: a built-in tool of {API}")
        elif set(_camel_keys(part)) - {"thoughtSignature", "videoMetadata", "partMetadata", "mediaResolution"}:
            raise Untranslatable("a part of the conversation is of a kind no other API has")
    return tuple(out)


def _kind(media_type: str) -> Any:
    return "image" if media_type.startswith("image/") else "audio" if media_type.startswith("audio/") else "file"


def _tool(declaration: Any) -> Tool:
    schema = _get(declaration, "parametersJsonSchema")
    if schema is None and _get(declaration, "parameters") is not None:
        schema = json_schema(_get(declaration, "parameters"))
    return Tool(str(_get(declaration, "name") or ""), str(_get(declaration, "description") or ""),
                schema if isinstance(schema, dict) else None)


def _tool_choice(config: Any, left_out: list[str]) -> tuple[ToolChoice | None, bool | None]:
    mode = str(_get(config, "mode") or "").upper()
    names = _get(config, "allowedFunctionNames") or []
    if mode == "NONE":
        return ToolChoice("none"), None
    if mode == "ANY":
        if isinstance(names, list) and len(names) == 1:
            return ToolChoice("tool", str(names[0])), None
        if names:
            left_out.append("`allowedFunctionNames`: the list of allowed tools (the mode is carried)")
        return ToolChoice("required"), None
    if mode in ("AUTO", "VALIDATED"):
        if mode == "VALIDATED":
            left_out.append("`functionCallingConfig` VALIDATED: carried as AUTO")
        return ToolChoice("auto"), None
    return None, None


def _output_format(generation: Mapping[str, Any]) -> OutputFormat | None:
    if generation.get("responseMimeType") != "application/json":
        return None
    schema = generation.get("responseJsonSchema")
    if schema is None and generation.get("responseSchema") is not None:
        schema = json_schema(generation["responseSchema"])
    return OutputFormat(schema if isinstance(schema, dict) else None)


def encode(request: Request, *, model: str, stream: bool) -> tuple[dict[str, Any], list[str]]:
    """The body of a model call; `model` and streaming live in its URL, which the
    caller builds."""
    left_out: list[str] = []
    names = call_names(request.messages)
    contents = []
    for turn in merged_turns(request.messages):
        parts = [p for part in turn.parts for p in _part_params(part, names, left_out)]
        if parts:
            contents.append({"role": "model" if turn.role == "assistant" else "user", "parts": parts})
    body: dict[str, Any] = {"contents": contents}
    if request.system:
        body["systemInstruction"] = {"parts": [{"text": s} for s in request.system]}
    if request.tools:
        freeform = {t.name for t in request.tools if t.freeform}
        body["tools"] = [{"functionDeclarations": [_declaration(t, freeform) for t in request.tools]}]
        if request.tool_choice:
            body["toolConfig"] = {"functionCallingConfig": _calling_config(request.tool_choice)}
        if request.parallel_tool_calls is False:
            left_out.append(f"turning parallel tool calls off: {API} has no such option")
    generation: dict[str, Any] = {}
    for key, name in (("max_tokens", "maxOutputTokens"), ("temperature", "temperature"), ("top_p", "topP"),
                      ("top_k", "topK"), ("seed", "seed"), ("presence_penalty", "presencePenalty"),
                      ("frequency_penalty", "frequencyPenalty")):
        if getattr(request, key) is not None:
            generation[name] = getattr(request, key)
    if request.stop:
        generation["stopSequences"] = list(request.stop[:STOP_LIMIT])
        if len(request.stop) > STOP_LIMIT:
            left_out.append(f"stop sequences past the first {STOP_LIMIT}: {API} takes no more")
    if request.output_format is not None:
        generation["responseMimeType"] = "application/json"
        if request.output_format.schema is not None:
            generation["responseJsonSchema"] = dict(request.output_format.schema)
    if generation:
        body["generationConfig"] = generation
    left_out.extend(f"{option(k)}: an option of {request.vendor}'s APIs only" for k in request.vendor_options)
    return body, left_out


def _part_params(part: Part, names: Mapping[str, str], left_out: list[str]) -> list[dict[str, Any]]:
    if isinstance(part, Text):
        return [{"text": part.text}] if part.text else []
    if isinstance(part, Media):
        return [_media_param(part)]
    if isinstance(part, ToolCall):
        call = {"id": part.id, "name": part.name, "args": arguments_object(part, API)}
        return [{"functionCall": call, "thoughtSignature": SKIP_SIGNATURE}]
    name = part.name or names.get(part.call_id)
    if not name:
        raise Untranslatable(f"a tool result in the conversation answers no call in it, and {API} "
                             "needs the called tool's name")
    text = text_of(part.content)
    response = {"name": name, "response": {"error" if part.is_error else "output": text}}
    if part.call_id:
        response = {"id": part.call_id, **response}
    # a result's images and files follow it as parts of their own: every Gemini model reads those
    return [{"functionResponse": response}, *(_media_param(p) for p in part.content if isinstance(p, Media))]


def _media_param(media: Media) -> dict[str, Any]:
    if media.store and media.store != "google":
        raise refuse_media(media, API, f"it is a file kept by {media.store}")
    if media.file_id:
        raise refuse_media(media, API, "it names a file by id only")
    default = {"image": "image/jpeg", "audio": "audio/mpeg", "file": "application/pdf"}[media.kind]
    if media.url:
        if not media.store and not is_web_url(media.url):
            raise refuse_media(media, API, "its URL is not one the upstream can fetch")
        return {"fileData": {"mimeType": media.media_type or guess_media_type(media.url, default),
                             "fileUri": media.url}}
    return {"inlineData": {"mimeType": media.media_type or default, "data": media.data}}


def _declaration(tool: Tool, freeform: set[str]) -> dict[str, Any]:
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description:
        declaration["description"] = tool.description
    schema = FREEFORM_SCHEMA if tool.name in freeform else tool.parameters
    if schema is not None:
        declaration["parametersJsonSchema"] = dict(schema)
    return declaration


def _calling_config(choice: ToolChoice) -> dict[str, Any]:
    if choice.mode == "tool":
        return {"mode": "ANY", "allowedFunctionNames": [choice.name]}
    return {"mode": {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice.mode]}
