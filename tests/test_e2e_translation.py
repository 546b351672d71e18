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

import pytest

from tests.conftest import Env
from tests.support import wire
from tests.support.xapi import (
    ANTHROPIC,
    CHAT,
    GEMINI,
    PAIRS,
    RESPONSES,
    SHORT,
    STOP_WORDS,
    TOOL_DESCRIPTION,
    WEATHER_SCHEMA,
    backup,
    fail_primary,
    primary,
    stream_with_sdk,
    tool_answer,
    tools_sent,
)
from tests.support.xapi_env import asked, backup_request, base, env, xapi_mitm  # noqa: F401 -- fixtures

IDS = [f"{client}->{up}" for client, up in PAIRS]
TOOL_ARGS = json.loads(wire.TOOL_ARGUMENTS)


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
    env.mitm.wait_for_log(f"switchyard.fallback_answered route={SHORT[client]}-to-{SHORT[up]} upstream=backup", mark)


# --- (b) a tool call with streamed arguments, (c) tool definitions translated ----------------


@pytest.mark.parametrize(("client", "up"), PAIRS, ids=IDS)
def test_a_tool_call_comes_from_a_backup_of_another_api(env: Env, client: str, up: str) -> None:
    fail_primary(env.provider, client, up)
    env.provider.script(backup(client, up), tool_answer(up))
    seen = stream_with_sdk(client, base(env, client, up), tools=True)
    [(name, arguments, call_id)] = seen.calls
    assert name == wire.TOOL_NAME and arguments == TOOL_ARGS
    assert call_id, "the client sends the result back by this id"
    # streamed in pieces where both APIs stream them (Gemini sends and takes a call whole)
    pieces = len(wire.pieces(wire.TOOL_ARGUMENTS))
    assert seen.argument_pieces == (0 if client == GEMINI else 1 if up == GEMINI else pieces)
    assert seen.stop == STOP_WORDS[client][1]
    if up == GEMINI:  # Gemini says its text beside no call here
        assert seen.text == ""
    assert asked(env) == [primary(client, up), backup(client, up)]
    body = backup_request(env, client, up)
    assert tools_sent(up, body) == [(wire.TOOL_NAME, TOOL_DESCRIPTION, WEATHER_SCHEMA)]
