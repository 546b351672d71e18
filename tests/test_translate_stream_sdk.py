"""Translated answer streams, read by the official SDKs: all twelve pairs, text and tool calls.

Each upstream stream (the recorded fixtures, and tool-call streams built in each
provider's shape, provider-sse-shapes §1.3, §2.3, §3.2, §4.1) is translated into
the client's API, and then:

- every frame is validated with the client SDK's own pydantic type
  (`ChatCompletionChunk`, `ResponseStreamEvent`, `RawMessageStreamEvent`,
  `GenerateContentResponse`): the SDKs parse every event without complaint;
- the whole stream is served to the client SDK itself (its HTTP client on a mock
  transport) and read with its own accumulator (`chat.completions.stream`,
  `responses.stream`, `messages.stream`, `generate_content_stream`): the final
  message's text, tool call (name and arguments), stop reason and usage are what
  the upstream said.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from google import genai
from google.genai import types as gtypes
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from openai.types.shared import ErrorObject

from switchyard_core.apis.google_rpc import GRPC_HTTP
from switchyard_core.sse import FrameSplitter
from switchyard_core.translate.streams import stream_translator
from tests.support import gemini_wire, wire
from tests.support.xapi import Seen, read_anthropic, read_chat, read_gemini, read_responses

FIXTURES = Path(__file__).parent / "fixtures"
CHAT, RESPONSES, ANTHROPIC, GEMINI = "openai-chat", "openai-responses", "anthropic-messages", "google-gemini"
APIS = (CHAT, RESPONSES, ANTHROPIC, GEMINI)
PAIRS = [(up, client) for up in APIS for client in APIS if up != client]
MODEL = "translated-model"

RESPONSES_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
ANTHROPIC_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


@dataclass(frozen=True)
class Upstream:
    frames: list[bytes]
    text: str
    usage: tuple[int, int]  # input and output tokens, as OpenAI counts them
    call: tuple[str, dict[str, Any]] | None = None


def fixture(name: str) -> list[bytes]:
    return [(FIXTURES / name).read_bytes()]


TOOL_ARGS = json.loads(wire.TOOL_ARGUMENTS)

TEXT = {
    CHAT: Upstream(fixture("chat_normal_stream.sse"), "I'm unable.", (14, 30)),
    RESPONSES: Upstream(fixture("responses_normal_text.sse"), "Greetings", (13, 12)),
    ANTHROPIC: Upstream(fixture("anthropic_normal_text.sse"), "[12345,67890]", (135, 10)),
    GEMINI: Upstream(fixture("gemini_normal_text.sse"), "Certainly! …", (399, 191)),
}
WORDS = "Hello from the backup, all good: naïve café ✓."
BUILT_TEXT = {
    CHAT: Upstream(wire.chat_stream(WORDS), WORDS, (14, 8)),
    RESPONSES: Upstream(wire.responses_stream(WORDS), WORDS, (5, 5)),
    ANTHROPIC: Upstream(wire.anthropic_stream(WORDS), WORDS, (10, 5)),
    GEMINI: Upstream(gemini_wire.stream(WORDS), WORDS, (8, len(gemini_wire.words(WORDS)))),
}
TOOL = {
    CHAT: Upstream(wire.chat_tool_stream(), "", (149, 60), (wire.TOOL_NAME, TOOL_ARGS)),
    RESPONSES: Upstream(wire.responses_tool_stream(), "", (60, 24), (wire.TOOL_NAME, TOOL_ARGS)),
    ANTHROPIC: Upstream(wire.anthropic_tool_stream(), "", (656, 74), (wire.TOOL_NAME, TOOL_ARGS)),
    GEMINI: Upstream(gemini_wire.tool_call_stream(wire.TOOL_NAME, TOOL_ARGS, text="Let me look."), "Let me look.",
                     (8, 12), (wire.TOOL_NAME, TOOL_ARGS)),
}
# the client API's words for a natural end and for a tool-call answer
STOP_WORDS = {CHAT: ("stop", "tool_calls"), RESPONSES: ("completed", "completed"),
              ANTHROPIC: ("end_turn", "tool_use"), GEMINI: ("STOP", "STOP")}


def translate(up: str, client: str, frames: list[bytes], *, usage_wanted: bool = True) -> bytes:
    translator = stream_translator(up, client, model=MODEL, usage_wanted=usage_wanted)
    splitter = FrameSplitter()
    parsed = splitter.feed(b"".join(frames)) + splitter.finish()
    return b"".join(translator.feed(frame.event) for frame in parsed) + translator.finish()


def validate_frames(client: str, body: bytes) -> list[Any]:
    """Every event of `body` as the client SDK's own type (raises on any it rejects)."""
    splitter = FrameSplitter()
    events = []
    for frame in splitter.feed(body) + splitter.finish():
        event = frame.event
        if event.comment_only:
            continue
        assert event.data is not None
        if event.data == "[DONE]":
            continue
        data = json.loads(event.data)
        if "error" in data and client != RESPONSES:  # the error a client SDK raises, in its own types
            if client == CHAT:
                events.append(ErrorObject.model_validate(data["error"]))
            elif client == ANTHROPIC:
                assert event.event == "error"
                events.append(anthropic.types.ErrorResponse.model_validate(data))
            else:
                error = data["error"]
                assert isinstance(error["code"], int) and isinstance(error["message"], str), error
                assert error["status"] in GRPC_HTTP, error
                events.append(error)
            continue
        if client == CHAT:
            events.append(ChatCompletionChunk.model_validate(data))
        elif client == RESPONSES:
            events.append(RESPONSES_EVENT.validate_python(data))
            assert event.event == data["type"]
        elif client == ANTHROPIC:
            events.append(ANTHROPIC_EVENT.validate_python(data))
            assert event.event == data["type"]
        else:
            raw = frame.raw.lstrip(b"\r\n")  # a keepalive's blank line stays with the next frame
            assert raw.startswith(b"data: {") and raw.endswith(b"}\r\n\r\n") and raw.count(b"\n") == 2, raw
            events.append(gtypes.GenerateContentResponse.model_validate(data))
    return events


def _mock(body: bytes, content_type: str = "text/event-stream") -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def read_with_sdk(client: str, body: bytes) -> Seen:
    """The stream, served to the client API's official SDK and read with its accumulator."""
    seen = Seen()
    if client == CHAT:
        sdk = openai.OpenAI(api_key="sk-test", base_url="http://upstream.test/v1", http_client=_mock(body), max_retries=0)
        with sdk.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                         stream_options={"include_usage": True}) as stream:
            try:
                final: Any = stream.get_final_completion()
            except openai.LengthFinishReasonError as cut:  # the SDK's word for a length stop
                final = cut.completion
        read_chat(final, seen)
    elif client == RESPONSES:
        sdk = openai.OpenAI(api_key="sk-test", base_url="http://upstream.test/v1", http_client=_mock(body), max_retries=0)
        with sdk.responses.stream(model=MODEL, input="hi") as stream:
            response = stream.get_final_response()
        read_responses(response, seen)
    elif client == ANTHROPIC:
        sdk_a = anthropic.Anthropic(api_key="sk-ant-test", base_url="http://upstream.test", http_client=_mock(body),
                                    max_retries=0)
        with sdk_a.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as stream:
            message = stream.get_final_message()
        read_anthropic(message, seen)
    else:
        options = gtypes.HttpOptions(base_url="http://upstream.test", httpx_client=_mock(body))
        sdk_g = genai.Client(api_key="test-key", http_options=options)
        for chunk in sdk_g.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"):
            read_gemini(chunk, seen)
    return seen


def check(up: str, client: str, upstream: Upstream) -> Seen:
    body = translate(up, client, upstream.frames)
    validate_frames(client, body)
    seen = read_with_sdk(client, body)
    assert seen.text == upstream.text
    assert [(name, args) for name, args, _ in seen.calls] == ([upstream.call] if upstream.call else [])
    assert seen.stop == STOP_WORDS[client][1 if upstream.call else 0]
    assert seen.usage == upstream.usage
    return seen


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_recorded_text_reaches_the_client_sdk(up: str, client: str) -> None:
    check(up, client, TEXT[up])


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_streamed_text_reaches_the_client_sdk(up: str, client: str) -> None:
    check(up, client, BUILT_TEXT[up])


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_tool_call_reaches_the_client_sdk(up: str, client: str) -> None:
    seen = check(up, client, TOOL[up])
    call_id = seen.calls[0][2]
    assert call_id, "a client sends the result back by this id"
    if up != GEMINI:  # Gemini's calls carry no id here: the translator names them
        expected = {CHAT: "call_JMW1whyEaYG438VE1OIflxA2", RESPONSES: "call_DhtkoVLdnlohlERqrxpUjb25",
                    ANTHROPIC: "toolu_018acGYLtfR52q9yDbWaEdQZ"}[up]
        assert call_id == expected


@pytest.mark.parametrize("client", [c for c in APIS if c != CHAT])
def test_arguments_arrive_in_pieces_where_the_client_api_streams_them(client: str) -> None:
    """A Chat upstream's argument pieces stay pieces (one delta each) for Responses and
    Anthropic clients; a Gemini client gets the call whole, as Gemini sends one."""
    body = translate(CHAT, client, TOOL[CHAT].frames)
    pieces = wire.pieces(wire.TOOL_ARGUMENTS)
    if client == RESPONSES:
        deltas = [e.delta for e in validate_frames(client, body) if e.type == "response.function_call_arguments.delta"]
    elif client == ANTHROPIC:
        deltas = [e.delta.partial_json for e in validate_frames(client, body)
                  if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    else:
        calls = [p.function_call for e in validate_frames(client, body) for p in e.candidates[0].content.parts
                 if p.function_call is not None]
        assert [(c.name, c.args) for c in calls] == [(wire.TOOL_NAME, TOOL_ARGS)]
        return
    assert deltas == pieces


@pytest.mark.parametrize("client", [CHAT, RESPONSES, ANTHROPIC])
def test_a_gemini_call_is_one_start_and_one_argument_delta(client: str) -> None:
    body = translate(GEMINI, client, TOOL[GEMINI].frames)
    events = validate_frames(client, body)
    if client == CHAT:
        calls = [call for e in events for choice in e.choices for call in choice.delta.tool_calls or []]
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            (wire.TOOL_NAME, ""), (None, json.dumps(TOOL_ARGS))]
    elif client == RESPONSES:
        kinds = [e.type for e in events if "function_call" in e.type or e.type.startswith("response.output_item")]
        assert kinds == ["response.output_item.added", "response.output_item.done",  # the text's message
                         "response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done"]
    else:
        deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        assert deltas == [json.dumps(TOOL_ARGS)]


def test_chat_usage_chunk_only_when_the_client_asked_for_it() -> None:
    asked = translate(ANTHROPIC, CHAT, TEXT[ANTHROPIC].frames, usage_wanted=True)
    unasked = translate(ANTHROPIC, CHAT, TEXT[ANTHROPIC].frames, usage_wanted=False)
    assert [c.usage is not None for c in validate_frames(CHAT, asked)][-1] is True
    assert all(c.usage is None for c in validate_frames(CHAT, unasked))
    assert asked.endswith(b"data: [DONE]\n\n") and unasked.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("up", [c for c in APIS if c != RESPONSES])
def test_responses_client_gets_the_items_in_completed(up: str) -> None:
    """Codex keeps the finished items: each `output_item.done` and `response.completed`
    carry the same whole items (text and call), as OpenAI sends them."""
    events = validate_frames(RESPONSES, translate(up, RESPONSES, TOOL[up].frames))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output == done
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert done[-1].type == "function_call" and json.loads(done[-1].arguments) == TOOL_ARGS


@pytest.mark.parametrize("client", [CHAT, ANTHROPIC, GEMINI])
def test_incomplete_response_is_a_length_stop(client: str) -> None:
    """`response.incomplete` for `max_output_tokens` ends the client's answer with its
    API's word for the token limit."""
    frames = wire.responses_stream("cut short")
    completed = json.loads(frames[-1].split(b"data: ", 1)[1])
    completed["type"] = "response.incomplete"
    completed["response"].update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    frames[-1] = wire.event("response.incomplete", completed)
    body = translate(RESPONSES, client, frames)
    validate_frames(client, body)
    seen = read_with_sdk(client, body)
    assert seen.text == "cut short"
    assert seen.stop == {CHAT: "length", ANTHROPIC: "max_tokens", GEMINI: "MAX_TOKENS"}[client]


@pytest.mark.parametrize("up", [CHAT, ANTHROPIC, GEMINI])
def test_responses_client_sees_incomplete_for_a_length_stop(up: str) -> None:
    frames = {CHAT: [*wire.chat_stream("cut short")[:-3], wire.chat_chunk({}, "length"), wire.CHAT_DONE],
              ANTHROPIC: [f.replace(b'"end_turn"', b'"max_tokens"') for f in wire.anthropic_stream("cut short")],
              GEMINI: [f.replace(b'"STOP"', b'"MAX_TOKENS"') for f in gemini_wire.stream("cut short")]}[up]
    events = validate_frames(RESPONSES, translate(up, RESPONSES, frames))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == "cut short"


def test_anthropic_refusal_is_a_content_filter_stop() -> None:
    body = translate(ANTHROPIC, CHAT, fixture("anthropic_refusal_no_content.sse"))
    with pytest.raises(openai.ContentFilterFinishReasonError):  # what the SDK makes of a filtered answer
        read_with_sdk(CHAT, body)
    reasons = [choice.finish_reason for chunk in validate_frames(CHAT, body) for choice in chunk.choices]
    assert [reason for reason in reasons if reason] == ["content_filter"]


THOUGHT = "Let me think about the weather."


def reasoning_frames(up: str) -> list[bytes]:
    """A text answer after reasoning, in `up`'s shape."""
    if up == CHAT:  # DeepSeek's
        return [
            wire.chat_chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
            *[wire.chat_chunk({"content": None, "reasoning_content": w}) for w in wire.chat_words(THOUGHT)],
            *wire.chat_stream(WORDS)[1:]]
    if up == ANTHROPIC:
        start, *rest = wire.anthropic_stream(WORDS)
        thinking = [wire.event("content_block_start", {"type": "content_block_start", "index": 0,
                                                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                    *[wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                         "delta": {"type": "thinking_delta", "thinking": w}})
                      for w in wire.chat_words(THOUGHT)],
                    wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                       "delta": {"type": "signature_delta", "signature": "c2ln"}}),
                    wire.event("content_block_stop", {"type": "content_block_stop", "index": 0})]
        return [start, *thinking, *[f.replace(b'"index":0', b'"index":1') for f in rest]]
    if up == RESPONSES:
        return wire.responses_stream(WORDS, reasoning=[wire.Reasoning("rs_1", (THOUGHT,))])
    thought = gemini_wire.frame({"candidates": [{"content": {"parts": [{"text": THOUGHT, "thought": True}], "role": "model"},
                                                 "index": 0}], "responseId": "fake-response-1"})
    return [thought, *gemini_wire.stream(WORDS)]


@pytest.mark.parametrize(("up", "client"), PAIRS)
def test_reasoning_goes_where_the_client_api_can_take_it(up: str, client: str) -> None:
    """Chat clients get `reasoning_content` deltas, Gemini clients `thought` parts;
    Anthropic and Responses clients get none (a keepalive in its place) and the
    translator says it dropped reasoning.  The answer's text is the same either way."""
    translator = stream_translator(up, client, model=MODEL, usage_wanted=True)
    splitter = FrameSplitter()
    frames = splitter.feed(b"".join(reasoning_frames(up))) + splitter.finish()
    body = b"".join(translator.feed(frame.event) for frame in frames) + translator.finish()
    events = validate_frames(client, body)
    assert read_with_sdk(client, body).text == WORDS
    if client == CHAT:
        carried = "".join((choice.delta.model_extra or {}).get("reasoning_content") or ""
                          for chunk in events for choice in chunk.choices)
    elif client == GEMINI:
        carried = "".join(part.text for e in events for part in e.candidates[0].content.parts if part.thought)
    else:
        assert b" about" not in body and b"weather" not in body  # no word of the reasoning
        assert not any("reasoning" in e.type or "thinking" in e.type for e in events)
        if client == ANTHROPIC:
            assert [e.content_block.type for e in events if e.type == "content_block_start"] == ["text"]
        assert body.count(b": keepalive\n\n") >= 1
        assert "reasoning" in translator.dropped
        return
    assert carried == THOUGHT and "reasoning" not in translator.dropped


@pytest.mark.parametrize("client", [RESPONSES, ANTHROPIC, GEMINI])
def test_parallel_calls_the_first_without_arguments(client: str) -> None:
    """Two calls in one answer, the first taking no arguments: both reach the client,
    in order, the first with `{}`."""
    header = [wire.chat_chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
              for i, name in enumerate(("get_time", wire.TOOL_NAME))]
    frames = [wire.chat_chunk({"role": "assistant", "content": None}), header[0], header[1],
              *[wire.chat_chunk({"tool_calls": [{"index": 1, "function": {"arguments": p}}]})
                for p in wire.pieces(wire.TOOL_ARGUMENTS)],
              wire.chat_chunk({}, "tool_calls"), wire.CHAT_DONE]
    body = translate(CHAT, client, frames)
    validate_frames(client, body)
    seen = read_with_sdk(client, body)
    assert [(name, args, call_id) for name, args, call_id in seen.calls] == [
        ("get_time", {}, "call_0"), (wire.TOOL_NAME, TOOL_ARGS, "call_1")]
    assert seen.stop == STOP_WORDS[client][1]
