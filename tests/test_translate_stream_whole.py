"""Whole (non-streaming) answers translated between the APIs, read as the SDKs' own types.

Each upstream's whole answer (text, and a tool call) becomes the client API's
whole answer, validated with its SDK's response type (`ChatCompletion`,
`anthropic.types.Message`, `openai.types.responses.Response`,
`GenerateContentResponse`): the text, the call's name and arguments, the stop
reason and the usage are what the upstream said.  An error the body carries
comes out as the client API's error body.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from google.genai import types as gtypes
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from switchyard_core.apis import APIS
from switchyard_core.apis.base import FrameKind
from switchyard_core.sse import SseEvent
from switchyard_core.translate.streams import error_status, translate_whole
from tests.support import gemini_wire, wire
from tests.test_translate_stream_sdk import APIS as NAMES
from tests.test_translate_stream_sdk import PAIRS, STOP_WORDS, TOOL_ARGS

TEXT = "Hello from the backup, all good."
TEXT_BODIES: dict[str, tuple[Any, tuple[int, int]]] = {
    "openai-chat": (wire.chat_completion(TEXT), (5, 5)),
    "openai-responses": (wire.normal_body("/v1/responses", "backup"), (5, 5)),
    "anthropic-messages": (wire.normal_body("/v1/messages", "backup"), (10, 5)),
    "google-gemini": (gemini_wire.response(TEXT), (8, 5)),
}
TOOL_USAGE = {"openai-chat": (149, 60), "openai-responses": (60, 24), "anthropic-messages": (656, 74),
              "google-gemini": (8, 12)}


def read(client: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, Any]]], str | None, tuple[int, int]]:
    """text, calls, stop reason and usage, as the client SDK's own type holds them."""
    if client == "openai-chat":
        completion = ChatCompletion.model_validate(body)
        message = completion.choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
                 if c.type == "function"]
        assert completion.usage is not None
        return (message.content or "", calls, completion.choices[0].finish_reason,
                (completion.usage.prompt_tokens, completion.usage.completion_tokens))
    if client == "openai-responses":
        response = Response.model_validate(body)
        calls = [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]
        assert response.usage is not None
        return response.output_text, calls, response.status, (response.usage.input_tokens, response.usage.output_tokens)
    if client == "anthropic-messages":
        message = anthropic.types.Message.model_validate(body)
        text = "".join(block.text for block in message.content if block.type == "text")
        calls = [(block.name, dict(block.input)) for block in message.content if block.type == "tool_use"]
        return text, calls, message.stop_reason, (message.usage.input_tokens, message.usage.output_tokens)
    gemini = gtypes.GenerateContentResponse.model_validate(body)
    candidate = gemini.candidates[0]  # type: ignore[index]
    parts = candidate.content.parts or []  # type: ignore[union-attr]
    meta = gemini.usage_metadata
    assert meta is not None and candidate.finish_reason is not None
    return ("".join(p.text or "" for p in parts if not p.thought),
            [(p.function_call.name or "", dict(p.function_call.args or {})) for p in parts if p.function_call],
            candidate.finish_reason.value, (meta.prompt_token_count or 0, meta.candidates_token_count or 0))


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_whole_text_answer(up: str, client: str) -> None:
    body, usage = TEXT_BODIES[up]
    text = TEXT if up in ("openai-chat", "google-gemini") else wire.answer_text("backup")
    assert read(client, translate_whole(up, client, body, model="m")) == (text, [], STOP_WORDS[client][0], usage)


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_whole_tool_call_answer(up: str, client: str) -> None:
    got = read(client, translate_whole(up, client, wire.tool_body(up), model="m"))
    assert got == ("", [(wire.TOOL_NAME, TOOL_ARGS)], STOP_WORDS[client][1], TOOL_USAGE[up])


@pytest.mark.parametrize("client", [name for name in NAMES if name != "google-gemini"])
def test_gemini_array_answer_is_read_whole(client: str) -> None:
    """`streamGenerateContent` without `alt=sse` answers a JSON array of responses."""
    frames = [json.loads(frame.split(b"data: ", 1)[1]) for frame in gemini_wire.stream(TEXT)]
    text, calls, _, _ = read(client, translate_whole("google-gemini", client, frames, model="m"))
    assert (text, calls) == (TEXT, [])


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_an_error_body_becomes_the_clients_error(up: str, client: str) -> None:
    body = wire.error_body(up, 503, "provider overloaded")
    translated = translate_whole(up, client, body, model="m")
    info = APIS[client].body_error(translated)
    assert info is not None and info.message == "provider overloaded"
    event = SseEvent(data=json.dumps(translated))
    assert APIS[client].stream_classifier().classify(event).kind is FrameKind.FAILURE
    found = APIS[up].body_error(body)
    assert found is not None
    assert error_status(client, found) == 503


def test_reasoning_is_dropped_for_anthropic_and_said() -> None:
    body = wire.chat_completion(TEXT)
    body["choices"][0]["message"]["reasoning_content"] = "thinking it over"
    dropped: set[str] = set()
    message = translate_whole("openai-chat", "anthropic-messages", body, model="m", dropped=dropped)
    assert [block["type"] for block in message["content"]] == ["text"] and dropped == {"reasoning"}
    gemini = translate_whole("openai-chat", "google-gemini", body, model="m")
    assert gemini["candidates"][0]["content"]["parts"][0] == {"text": "thinking it over", "thought": True}
