"""Request translation for any text and any tool-call id, and the tool results
that carry images (docs/translation.md, "Requests")."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from switchyard_core.translate.request import API_NAMES, Untranslatable, translate_request

from .test_translate_requests import DECODERS, PAIRS, gist
from .test_translate_requests_shapes import PNG, sdk_valid

texts = st.text(min_size=1, max_size=40)


@st.composite
def chat_conversations(draw: st.DrawFn) -> dict[str, Any]:
    """A Chat conversation of alternating turns that ends with the user."""
    turns = draw(st.lists(texts, min_size=1, max_size=5))
    if len(turns) % 2 == 0:
        turns.append(draw(texts))
    messages = [{"role": "system", "content": draw(texts)}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "m", "messages": messages}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=chat_conversations(), upstream=st.sampled_from([a for a in API_NAMES if a != "openai-chat"]))
def test_any_text_reaches_every_upstream_as_written(body: dict[str, Any], upstream: str) -> None:
    translated = translate_request("openai-chat", upstream, body, model="m", stream=True)
    sdk_valid(upstream, translated.body)
    assert gist(DECODERS[upstream](translated.body)) == gist(DECODERS["openai-chat"](body))


def _links(api: str, body: dict[str, Any]) -> tuple[str, str]:
    """The call's id and its result's id, as the upstream receives them."""
    if api == "openai-responses":
        return body["input"][1]["call_id"], body["input"][2]["call_id"]
    if api == "anthropic-messages":
        return body["messages"][1]["content"][0]["id"], body["messages"][2]["content"][0]["tool_use_id"]
    if api == "google-gemini":
        call, result = body["contents"][1]["parts"][0], body["contents"][2]["parts"][0]
        assert result["functionResponse"]["name"] == call["functionCall"]["name"] == "lookup"
        return call["functionCall"]["id"], result["functionResponse"]["id"]
    return body["messages"][1]["tool_calls"][0]["id"], body["messages"][2]["tool_call_id"]


_FITS = {"anthropic-messages": re.compile(r"[A-Za-z0-9_-]+"), "openai-chat": re.compile(r"[\x21-\x7e]{1,40}")}


@settings(max_examples=60, deadline=None)
@given(call_id=st.text(min_size=1, max_size=80), client=st.sampled_from(["openai-chat", "anthropic-messages"]),
       upstream=st.sampled_from(API_NAMES))
def test_any_tool_call_id_still_links_the_call_to_its_result(call_id: str, client: str, upstream: str) -> None:
    if client == upstream:
        return
    body: dict[str, Any]
    if client == "openai-chat":
        body = {"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
                                                  "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "found"}]}
    else:
        body = {"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "lookup", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "found"}]}]}
    sent_call, sent_result = _links(upstream, translate_request(client, upstream, body, model="m", stream=True).body)
    assert sent_call == sent_result
    fits = _FITS.get(upstream)
    if fits is None or fits.fullmatch(call_id):
        assert sent_call == call_id  # carried unchanged wherever the upstream takes it
    else:
        assert fits.fullmatch(sent_call)


ANTHROPIC_IMAGE_RESULT = {"model": "c", "max_tokens": 100, "messages": [
    {"role": "user", "content": "Look at the screenshot"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "captured"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
        {"type": "text", "text": "What do you see?"}]},
]}


def test_a_tool_results_image_follows_the_tool_message_for_chat() -> None:
    out = translate_request("anthropic-messages", "openai-chat", ANTHROPIC_IMAGE_RESULT, model="m", stream=True).body
    assert out["messages"][2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "captured"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "text", "text": "What do you see?"}]},
    ]
    sdk_valid("openai-chat", out)


def test_a_tool_results_image_is_inside_the_result_for_responses() -> None:
    out = translate_request("anthropic-messages", "openai-responses", ANTHROPIC_IMAGE_RESULT, model="m",
                            stream=True).body
    assert out["input"][2] == {"type": "function_call_output", "call_id": "toolu_1", "output": [
        {"type": "input_text", "text": "captured"},
        {"type": "input_image", "detail": "auto", "image_url": f"data:image/png;base64,{PNG}"}]}
    sdk_valid("openai-responses", out)


def test_a_tool_results_image_follows_the_function_response_for_gemini() -> None:
    out = translate_request("anthropic-messages", "google-gemini", ANTHROPIC_IMAGE_RESULT, model="m",
                            stream=True).body
    assert out["contents"][2] == {"role": "user", "parts": [
        {"functionResponse": {"id": "toolu_1", "name": "screenshot", "response": {"output": "captured"}}},
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
        {"text": "What do you see?"}]}
    sdk_valid("google-gemini", out)


@pytest.mark.parametrize("upstream", ["openai-chat", "openai-responses"])
def test_an_image_the_model_made_is_refused_where_only_users_send_images(upstream: str) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "Draw a cat"}]},
                         {"role": "model", "parts": [{"inlineData": {"mimeType": "image/png", "data": PNG}}]},
                         {"role": "user", "parts": [{"text": "Now a dog"}]}]}
    with pytest.raises(Untranslatable) as refused:
        translate_request("google-gemini", upstream, body, model="m", stream=True)
    assert refused.value.reason == f"an image in the conversation cannot be carried to {upstream}: " \
                                   "it takes media only from the user"


@pytest.mark.parametrize(("client", "upstream"), PAIRS)
def test_an_empty_conversation_is_still_a_request(client: str, upstream: str) -> None:
    empty = {"openai-chat": {"model": "m", "messages": []}, "openai-responses": {"model": "m", "input": []},
             "anthropic-messages": {"model": "m", "max_tokens": 5, "messages": []},
             "google-gemini": {"contents": []}}[client]
    body = translate_request(client, upstream, empty, model="m", stream=True).body
    assert body.get("messages", body.get("input", body.get("contents"))) == []
