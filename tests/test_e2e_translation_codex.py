"""The real Codex CLI finishing a turn on an Anthropic backup (issue 25), through a real
mitmdump, against loopback fakes only: its Responses primary is overloaded before any
output, over WebSocket (its built-in provider: a `generate: false` warm-up, then the real
turn) and over HTTP SSE (a custom provider); the backup speaks Anthropic Messages, with
its own model and key, and Codex prints the backup's answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import wire
from tests.support.fake_provider import FakeProvider
from tests.support.mitm import start_mitmdump
from tests.support.ws_provider import WsProvider, failed_turn, warm_up_turn
from tests.support.xagents import BACKUP_KEY, OverloadedPrimary, agent_bed, posts
from tests.test_e2e_codex import API_KEY, run_codex
from tests.test_e2e_codex_websocket import codex
from tests.test_translate_requests_shapes import sdk_valid

ANSWER = wire.answer_text("claude")  # the fake's normal answer at /claude/v1/messages


def claude_backup(port: int) -> str:
    return f"""\
      - name: claude
        api: anthropic-messages
        url: http://127.0.0.1:{port}/claude/v1/messages
        model: claude-sonnet-4-5
        auth: {{header: x-api-key, value: "${{SWY_XAGENTS_KEY}}"}}
"""


def declared_tools(codex_request: dict) -> list[str]:
    """The names of the function and free-text tools Codex declared (in `tools`, or in an
    `additional_tools` input item, grouped in namespaces)."""
    found: list[str] = []

    def read(tools: list[dict]) -> None:
        for tool in tools:
            if tool["type"] == "namespace":
                read(tool["tools"])
            elif tool["type"] in ("function", "custom") and tool["name"] not in found:
                found.append(tool["name"])

    read(codex_request.get("tools") or [])
    for item in codex_request["input"]:
        if item.get("type") == "additional_tools":
            read(item["tools"])
    return found


def asked_of_claude(provider: FakeProvider, codex_request: dict) -> dict:
    """The one request the Anthropic backup got: Codex's turn in Anthropic's terms."""
    [call] = [c for c in provider.calls_to("claude") if c.method == "POST"]
    assert call.path == "/v1/messages"
    assert call.headers["x-api-key"] == BACKUP_KEY and call.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in call.headers  # Codex's own key stays with OpenAI
    body = json.loads(call.body)
    sdk_valid("anthropic-messages", body)  # the anthropic SDK's own request type takes it
    assert body["model"] == "claude-sonnet-4-5" and body["stream"] is True
    assert body["system"]  # Codex's instructions
    # Codex's tools, every one (a free-text tool as a function of one string, `input`)
    assert [tool["name"] for tool in body["tools"]] == declared_tools(codex_request) != []
    free_text = [tool for tool in body["tools"] if tool["name"] == "exec"]
    assert [tool["input_schema"]["properties"] for tool in free_text] == [{"input": {"type": "string"}}]
    assert body["messages"][-1]["role"] == "user"
    return body


@pytest.fixture
def backup() -> Iterator[FakeProvider]:
    provider = FakeProvider().start()
    yield provider
    provider.stop()


def test_codex_over_websocket_finishes_its_turn_on_an_anthropic_backup(tmp_path: Path, backup: FakeProvider) -> None:
    primary = WsProvider().start()
    turns: list[list[str | bytes | float]] = [[*warm_up_turn("resp_warm")], [*failed_turn("resp_f1")],
                                              [*failed_turn("resp_f2")]]
    primary.script(*turns)
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\ndefaults: {retries: 1, backoff_ms: 1, max_skip_s: 0, unreachable_skip_s: 0}\n"
                     "routes:\n  - name: codex\n    match: {path: /v1/responses}\n    upstreams:\n"
                     "      - {name: primary, url: original}\n" + claude_backup(backup.ports[1]))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", reverse_target=f"http://127.0.0.1:{primary.port}",
                          env={"SWY_XAGENTS_KEY": BACKUP_KEY})
    try:
        mark = dump.log_mark()
        run = codex(tmp_path, dump, "say hi")
        log = dump.wait_for_log("switchyard.fallback_answered route=codex upstream=claude", mark)
    finally:
        dump.stop()
        primary.stop()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.strip() == ANSWER
    assert "Reconnecting" not in run.stderr and "capacity" not in run.stderr.lower()
    warm, real, again = (json.loads(text) for text in primary.creates)
    assert warm["generate"] is False and real == again  # the real turn, tried twice on the primary's socket
    body = asked_of_claude(backup, real)
    # the turn the backup got is the folded one: the real turn's input, in Anthropic's terms
    said = json.dumps(body["messages"])
    assert all(part["text"] in said for item in real["input"] if item.get("role") == "user"
               for part in item["content"] if part.get("type") == "input_text" and len(part["text"]) < 200)
    assert "transport=websocket" in log


HTTP_ROUTES = """\
  - name: codex-http
    match: {{path: /primary/v1/responses}}
    upstreams:
      - {{name: primary, url: original, retries: 1}}
"""


def test_codex_over_http_finishes_its_turn_on_an_anthropic_backup(tmp_path: Path) -> None:
    provider = OverloadedPrimary("response_failed")  # `response.failed` server_is_overloaded, as OpenAI sends it
    routes = HTTP_ROUTES + claude_backup(0).replace(":0/", ":{p2}/").replace("{", "{{").replace("}", "}}") \
        .replace("{{p2}}", "{p2}")
    with agent_bed(tmp_path, provider, routes) as bed:
        mark = bed.mitm.log_mark()
        done = run_codex(bed, bed.through_switchyard() + "/v1", "http")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert ANSWER in done.stdout
        assert len(posts(bed, "primary")) == 2
        assert posts(bed, "primary")[0].headers["Authorization"] == f"Bearer {API_KEY}"
        asked_of_claude(provider, json.loads(posts(bed, "primary")[0].body))
        assert bed.client_requests(mark, "/claude/v1/messages") == 1  # Codex asked once
        bed.mitm.wait_for_log("switchyard.fallback_answered route=codex-http upstream=claude", mark)
