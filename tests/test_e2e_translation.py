"""Falling back to an upstream that speaks another API (issue 25), end to end: one real
mitmdump with a route per ordered pair (client API, upstream API), the official SDKs
(`openai` chat.completions and responses, `anthropic` messages, `google-genai`) asking
through it, and the session's loopback fake provider answering as each provider does
(routes and helpers: tests/support/xapi.py).

In every pair the primary speaks the client's API and is overloaded before any output;
the backup speaks the other API, with its own model and key.  Each test asserts what
the SDK assembled (text, tool call, stop reason, usage) and what the backup was asked:
a valid request in its own API, its model, its key, none of the client's credentials.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider
from tests.support.mitm import Mitmdump, mitmdump_on
from tests.support.xapi import (
    ANTHROPIC,
    AUTH_HEADERS,
    BACKUP_AUTH,
    BACKUP_KEY,
    CHAT,
    CLIENT_KEYS,
    GEMINI,
    MODELS,
    PAIRS,
    PROMPT,
    RESPONSES,
    STOP_WORDS,
    TOOL_DESCRIPTION,
    WEATHER_SCHEMA,
    ask_whole_with_sdk,
    backup,
    backup_path,
    credentials_seen,
    fail_primary,
    pair_rules,
    primary,
    prompt_sent,
    stream_with_sdk,
    tool_answer,
    tools_sent,
)
from tests.test_translate_requests_shapes import sdk_valid

IDS = [f"{client}->{up}" for client, up in PAIRS]
TOOL_ARGS = json.loads(wire.TOOL_ARGUMENTS)


@pytest.fixture(scope="module")
def xapi_mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("mitm-xapi"), pair_rules(provider.ports[1]),
                     reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                     env={"SWY_XAPI_BACKUP_KEY": BACKUP_KEY}) as dump:
        yield dump


@pytest.fixture
def env(provider: FakeProvider, xapi_mitm: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, xapi_mitm, Path(xapi_mitm.log_path).parent / "rules.yaml")
    provider.reset()


def base(env: Env, client: str, up: str) -> str:
    return f"{env.mitm.reverse_url}/{primary(client, up)}"


def asked(env: Env) -> list[str]:
    return [call.upstream for call in env.provider.calls]


def backup_request(env: Env, client: str, up: str, *, stream: bool = True) -> dict:
    """The one request the backup got, checked as its provider would take it: at its own
    API's path, valid for its SDK's request type, its model, its own key, none of the
    client's credentials, the client's prompt."""
    [call] = env.provider.calls_to(backup(client, up))
    assert call.path == backup_path(up, backup(client, up), stream=stream)
    body = call.json()
    assert isinstance(body, dict)
    sdk_valid(up, body, stream=stream)
    if up == GEMINI:
        assert "model" not in body  # it lives in the path
        assert call.query == ("alt=sse" if stream else "")
    else:
        assert body["model"] == MODELS[up]
        assert body.get("stream", False) is stream
    assert call.headers[AUTH_HEADERS[up]] == BACKUP_AUTH[up]
    seen = credentials_seen(call)
    assert all(key not in seen for key in CLIENT_KEYS.values()), seen
    if up == ANTHROPIC:
        assert call.headers["anthropic-version"] == "2023-06-01"
    assert prompt_sent(up, body) == PROMPT
    return body


# --- (a) a text answer -------------------------------------------------------------------


@pytest.mark.parametrize(("client", "up"), PAIRS, ids=IDS)
def test_a_text_answer_comes_from_a_backup_of_another_api(env: Env, client: str, up: str) -> None:
    fail_primary(env.provider, client, up)
    mark = env.mitm.log_mark()
    seen = stream_with_sdk(client, base(env, client, up))
    assert seen.text == wire.answer_text(backup(client, up))
    assert seen.stop == STOP_WORDS[client][0]
    # the backup's own counts (tests/support/wire.py, gemini_wire.py), in the client's terms
    words = len(wire.answer_text(backup(client, up)).split(" "))
    assert seen.usage == {CHAT: (14, 8), RESPONSES: (5, 5), ANTHROPIC: (10, 5), GEMINI: (8, words)}[up]
    assert asked(env) == [primary(client, up), backup(client, up)]
    body = backup_request(env, client, up)
    if up == CHAT:  # usage is asked for: every other client always gets it
        assert body["stream_options"] == {"include_usage": True}
    env.mitm.wait_for_log(f"switchyard.fallback_answered route={client_short(client)}-to-", mark)


def client_short(client: str) -> str:
    return {CHAT: "chat", RESPONSES: "responses", ANTHROPIC: "messages", GEMINI: "gemini"}[client]


# --- (b) a tool call with streamed arguments, (c) tool definitions translated ----------------


@pytest.mark.parametrize(("client", "up"), PAIRS, ids=IDS)
def test_a_tool_call_comes_from_a_backup_of_another_api(env: Env, client: str, up: str) -> None:
    fail_primary(env.provider, client, up)
    env.provider.script(backup(client, up), tool_answer(up))
    seen = stream_with_sdk(client, base(env, client, up), tools=True)
    [(name, arguments, call_id)] = seen.calls
    assert name == wire.TOOL_NAME and arguments == TOOL_ARGS
    assert call_id, "the client sends the result back by this id"
    assert seen.stop == STOP_WORDS[client][1]
    if up == GEMINI:  # Gemini says its text beside no call here
        assert seen.text == ""
    assert asked(env) == [primary(client, up), backup(client, up)]
    body = backup_request(env, client, up)
    assert tools_sent(up, body) == [(wire.TOOL_NAME, TOOL_DESCRIPTION, WEATHER_SCHEMA)]
