"""The cross-API end-to-end tests' mitmdump (tests/support/xapi.py's routes, and a few
more for continuations), as fixtures, and what the tests read back from the fake provider.

A test module takes the fixtures by importing `env` and `xapi_mitm`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Env
from tests.support.fake_provider import FakeProvider
from tests.support.mitm import Mitmdump, mitmdump_on, refused_port
from tests.support.xapi import (
    ANTHROPIC,
    AUTH_HEADERS,
    BACKUP_AUTH,
    BACKUP_KEY,
    CHAT,
    CLIENT_KEYS,
    GEMINI,
    MODELS,
    PROMPT,
    backup,
    backup_path,
    credentials_seen,
    pair_route,
    pair_rules,
    primary,
    prompt_sent,
)
from tests.test_translate_requests_shapes import sdk_valid

# a Claude answer cut after output, finished by an OpenAI Chat upstream
CONTINUING = {"prefill": "/p-prefill", "regenerate": "/p-regenerate"}


def continuation_routes(port: int) -> str:
    routes = ""
    for strategy, prefix in CONTINUING.items():
        route = pair_route(ANTHROPIC, CHAT, port, extra=f"    continue_after_cut: [{strategy}]\n",
                           backup_extra="        prefill: true\n" if strategy == "prefill" else "")
        routes += (route.replace("name: messages-to-chat", f"name: messages-{strategy}-chat")
                   .replace(f"/{primary(ANTHROPIC, CHAT)}/", f"{prefix}/")
                   .replace(f"/{backup(ANTHROPIC, CHAT)}/", f"/b-{strategy}/"))
    return routes


def translated_first_route(port: int, dead: int) -> str:
    """A Chat route whose first upstream speaks Anthropic, its second unreachable."""
    return f"""\
  - name: chat-claude-first
    api: openai-chat
    match: {{path: /p-first/v1/chat/completions}}
    upstreams:
      - name: claude
        api: anthropic-messages
        url: http://127.0.0.1:{port}/b-first/v1/messages
        model: {MODELS[ANTHROPIC]}
        retries: 0
        auth: {{header: x-api-key, value: "${{SWY_XAPI_BACKUP_KEY}}"}}
      - {{name: dead, url: "http://127.0.0.1:{dead}/dead/v1/chat/completions", retries: 0}}
"""


@pytest.fixture(scope="module")
def xapi_mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    rules = (pair_rules(provider.ports[1]) + continuation_routes(provider.ports[1])
             + translated_first_route(provider.ports[1], refused_port()))
    with mitmdump_on(tmp_path_factory.mktemp("mitm-xapi"), rules, reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                     env={"SWY_XAPI_BACKUP_KEY": BACKUP_KEY}) as dump:
        yield dump


@pytest.fixture
def env(provider: FakeProvider, xapi_mitm: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, xapi_mitm, Path(xapi_mitm.log_path).parent / "rules.yaml")
    provider.reset()


def base(env: Env, client: str, up: str) -> str:
    """The SDK's base URL for the route of this pair, at mitmdump's reverse listener."""
    return f"{env.mitm.reverse_url}/{primary(client, up)}"


def asked(env: Env) -> list[str]:
    return [call.upstream for call in env.provider.calls]


def backup_request(env: Env, client: str, up: str, *, stream: bool = True, name: str | None = None,
                   prompt: str = PROMPT) -> dict:
    """The one request the backup got, checked as its provider would take it: at its own
    API's path, valid for its SDK's request type, its model, its own key, none of the
    client's credentials, the client's prompt."""
    name = name or backup(client, up)
    [call] = env.provider.calls_to(name)
    assert call.path == backup_path(up, name, stream=stream)
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
    if prompt:
        assert prompt_sent(up, body) == prompt
    return body
