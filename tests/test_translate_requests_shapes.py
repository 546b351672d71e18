"""What the request-translation tests build from and check against: the official
SDKs' own request types.

Conversations are written as the SDKs' param types (`openai.types`,
`anthropic.types`) and, for Gemini, as `google.genai.types` turned into the body
the SDK itself sends.  A translated body is valid when the SDK's type for that
API takes it, with unknown keys refused (`sdk_valid`): the SDKs' own TypedDicts
let any key through, so each is made to forbid extras first.

These are helpers, not tests; the tests are in test_translate_requests*.py.
"""

from __future__ import annotations

import base64
import functools
import json
import importlib
import pkgutil
from typing import Any, Callable

import anthropic.types
import openai.types
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming, MessageCreateParamsStreaming
from google.genai import _common, models as genai_models, types as gtypes
from google.genai._api_client import BaseApiClient
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params
from pydantic import ConfigDict, TypeAdapter
from typing_extensions import is_typeddict

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(24)).decode()
IMAGE_URL = "https://example.com/cat.png"
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city"},
                   "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"],
    "additionalProperties": False,
}


@functools.cache
def _sdk_request_types() -> tuple[type, ...]:
    """Every request TypedDict of the openai and anthropic SDKs."""
    found = []
    for package in (openai.types, anthropic.types):
        for module_info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not module_info.name.endswith(("_param", "_params")):
                continue
            module = importlib.import_module(module_info.name)
            found += [value for value in vars(module).values()
                      if isinstance(value, type) and is_typeddict(value) and value.__module__ == module.__name__]
    return tuple(dict.fromkeys(found))  # a type can have two names in one module


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    """A validator for `kind` that refuses keys the SDK's TypedDicts do not declare
    (pydantic otherwise ignores them); the SDK's own types are left as they were."""
    kinds = _sdk_request_types()
    for each in kinds:
        each.__pydantic_config__ = ConfigDict(extra="forbid", arbitrary_types_allowed=True)  # type: ignore[attr-defined]
    try:
        return TypeAdapter(kind)
    finally:
        for each in kinds:
            del each.__pydantic_config__  # type: ignore[attr-defined]


def _consumed(value: Any) -> Any:
    """Pydantic checks an `Iterable` field's items only as they are read: read them all."""
    if isinstance(value, dict):
        return {k: _consumed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__next__"):
        return [_consumed(v) for v in value]
    return value


def _gemini_valid(body: dict[str, Any]) -> None:
    allowed = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
    assert set(body) <= allowed, set(body) - allowed
    for content in body["contents"]:
        gtypes.Content.model_validate(content)
    if "systemInstruction" in body:
        gtypes.Content.model_validate(body["systemInstruction"])
    for tool in body.get("tools", []):
        gtypes.Tool.model_validate(tool)
    if "toolConfig" in body:
        gtypes.ToolConfig.model_validate(body["toolConfig"])
    if "generationConfig" in body:
        gtypes.GenerationConfig.model_validate(body["generationConfig"])


def sdk_valid(api: str, body: dict[str, Any], *, stream: bool = True) -> None:
    """Raises unless the official SDK's request type for `api` takes `body`."""
    kinds: dict[str, Any] = {
        "openai-chat": (chat_params.CompletionCreateParamsStreaming if stream
                        else chat_params.CompletionCreateParamsNonStreaming),
        "openai-responses": (responses_params.ResponseCreateParamsStreaming if stream
                             else responses_params.ResponseCreateParamsNonStreaming),
        "anthropic-messages": MessageCreateParamsStreaming if stream else MessageCreateParamsNonStreaming,
    }
    if api == "google-gemini":
        _gemini_valid(body)
    else:
        _consumed(_adapter(kinds[api]).validate_python(body))


def gemini_body(contents: list[gtypes.Content], config: gtypes.GenerateContentConfig | None = None) -> dict[str, Any]:
    """The JSON body the google-genai SDK sends for these contents and config."""
    params = gtypes._GenerateContentParameters(model="gemini-2.5-flash", contents=contents, config=config)
    body = genai_models._GenerateContentParameters_to_mldev(BaseApiClient(api_key="k"), params, None, params)
    body.pop("_url", None)
    body.pop("config", None)
    # as it goes on the wire: the SDK's enums are written as their strings
    return dict(json.loads(json.dumps(_common.encode_unserializable_types(_common.convert_to_dict(body)))))


# -- the same conversations, written in each API's SDK types --------------------------------------

def _chat(case: str) -> dict[str, Any]:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
    tools: list[ChatCompletionToolParam] = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_SCHEMA}}]
    messages: list[ChatCompletionMessageParam]
    if case == "text":
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
        return {"model": "gpt-x", "messages": messages, "stream": True, "max_completion_tokens": 300,
                "temperature": 0.2, "top_p": 0.9, "stop": ["END"]}
    if case == "tools":
        messages = [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_a1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "call_b2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
            ]},
            {"role": "tool", "tool_call_id": "call_a1", "content": "18 C, sunny"},
            {"role": "tool", "tool_call_id": "call_b2", "content": "4 C, rain"},
            {"role": "assistant", "content": "Paris is sunny; Oslo is rainy."},
            {"role": "user", "content": "And tomorrow?"},
        ]
        return {"model": "gpt-x", "messages": messages, "tools": tools, "tool_choice": "auto", "stream": True}
    if case == "images":
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "Compare these."},
            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]}]
        return {"model": "gpt-x", "messages": messages, "stream": True}
    if case == "prefill":
        messages = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "One, two,"}]
        return {"model": "gpt-x", "messages": messages, "stream": True}
    assert case == "named_tool"
    messages = [{"role": "user", "content": "Weather in Rome?"}]
    return {"model": "gpt-x", "messages": messages, "tools": tools, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


def _responses(case: str) -> dict[str, Any]:
    from openai.types.responses import FunctionToolParam, ResponseInputParam
    tools: list[FunctionToolParam] = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
                                       "parameters": WEATHER_SCHEMA, "strict": True}]
    items: ResponseInputParam
    if case == "text":
        return {"model": "gpt-x", "instructions": "Be brief.", "input": "Hello there", "stream": True,
                "max_output_tokens": 300, "temperature": 0.2, "top_p": 0.9}
    if case == "tools":
        items = [
            {"type": "message", "role": "user", "content": "Weather in Paris and Oslo?"},
            {"type": "message", "role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_a1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "call_b2", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "call_a1", "output": "18 C, sunny"},
            {"type": "function_call_output", "call_id": "call_b2", "output": "4 C, rain"},
            {"type": "message", "role": "assistant", "content": "Paris is sunny; Oslo is rainy."},
            {"type": "message", "role": "user", "content": "And tomorrow?"},
        ]
        return {"model": "gpt-x", "instructions": "Use tools.", "input": items, "tools": tools,
                "tool_choice": "auto", "stream": True}
    if case == "images":
        items = [{"role": "user", "content": [
            {"type": "input_text", "text": "Compare these."},
            {"type": "input_image", "image_url": IMAGE_URL, "detail": "auto"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
        ]}]
        return {"model": "gpt-x", "input": items, "stream": True}
    if case == "prefill":
        items = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "One, two,"}]
        return {"model": "gpt-x", "input": items, "stream": True}
    assert case == "named_tool"
    return {"model": "gpt-x", "input": "Weather in Rome?", "tools": tools, "stream": True,
            "tool_choice": {"type": "function", "name": "get_weather"}}


def _anthropic(case: str) -> dict[str, Any]:
    from anthropic.types import MessageParam, ToolParam
    tools: list[ToolParam] = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}]
    messages: list[MessageParam]
    if case == "text":
        return {"model": "claude-x", "system": "Be brief.", "messages": [{"role": "user", "content": "Hello there"}],
                "max_tokens": 300, "temperature": 0.2, "stop_sequences": ["END"], "stream": True}
    if case == "tools":
        messages = [
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_a1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_b2", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a1", "content": "18 C, sunny"},
                {"type": "tool_result", "tool_use_id": "call_b2", "content": [{"type": "text", "text": "4 C, rain"}]},
            ]},
            {"role": "assistant", "content": "Paris is sunny; Oslo is rainy."},
            {"role": "user", "content": "And tomorrow?"},
        ]
        return {"model": "claude-x", "system": [{"type": "text", "text": "Use tools."}], "messages": messages,
                "tools": tools, "tool_choice": {"type": "auto"}, "max_tokens": 1024, "stream": True}
    if case == "images":
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "Compare these."},
            {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ]}]
        return {"model": "claude-x", "messages": messages, "max_tokens": 1024, "stream": True}
    if case == "prefill":
        messages = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "One, two,"}]
        return {"model": "claude-x", "messages": messages, "max_tokens": 1024, "stream": True}
    assert case == "named_tool"
    return {"model": "claude-x", "messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": tools,
            "tool_choice": {"type": "tool", "name": "get_weather"}, "max_tokens": 1024, "stream": True}


def _gemini(case: str) -> dict[str, Any]:
    user = functools.partial(gtypes.Content, role="user")
    model = functools.partial(gtypes.Content, role="model")
    weather = gtypes.Tool(function_declarations=[gtypes.FunctionDeclaration(
        name="get_weather", description="Weather in a city", parameters_json_schema=WEATHER_SCHEMA)])
    text = gtypes.Part.from_text
    if case == "text":
        return gemini_body([user(parts=[text(text="Hello there")])], gtypes.GenerateContentConfig(
            system_instruction="Be brief.", max_output_tokens=300, temperature=0.2, top_p=0.9, stop_sequences=["END"]))
    if case == "tools":
        call = gtypes.Part.from_function_call
        answer = gtypes.Part.from_function_response
        return gemini_body([
            user(parts=[text(text="Weather in Paris and Oslo?")]),
            model(parts=[text(text="Checking."), call(name="get_weather", args={"city": "Paris"}),
                         call(name="get_weather", args={"city": "Oslo"})]),
            user(parts=[answer(name="get_weather", response={"output": "18 C, sunny"}),
                        answer(name="get_weather", response={"output": "4 C, rain"})]),
            model(parts=[text(text="Paris is sunny; Oslo is rainy.")]),
            user(parts=[text(text="And tomorrow?")]),
        ], gtypes.GenerateContentConfig(system_instruction="Use tools.", tools=[weather], tool_config=gtypes.ToolConfig(
            function_calling_config=gtypes.FunctionCallingConfig(mode=gtypes.FunctionCallingConfigMode.AUTO))))
    if case == "images":
        return gemini_body([user(parts=[
            text(text="Compare these."),
            gtypes.Part.from_uri(file_uri=IMAGE_URL, mime_type="image/png"),
            gtypes.Part.from_bytes(data=base64.b64decode(PNG), mime_type="image/png"),
        ])])
    if case == "prefill":
        return gemini_body([user(parts=[text(text="Count to five.")]), model(parts=[text(text="One, two,")])])
    assert case == "named_tool"
    return gemini_body([user(parts=[text(text="Weather in Rome?")])], gtypes.GenerateContentConfig(
        tools=[weather], tool_config=gtypes.ToolConfig(function_calling_config=gtypes.FunctionCallingConfig(
            mode=gtypes.FunctionCallingConfigMode.ANY, allowed_function_names=["get_weather"]))))


CASES = ("text", "tools", "images", "prefill", "named_tool")
BUILDERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "openai-chat": _chat, "openai-responses": _responses, "anthropic-messages": _anthropic, "google-gemini": _gemini,
}


def conversation(api: str, case: str) -> dict[str, Any]:
    """The conversation `case` as a client of `api` sends it, checked against its SDK type."""
    body = BUILDERS[api](case)
    sdk_valid(api, {k: v for k, v in body.items() if k not in ("temperature", "top_p", "top_k")}
              if api == "anthropic-messages" else body)
    return body
