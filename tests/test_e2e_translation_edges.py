"""Falling back to another API's upstream, end to end, beyond the streamed answer: whole
(non-streaming) answers translated both ways, a translated upstream's fatal error told
in the client's API, content the upstream cannot take (it is not asked, and the client
hears why), and a Claude answer cut after output finished by an OpenAI Chat upstream.

The same real mitmdump, fake provider and official SDKs as test_e2e_translation.py
(routes and helpers: tests/support/xapi.py, xapi_env.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as gtypes

from tests.conftest import Env
from tests.support import gemini_wire, wire
from tests.support.fake_provider import Reply
from tests.support.xapi import (
    ANTHROPIC,
    BACKUP_KEY,
    CHAT,
    CLIENT_MODELS,
    GEMINI,
    PROMPT,
    RESPONSES,
    SHORT,
    STOP_WORDS,
    TOOL_DESCRIPTION,
    WEATHER_SCHEMA,
    anthropic_sdk,
    ask_whole_with_sdk,
    backup,
    chat_sdk,
    fail_primary,
    gemini_sdk,
    primary,
    stream_with_sdk,
    tool_answer,
    tools_sent,
)
from tests.support.xapi_env import asked, backup_request, base, env, xapi_mitm  # noqa: F401 -- fixtures

TOOL_ARGS = json.loads(wire.TOOL_ARGUMENTS)

# --- whole answers, both ways ------------------------------------------------------------

WHOLE = [(CHAT, ANTHROPIC), (ANTHROPIC, CHAT), (GEMINI, RESPONSES), (RESPONSES, GEMINI)]
WHOLE_IDS = [f"{client}->{up}" for client, up in WHOLE]


@pytest.mark.parametrize(("client", "up"), WHOLE, ids=WHOLE_IDS)
def test_a_whole_answer_is_translated_both_ways(env: Env, client: str, up: str) -> None:
    fail_primary(env.provider, client, up, stream=False)
    seen = ask_whole_with_sdk(client, base(env, client, up))
    assert seen.text == wire.answer_text(backup(client, up))
    assert seen.stop == STOP_WORDS[client][0]
    assert seen.usage == {CHAT: (5, 5), RESPONSES: (5, 5), ANTHROPIC: (10, 5), GEMINI: (8, 5)}[up]
    assert asked(env) == [primary(client, up), backup(client, up)]
    backup_request(env, client, up, stream=False)


@pytest.mark.parametrize(("client", "up"), WHOLE, ids=WHOLE_IDS)
def test_a_whole_tool_call_is_translated_both_ways(env: Env, client: str, up: str) -> None:
    fail_primary(env.provider, client, up, stream=False)
    env.provider.script(backup(client, up), tool_answer(up, stream=False))
    seen = ask_whole_with_sdk(client, base(env, client, up), tools=True)
    [(name, arguments, call_id)] = seen.calls
    assert (name, arguments) == (wire.TOOL_NAME, TOOL_ARGS) and call_id
    assert seen.stop == STOP_WORDS[client][1]
    body = backup_request(env, client, up, stream=False)
    assert tools_sent(up, body) == [(wire.TOOL_NAME, TOOL_DESCRIPTION, WEATHER_SCHEMA)]


# --- a translated upstream's fatal error, in the client's API ------------------------------

REFUSED = "max_tokens: 999999 > 64000, which is the maximum allowed for this model"


def refusal_body(up: str) -> dict[str, Any]:
    """A 400 as the backup's provider sends it."""
    if up == GEMINI:
        return gemini_wire.error(400, "INVALID_ARGUMENT", REFUSED)
    if up == ANTHROPIC:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": REFUSED},
                "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
    return {"error": {"message": REFUSED, "type": "invalid_request_error", "param": "max_tokens",
                      "code": "invalid_value"}}


FATAL = [(ANTHROPIC, CHAT), (CHAT, GEMINI), (GEMINI, ANTHROPIC), (RESPONSES, ANTHROPIC)]


@pytest.mark.parametrize(("client", "up"), FATAL, ids=[f"{c}->{u}" for c, u in FATAL])
def test_a_fatal_error_of_the_translated_backup_reaches_the_client_in_its_own_api(env: Env, client: str,
                                                                                  up: str) -> None:
    fail_primary(env.provider, client, up)
    env.provider.script(backup(client, up), Reply.json(400, refusal_body(up)))
    mark = env.mitm.log_mark()
    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError, genai_errors.ClientError)) as raised:
        stream_with_sdk(client, base(env, client, up))
    error = raised.value
    if client == GEMINI:
        assert isinstance(error, genai_errors.ClientError)
        assert (error.code, error.status, error.message) == (400, "INVALID_ARGUMENT", REFUSED)
    elif client == ANTHROPIC:
        assert isinstance(error, anthropic.BadRequestError)
        assert error.body == {"type": "error", "error": {"type": "invalid_request_error", "message": REFUSED}}
    else:
        assert isinstance(error, openai.BadRequestError)
        assert error.status_code == 400 and error.message.endswith(REFUSED)
        assert isinstance(error.body, dict) and error.body["message"] == REFUSED
    assert asked(env) == [primary(client, up), backup(client, up)]
    log = env.mitm.wait_for_log(f"switchyard.attempt_failed route={SHORT[client]}-to-{SHORT[up]} upstream=backup", mark)
    assert "decision=fatal" in log


def test_the_translated_backups_own_key_never_echoes_back_to_the_client(env: Env) -> None:
    """OpenAI's 401 quotes the key it was given: the Claude client hears the refusal, not the key."""
    fail_primary(env.provider, ANTHROPIC, CHAT)
    quoted = {"error": {"message": f"Incorrect API key provided: {BACKUP_KEY}. You can find your API key at "
                                   "https://platform.openai.com/account/api-keys.",
                        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    env.provider.script(backup(ANTHROPIC, CHAT), Reply.json(401, quoted))
    with pytest.raises(anthropic.AuthenticationError) as raised:
        stream_with_sdk(ANTHROPIC, base(env, ANTHROPIC, CHAT))
    said = json.dumps(raised.value.body)
    assert "Incorrect API key provided" in said and BACKUP_KEY not in said, said


def test_an_in_stream_refusal_of_an_anthropic_backup_reaches_a_chat_client_as_its_error(env: Env) -> None:
    """Before any output the client's head has not left: the refusal is a whole error answer."""
    fail_primary(env.provider, CHAT, ANTHROPIC)
    env.provider.script(backup(CHAT, ANTHROPIC), Reply.sse(wire.anthropic_error("invalid_request_error", REFUSED)))
    with pytest.raises(openai.BadRequestError) as raised:
        stream_with_sdk(CHAT, base(env, CHAT, ANTHROPIC))
    assert isinstance(raised.value.body, dict) and raised.value.body["message"] == REFUSED
    assert asked(env) == [primary(CHAT, ANTHROPIC), backup(CHAT, ANTHROPIC)]


def test_a_translated_upstreams_failure_stays_in_the_clients_api_when_a_later_upstream_is_unreachable(
        env: Env) -> None:
    """The route ends on a refused connection after the Anthropic upstream's overload: the
    client gets that overload, told as Chat tells one, never Anthropic's own stream."""
    env.provider.script("b-first", Reply.sse(wire.anthropic_error("overloaded_error", "Overloaded")))
    mark = env.mitm.log_mark()
    with pytest.raises(openai.APIError) as raised:
        stream_with_sdk(CHAT, f"{env.mitm.reverse_url}/p-first")
    error = raised.value
    assert isinstance(error, openai.APIStatusError), f"{type(error).__name__}: {error}"
    assert error.status_code >= 500 and isinstance(error.body, dict) and error.body["message"] == "Overloaded", error.body
    assert asked(env) == ["b-first"]
    env.mitm.wait_for_log("switchyard.attempt_failed route=chat-claude-first upstream=dead", mark)


# --- content that cannot be carried -------------------------------------------------------

WAV = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)).decode()


def test_audio_is_never_dropped_an_anthropic_backup_is_not_asked_and_the_client_hears_why(env: Env) -> None:
    fail_primary(env.provider, CHAT, ANTHROPIC)
    mark = env.mitm.log_mark()
    content: Any = [{"type": "text", "text": PROMPT}, {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}]
    with pytest.raises(openai.APIError) as raised:
        with chat_sdk(base(env, CHAT, ANTHROPIC)).chat.completions.stream(
                model=CLIENT_MODELS[CHAT], messages=[{"role": "user", "content": content}]) as stream:
            stream.get_final_completion()
    error = raised.value
    assert isinstance(error, openai.APIStatusError) and error.status_code == 502, error  # worth a retry later
    assert isinstance(error.body, dict) and error.body["code"] == "untranslatable", error.body
    assert "not asked" in error.message and "takes no sound" in error.message, error.message
    assert asked(env) == [primary(CHAT, ANTHROPIC)]  # the backup never got the request
    log = env.mitm.wait_for_log("upstream=backup", mark)
    line = next(line for line in log.splitlines() if "upstream=backup" in line)
    assert "untranslatable" in line and "sound" in line, line


def test_a_gemini_clients_audio_is_not_sent_to_an_anthropic_backup(env: Env) -> None:
    fail_primary(env.provider, GEMINI, ANTHROPIC)
    contents = [gtypes.Content(role="user", parts=[gtypes.Part(text=PROMPT), gtypes.Part(
        inline_data=gtypes.Blob(mime_type="audio/wav", data=base64.b64decode(WAV)))])]
    sdk = gemini_sdk(base(env, GEMINI, ANTHROPIC))
    with pytest.raises(genai_errors.APIError) as raised:
        for _ in sdk.models.generate_content_stream(model=CLIENT_MODELS[GEMINI], contents=contents):
            pass
    assert "takes no sound" in (raised.value.message or ""), raised.value
    assert asked(env) == [primary(GEMINI, ANTHROPIC)]


# --- a Claude answer cut after output, finished by an OpenAI Chat upstream -------------------

WHOLE_TEXT = "The quick brown fox jumps over the lazy dog."
HAD = 4  # words the client got before the cut


def cut_claude_answer() -> Reply:
    """An Anthropic stream that breaks off after its first words (no `message_stop`)."""
    frames = wire.anthropic_stream(WHOLE_TEXT)
    return Reply.sse(*frames[:3 + HAD])


@pytest.mark.parametrize("strategy", ["prefill", "regenerate"])
def test_a_cut_claude_answer_is_finished_by_an_openai_chat_upstream(env: Env, strategy: str) -> None:
    had = "".join(wire.chat_words(WHOLE_TEXT)[:HAD])
    env.provider.script(f"p-{strategy}", cut_claude_answer())
    if strategy == "regenerate":  # asked first, the cut primary is overloaded now
        env.provider.script(f"p-{strategy}", Reply.sse(wire.anthropic_error("overloaded_error", "Overloaded")))
    rest = WHOLE_TEXT[len(had):] if strategy == "prefill" else WHOLE_TEXT
    env.provider.script(f"b-{strategy}", Reply.sse(*wire.chat_stream(rest)))
    mark = env.mitm.log_mark()
    deltas: list[str] = []
    with anthropic_sdk(f"{env.mitm.reverse_url}/p-{strategy}").messages.stream(
            model=CLIENT_MODELS[ANTHROPIC], max_tokens=1024, messages=[{"role": "user", "content": PROMPT}]) as stream:
        deltas.extend(stream.text_stream)
        message = stream.get_final_message()
    assert "".join(deltas) == WHOLE_TEXT  # every character once, in order
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == WHOLE_TEXT  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    body = backup_request(env, ANTHROPIC, CHAT, name=f"b-{strategy}", prompt="" if strategy == "prefill" else PROMPT)
    if strategy == "prefill":
        assert body["messages"][-1] == {"role": "assistant", "content": had}
        assert body["messages"][-2]["role"] == "user"
    env.mitm.wait_for_log(f"switchyard.continued_after_cut route=messages-{strategy}-chat upstream=backup", mark)
    assert [c.upstream for c in env.provider.calls][-1] == f"b-{strategy}"
