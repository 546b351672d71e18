"""mitmweb's client flow when an upstream of another API answered: it shows the request
that upstream was sent (its URL, its own API's body, its own credential redacted),
so that a replay asks what was asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy.test import tflow

from switchyard_core.addons.flow_story import FlowAddress, FlowView, restore
from switchyard_core.exchange import AttemptRecord, Exchange, OriginalRequest
from switchyard_core.rules import load_rules
from switchyard_core.upstreams.translated import translated_display_url

RULES = """\
version: 1
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    upstreams:
      - {name: openai, url: original}
      - name: claude
        url: https://api.anthropic.com/v1/messages
        api: anthropic-messages
        model: claude-backup
        auth: {header: x-api-key, value: "${SWY_TEST_CLAUDE_KEY}"}
"""


def test_the_client_flow_shows_the_translated_request_the_answering_upstream_got(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWY_TEST_CLAUDE_KEY", "sk-ant-SECRET-123456")
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    route = load_rules(path).routes[0]
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    original = OriginalRequest.of("POST", "https://api.openai.com/v1/chat/completions",
                                  (("Authorization", "Bearer sk-client-XYZ"),), json.dumps(body).encode(), body)
    exchange = Exchange(route, original)
    claude = route.upstreams[1]
    url = translated_display_url(claude, True)
    exchange.attempts.append(AttemptRecord(attempt=1, upstream="claude", url=url, started=0.0,
                                           request_headers=(("x-api-key", "sk-ant-SECRET-123456"),),
                                           secret_headers=claude.secret_headers))
    exchange.answered_by, exchange.answered_url = "claude", url
    flow = tflow.tflow()
    data = flow.request.data
    restore(flow, exchange, FlowView(FlowAddress(data.scheme, data.host, data.port, data.authority, data.path,
                                                 data.method)))
    assert flow.request.url == "https://api.anthropic.com/v1/messages"
    sent = json.loads(flow.request.raw_content or b"")
    assert sent["model"] == "claude-backup" and sent["messages"] == [{"role": "user", "content": "hi"}]
    assert sent["max_tokens"] > 0  # Anthropic's own required field: the body is in its API
    assert flow.request.headers["x-api-key"] == "[redacted]"
    assert b"sk-client" not in bytes(flow.request.headers) and b"SECRET" not in bytes(flow.request.headers)
