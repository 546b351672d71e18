"""A client's request translated for an upstream that speaks another API: the
body that upstream receives, valid for its official SDK's type and carrying the
same conversation; what is refused and what is left out, and why
(docs/translation.md, "Requests")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from switchyard_core.translate.request import (ANTHROPIC_DEFAULT_MAX_TOKENS, API_NAMES, TranslatedRequest,
                                               Untranslatable, translate_request)
from switchyard_core.translate.requests import anthropic, chat, gemini, responses
from switchyard_core.translate.requests.ir import Media, Request, Text, ToolCall, ToolResult

from .test_translate_requests_shapes import CASES, IMAGE_URL, PNG, WEATHER_SCHEMA, conversation, sdk_valid

PAIRS = [(c, u) for c in API_NAMES for u in API_NAMES if c != u]
DECODERS = {"openai-chat": chat.decode, "openai-responses": responses.decode,
            "anthropic-messages": anthropic.decode, "google-gemini": gemini.decode}


def gist(request: Request) -> list[Any]:
    """What a model is told, in no API's shape: the system prompt, each turn's text,
    images, calls (arguments parsed) and results, with each call id replaced by the
    call's place in the conversation so that links are compared, not spellings."""
    order: dict[str, int] = {}
    out: list[Any] = [("system", "\n\n".join(request.system))] if request.system else []
    for message in request.messages:
        for part in message.parts:
            if isinstance(part, Text):
                if out and out[-1][:2] == (message.role, "text"):
                    out[-1] = (message.role, "text", out[-1][2] + part.text)
                elif part.text:
                    out.append((message.role, "text", part.text))
            elif isinstance(part, Media):
                out.append((message.role, part.kind, part.url or (part.media_type, part.data)))
            elif isinstance(part, ToolCall):
                order[part.id] = len(order)
                out.append(("call", order[part.id], part.name, json.loads(part.arguments)))
            elif isinstance(part, ToolResult):
                out.append(("result", order.get(part.call_id), [p.text for p in part.content if isinstance(p, Text)]))
    tools = [(t.name, t.description, dict(t.parameters or {})) for t in request.tools]
    choice = request.tool_choice
    return [out, tools, choice and (choice.mode, choice.name)]


EXPECTED = {
    "text": [[("system", "Be brief."), ("user", "text", "Hello there")], [], None],
    "tools": [[("system", "Use tools."), ("user", "text", "Weather in Paris and Oslo?"),
               ("assistant", "text", "Checking."),
               ("call", 0, "get_weather", {"city": "Paris"}), ("call", 1, "get_weather", {"city": "Oslo"}),
               ("result", 0, ["18 C, sunny"]), ("result", 1, ["4 C, rain"]),
               ("assistant", "text", "Paris is sunny; Oslo is rainy."), ("user", "text", "And tomorrow?")],
              [("get_weather", "Weather in a city", WEATHER_SCHEMA)], ("auto", "")],
    "images": [[("user", "text", "Compare these."), ("user", "image", IMAGE_URL),
                ("user", "image", ("image/png", PNG))], [], None],
    "prefill": [[("user", "text", "Count to five."), ("assistant", "text", "One, two,")], [], None],
    "named_tool": [[("user", "text", "Weather in Rome?")], [("get_weather", "Weather in a city", WEATHER_SCHEMA)],
                   ("tool", "get_weather")],
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("client", API_NAMES)
def test_each_client_conversation_reads_as_written(client: str, case: str) -> None:
    assert gist(DECODERS[client](conversation(client, case))) == EXPECTED[case]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("client", "upstream"), PAIRS)
def test_every_pair_carries_the_conversation_in_a_body_the_upstreams_sdk_takes(client: str, upstream: str,
                                                                              case: str) -> None:
    translated = translate_request(client, upstream, conversation(client, case), model="their-model", stream=True)
    sdk_valid(upstream, translated.body)
    assert gist(DECODERS[upstream](translated.body)) == EXPECTED[case]


@pytest.mark.parametrize(("client", "upstream"), PAIRS)
def test_a_request_without_streaming_is_valid_unstreamed(client: str, upstream: str) -> None:
    body = {k: v for k, v in conversation(client, "tools").items() if k != "stream"}
    translated = translate_request(client, upstream, body, model="their-model", stream=False)
    sdk_valid(upstream, translated.body, stream=False)
    assert "stream" not in translated.body and "stream_options" not in translated.body


def test_streaming_is_asked_for_in_each_apis_own_way() -> None:
    body = conversation("anthropic-messages", "text")
    asked = {api: translate_request("anthropic-messages", api, body, model="m", stream=True).body
             for api in API_NAMES if api != "anthropic-messages"}
    assert asked["openai-chat"]["stream"] is True
    assert asked["openai-chat"]["stream_options"] == {"include_usage": True}  # usage comes only when asked
    assert asked["openai-responses"]["stream"] is True
    # Gemini's model and streaming are in its URL, which the caller builds
    assert "stream" not in asked["google-gemini"] and "model" not in asked["google-gemini"]
    chat_body = conversation("openai-chat", "text")
    assert translate_request("openai-chat", "anthropic-messages", chat_body, model="m", stream=True).body["stream"]


def test_the_upstreams_model_is_asked_for() -> None:
    body = conversation("openai-chat", "text")
    for api in ("openai-responses", "anthropic-messages"):
        assert translate_request("openai-chat", api, body, model="their-model", stream=True).body["model"] == "their-model"


# -- requests as the agents send them --------------------------------------------------------------

CLAUDE_CODE = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "stream": True,
    "metadata": {"user_id": "user_abc"},
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What does notes.txt say?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should read it.", "signature": "c2lnbg=="},
            {"type": "tool_use", "id": "toolu_01A", "name": "Read", "input": {"file_path": "notes.txt"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "buy milk",
             "cache_control": {"type": "ephemeral"}},
        ]},
    ],
    "thinking": {"type": "enabled", "budget_tokens": 4000},
}


def test_a_claude_code_request_as_an_openai_chat_upstream_gets_it() -> None:
    translated = translate_request("anthropic-messages", "openai-chat", CLAUDE_CODE, model="gpt-5.1", stream=True)
    assert translated.body == {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": "You are Claude Code."},
            {"role": "user", "content": "What does notes.txt say?"},
            {"role": "assistant", "tool_calls": [
                {"id": "toolu_01A", "type": "function",
                 "function": {"name": "Read", "arguments": '{"file_path":"notes.txt"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_01A", "content": "buy milk"},
        ],
        "tools": [{"type": "function", "function": {"name": "Read", "description": "Read a file", "parameters": {
            "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}}],
        "max_completion_tokens": 32000,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sdk_valid("openai-chat", translated.body)
    assert translated.left_out == (
        "`metadata`: an option of anthropic-messages with no counterpart in the other APIs",
        "`thinking`: an option of anthropic-messages with no counterpart in the other APIs",
        "`cache_control` marks: prompt caching is Anthropic's own",
        "thinking blocks in the conversation: only the model that wrote them can read them back",
    )
    assert not any("milk" in r or "read it" in r for r in translated.left_out)


CODEX = {
    "model": "gpt-5.1-codex",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the typo in a.txt"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"command":["cat","a.txt"]}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "helo"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done"},
    ],
    "tools": [
        {"type": "function", "name": "shell", "description": "Run a command", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
        {"type": "custom", "name": "apply_patch", "description": "Apply a patch"},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "abc",
}


def test_a_codex_request_as_an_anthropic_upstream_gets_it() -> None:
    translated = translate_request("openai-responses", "anthropic-messages", CODEX, model="claude-x", stream=True)
    freeform = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
    assert translated.body == {
        "model": "claude-x",
        "system": "You are Codex.",
        "messages": [
            {"role": "user", "content": "Fix the typo in a.txt"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "shell", "input": {"command": ["cat", "a.txt"]}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "helo"}]}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_2", "name": "apply_patch", "input": {"input": "*** Begin Patch"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "Done"}]}]},
        ],
        "tools": [
            {"name": "shell", "description": "Run a command", "input_schema": {
                "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
            {"name": "apply_patch", "description": "Apply a patch", "input_schema": freeform},
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "max_tokens": ANTHROPIC_DEFAULT_MAX_TOKENS,
        "stream": True,
    }
    sdk_valid("anthropic-messages", translated.body)
    assert set(translated.left_out) == {
        "`include`: an option of openai-responses with no counterpart in the other APIs",
        "the built-in tool `web_search`: a tool of openai-responses only",
        "`reasoning.summary`: no other API returns reasoning summaries",
        "reasoning items in the conversation: only the model that wrote them can read them back",
        "`store`: an option of openai's APIs only",
        "`prompt_cache_key`: an option of openai's APIs only",
        "`reasoning_effort`: an option of openai's APIs only",
    }


GEMINI_CLI = {
    "contents": [
        {"role": "user", "parts": [{"text": "What is in notes.txt?"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "notes.txt"}},
                                     "thoughtSignature": "c2ln"}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "buy milk"}}}]},
    ],
    "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI."}]},
    "tools": [{"functionDeclarations": [{"name": "read_file", "description": "Read a file", "parametersJsonSchema": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]}],
    "generationConfig": {"temperature": 0, "topP": 1, "thinkingConfig": {"includeThoughts": True}},
}


def test_a_gemini_cli_request_as_an_openai_chat_upstream_gets_it() -> None:
    translated = translate_request("google-gemini", "openai-chat", GEMINI_CLI, model="gpt-5.1", stream=True)
    assert translated.body == {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": "You are Gemini CLI."},
            {"role": "user", "content": "What is in notes.txt?"},
            # Gemini's history has no call ids: one made from the call's place links the result
            {"role": "assistant", "tool_calls": [{"id": "gemini_call_1_0", "type": "function", "function": {
                "name": "read_file", "arguments": '{"path":"notes.txt"}'}}]},
            {"role": "tool", "tool_call_id": "gemini_call_1_0", "content": "buy milk"},
        ],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
            "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}],
        "temperature": 0.0,
        "top_p": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sdk_valid("openai-chat", translated.body)
    assert translated.left_out == ("`generationConfig.thinkingConfig`: an option of google-gemini only",)


def test_a_chat_conversation_as_a_gemini_upstream_gets_it() -> None:
    translated = translate_request("openai-chat", "google-gemini", conversation("openai-chat", "tools"), model="g",
                                   stream=True)
    contents = translated.body["contents"]
    assert contents[1] == {"role": "model", "parts": [
        {"text": "Checking."},
        # Gemini 3 wants a signature on each call it is handed back: Google's documented stand-in
        {"functionCall": {"id": "call_a1", "name": "get_weather", "args": {"city": "Paris"}},
         "thoughtSignature": "skip_thought_signature_validator"},
        {"functionCall": {"id": "call_b2", "name": "get_weather", "args": {"city": "Oslo"}},
         "thoughtSignature": "skip_thought_signature_validator"},
    ]}
    # the results, each named after its call (Chat's `tool` messages carry only the id)
    assert contents[2] == {"role": "user", "parts": [
        {"functionResponse": {"id": "call_a1", "name": "get_weather", "response": {"output": "18 C, sunny"}}},
        {"functionResponse": {"id": "call_b2", "name": "get_weather", "response": {"output": "4 C, rain"}}},
    ]}
    assert translated.body["systemInstruction"] == {"parts": [{"text": "Use tools."}]}
    assert translated.body["tools"] == [{"functionDeclarations": [
        {"name": "get_weather", "description": "Weather in a city", "parametersJsonSchema": WEATHER_SCHEMA}]}]
    assert translated.body["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}


def test_openai_options_are_carried_between_openais_two_apis() -> None:
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "reasoning_effort": "high", "verbosity": "low", "user": "u1", "service_tier": "flex",
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}}
    translated = translate_request("openai-chat", "openai-responses", body, model="gpt-y", stream=True)
    assert translated.body == {
        "model": "gpt-y", "input": [{"type": "message", "role": "user", "content": "hi"}],
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}, "verbosity": "low"},
        "reasoning": {"effort": "high"}, "user": "u1", "service_tier": "flex", "store": False, "stream": True,
    }
    sdk_valid("openai-responses", translated.body)
    assert translated.left_out == ()


# -- the options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["openai-chat", "openai-responses", "google-gemini"])
def test_anthropic_gets_a_max_tokens_when_the_client_gave_none(client: str) -> None:
    body = conversation(client, "prefill")
    assert translate_request(client, "anthropic-messages", body, model="c", stream=True).body["max_tokens"] \
        == ANTHROPIC_DEFAULT_MAX_TOKENS


def test_the_docs_name_the_default_max_tokens() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "translation.md").read_text()
    assert f"`ANTHROPIC_DEFAULT_MAX_TOKENS` ({ANTHROPIC_DEFAULT_MAX_TOKENS})" in docs


@pytest.mark.parametrize("upstream", ["openai-chat", "openai-responses", "google-gemini"])
def test_the_clients_limit_and_sampling_reach_the_other_apis(upstream: str) -> None:
    body = conversation("anthropic-messages", "text") | {"top_k": 40}
    translated = translate_request("anthropic-messages", upstream, body, model="m", stream=True).body
    said = {
        "openai-chat": (translated.get("max_completion_tokens"), translated.get("temperature"), translated.get("stop")),
        "openai-responses": (translated.get("max_output_tokens"), translated.get("temperature"), None),
        "google-gemini": ((g := translated.get("generationConfig", {})).get("maxOutputTokens"), g.get("temperature"),
                          g.get("stopSequences")),
    }[upstream]
    assert said == (300, 0.2, None if upstream == "openai-responses" else ["END"])


def test_sampling_options_are_left_out_for_anthropic() -> None:
    translated = translate_request("openai-chat", "anthropic-messages", conversation("openai-chat", "text"),
                                   model="c", stream=True)
    assert "temperature" not in translated.body and "top_p" not in translated.body
    assert translated.body["stop_sequences"] == ["END"] and translated.body["max_tokens"] == 300
    assert translated.left_out == ("`temperature`: anthropic-messages's newer models refuse sampling options",
                                   "`top_p`: anthropic-messages's newer models refuse sampling options")


def test_options_an_upstream_lacks_are_left_out_with_a_reason() -> None:
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], "n": 3, "logprobs": True,
            "stop": ["a", "b", "c", "d", "e", "f"], "seed": 7}
    to_responses = translate_request("openai-chat", "openai-responses", body, model="m", stream=True)
    assert to_responses.left_out == (
        "`logprobs`: an option of openai-chat with no counterpart in the other APIs",
        "`n`: one answer is asked, not several",
        "`seed`: openai-responses has no such option",
        "stop sequences: openai-responses has no such option",
    )
    to_gemini = translate_request("openai-chat", "google-gemini", body, model="m", stream=True)
    assert to_gemini.body["generationConfig"] == {"seed": 7, "stopSequences": ["a", "b", "c", "d", "e"]}
    assert "stop sequences past the first 5: google-gemini takes no more" in to_gemini.left_out


def test_an_option_name_that_is_not_a_name_is_not_quoted() -> None:
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], "my secret is 42": 1}
    left_out = translate_request("openai-chat", "anthropic-messages", body, model="m", stream=True).left_out
    assert left_out == ("an option: an option of openai-chat with no counterpart in the other APIs",)


@pytest.mark.parametrize(("client", "choice"), [
    ("openai-chat", "required"), ("anthropic-messages", {"type": "any"}), ("openai-responses", "required"),
])
@pytest.mark.parametrize("upstream", API_NAMES)
def test_a_required_tool_call_stays_required(client: str, choice: Any, upstream: str) -> None:
    if client == upstream:
        return
    body = conversation(client, "named_tool") | {"tool_choice": choice}
    out = translate_request(client, upstream, body, model="m", stream=True).body
    said = {"openai-chat": lambda: out["tool_choice"], "openai-responses": lambda: out["tool_choice"],
            "anthropic-messages": lambda: out["tool_choice"],
            "google-gemini": lambda: out["toolConfig"]["functionCallingConfig"]}[upstream]()
    assert said == {"openai-chat": "required", "openai-responses": "required", "anthropic-messages": {"type": "any"},
                    "google-gemini": {"mode": "ANY"}}[upstream]


# -- prefill: a trailing assistant message continues ----------------------------------------------

@pytest.mark.parametrize("client", API_NAMES)
def test_a_prefill_is_the_last_turn_in_every_api(client: str) -> None:
    def last(upstream: str) -> Any:
        body = translate_request(client, upstream, conversation(client, "prefill"), model="m", stream=True).body
        return {"openai-chat": lambda: body["messages"][-1], "openai-responses": lambda: body["input"][-1],
                "anthropic-messages": lambda: body["messages"][-1], "google-gemini": lambda: body["contents"][-1]}[
            upstream]()
    expected = {"openai-chat": {"role": "assistant", "content": "One, two,"},
                "openai-responses": {"type": "message", "role": "assistant", "content": "One, two,"},
                "anthropic-messages": {"role": "assistant", "content": "One, two,"},
                "google-gemini": {"role": "model", "parts": [{"text": "One, two,"}]}}
    for upstream in API_NAMES:
        if upstream != client:
            assert last(upstream) == expected[upstream]


def test_a_prefill_ending_in_a_space_reaches_anthropic_without_it() -> None:
    body = {"model": "g", "messages": [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, "}]}
    out = translate_request("openai-chat", "anthropic-messages", body, model="c", stream=True).body
    assert out["messages"][-1] == {"role": "assistant", "content": "One,"}  # Anthropic refuses trailing whitespace


# -- content that cannot be carried is refused, never dropped --------------------------------------

AUDIO_CHAT = {"model": "gpt-x", "messages": [{"role": "user", "content": [
    {"type": "text", "text": "Transcribe my secret note"},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]}


@pytest.mark.parametrize(("upstream", "reason"), [
    ("anthropic-messages", "an audio part in the conversation cannot be carried to anthropic-messages: it takes no sound"),
    ("openai-responses", "an audio part in the conversation cannot be carried to openai-responses: it takes no sound"),
])
def test_audio_is_refused_where_the_upstream_takes_no_sound(upstream: str, reason: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        translate_request("openai-chat", upstream, AUDIO_CHAT, model="m", stream=True)
    assert refused.value.reason == reason


def test_audio_reaches_gemini_inline() -> None:
    out = translate_request("openai-chat", "google-gemini", AUDIO_CHAT, model="m", stream=True).body
    assert out["contents"][0]["parts"][1] == {"inlineData": {"mimeType": "audio/wav", "data": "UklGRg=="}}


@pytest.mark.parametrize(("client", "body", "upstream", "reason"), [
    ("openai-responses", {"model": "m", "input": "go on", "previous_response_id": "resp_secret"}, "openai-chat",
     "the request cannot be carried out of OpenAI's Responses API: it continues a stored response "
     "(`previous_response_id`)"),
    ("anthropic-messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": "file_secret"}}]}]}, "openai-chat",
     "a file in the conversation cannot be carried to openai-chat: it is a file kept by anthropic"),
    ("google-gemini", {"contents": [{"role": "user", "parts": [{"fileData": {
        "mimeType": "application/pdf", "fileUri": "https://generativelanguage.googleapis.com/v1beta/files/secret"}}]}]},
     "anthropic-messages", "a file in the conversation cannot be carried to anthropic-messages: it is a file kept by google"),
    ("openai-chat", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/heic;base64,c2VjcmV0"}}]}]}, "anthropic-messages",
     "an image in the conversation cannot be carried to anthropic-messages: it takes only JPEG, PNG, GIF and WebP images"),
    ("openai-chat", {"model": "m", "messages": [{"role": "user", "content": "secret"},
                                                {"role": "tool", "tool_call_id": "call_9", "content": "secret"}]},
     "google-gemini", "a tool result in the conversation answers no call in it, and google-gemini needs the "
     "called tool's name"),
    ("google-gemini", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "cachedContent": "cachedContents/x"},
     "openai-chat", "the request uses content cached with Google (`cachedContent`), which no other API can read"),
])
def test_content_that_cannot_be_carried_is_refused_with_a_reason(client: str, body: dict[str, Any], upstream: str,
                                                                 reason: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        translate_request(client, upstream, body, model="m", stream=True)
    assert refused.value.reason == reason
    assert "secret" not in refused.value.reason


def test_a_heic_image_still_reaches_gemini() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/heic;base64,AAAA"}}]}]}
    out = translate_request("openai-chat", "google-gemini", body, model="m", stream=True).body
    assert out["contents"] == [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/heic", "data": "AAAA"}}]}]


# -- Gemini: two spellings, no call ids, its own schema dialect ----------------------------------

def test_gemini_snake_case_reads_as_camel_case() -> None:
    camel = conversation("google-gemini", "tools")
    snake = {"contents": [{"role": c["role"], "parts": [
        {{"functionCall": "function_call", "functionResponse": "function_response"}.get(k, k): v
         for k, v in p.items()} for p in c["parts"]]} for c in camel["contents"]],
        "system_instruction": camel["systemInstruction"],
        "tools": [{"function_declarations": [{"name": "get_weather", "description": "Weather in a city",
                                              "parameters_json_schema": WEATHER_SCHEMA}]}],
        "tool_config": {"function_calling_config": {"mode": "AUTO"}}}
    assert gist(gemini.decode(snake)) == gist(gemini.decode(camel)) == EXPECTED["tools"]


def test_gemini_results_link_to_their_calls_by_name_and_order() -> None:
    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "a", "args": {}}}, {"functionCall": {"name": "b", "args": {}}},
                                    {"functionCall": {"name": "a", "args": {"n": 2}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "b", "response": {"output": "B"}}},
                                   {"functionResponse": {"name": "a", "response": {"output": "A1"}}},
                                   {"functionResponse": {"name": "a", "response": {"error": "A2 failed"}}}]},
    ]}
    out = translate_request("google-gemini", "anthropic-messages", body, model="c", stream=True).body
    calls = [b["id"] for b in out["messages"][1]["content"]]
    results = [(b["tool_use_id"], b.get("is_error", False)) for b in out["messages"][2]["content"]]
    assert results == [(calls[1], False), (calls[0], False), (calls[2], True)]
    assert len(set(calls)) == 3


def test_gemini_schema_dialect_becomes_json_schema() -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "go"}]}], "tools": [{"functionDeclarations": [
        {"name": "f", "parameters": {"type": "OBJECT", "properties": {
            "n": {"type": "INTEGER", "nullable": True}, "tags": {"type": "ARRAY", "items": {"type": "STRING"}}},
            "required": ["n"], "propertyOrdering": ["n", "tags"]}}]}]}
    out = translate_request("google-gemini", "openai-chat", body, model="m", stream=True).body
    assert out["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {
        "n": {"type": ["integer", "null"]}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["n"]}


# -- ids, as each upstream takes them ---------------------------------------------------------------

def test_a_tool_call_id_anthropic_would_refuse_is_replaced_the_same_for_call_and_result() -> None:
    body = {"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"id": "functions.get:0", "type": "function",
                                              "function": {"name": "get", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.get:0", "content": "ok"}]}
    out = translate_request("openai-chat", "anthropic-messages", body, model="c", stream=True).body
    call_id = out["messages"][1]["content"][0]["id"]
    assert re.fullmatch(r"[A-Za-z0-9_-]+", call_id)
    assert out["messages"][2]["content"][0]["tool_use_id"] == call_id


def test_translated_result_is_a_value() -> None:
    body = conversation("openai-chat", "tools")
    before = json.dumps(body, sort_keys=True)
    first = translate_request("openai-chat", "google-gemini", body, model="m", stream=True)
    assert isinstance(first, TranslatedRequest)
    assert json.dumps(body, sort_keys=True) == before  # the client's body is not touched
    assert translate_request("openai-chat", "google-gemini", body, model="m", stream=True) == first


def test_the_same_api_on_both_sides_is_the_body_as_sent_for_the_upstreams_model() -> None:
    body = conversation("anthropic-messages", "tools")
    same = translate_request("anthropic-messages", "anthropic-messages", body, model="their-model", stream=True)
    assert same == TranslatedRequest({**body, "model": "their-model"})
    gemini_body = conversation("google-gemini", "tools")
    assert translate_request("google-gemini", "google-gemini", gemini_body, model="g", stream=True).body == gemini_body


def test_an_api_switchyard_does_not_speak_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown API: openai-completions"):
        translate_request("openai-completions", "openai-chat", {}, model="m", stream=True)


def test_an_output_limit_responses_would_refuse_is_raised_to_its_least() -> None:
    body = {"model": "c", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
    translated = translate_request("anthropic-messages", "openai-responses", body, model="m", stream=True)
    assert translated.body["max_output_tokens"] == 16
    assert translated.left_out == ("an output limit below 16: sent as 16, the least openai-responses takes",)
    assert translate_request("anthropic-messages", "openai-chat", body, model="m", stream=True).body[
        "max_completion_tokens"] == 1
