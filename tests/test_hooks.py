"""The mitmproxy-facing hooks, with mitmproxy's own test helpers (taddons, tflow)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from mitmproxy import exceptions
from mitmproxy.http import Headers, Response
from mitmproxy.test import taddons, tflow

from switchyard_core.addons import Router, RulesKeeper
from switchyard_core.relay import TOKEN_HEADER

RULES = """\
version: 1
routes:
  - name: chat
    match: {host: api.openai.com, path: /v1/chat/completions, model: "gpt-4o*"}
    upstreams:
      - {name: openai, url: original}
      - name: backup
        url: https://backup.example.com/v1/chat/completions
        auth: {header: Authorization, value: "Bearer backup-key-123"}
"""


def chat_flow(host: str = "api.openai.com", path: str = "/v1/chat/completions", model: str = "gpt-4o") -> tflow.HTTPFlow:
    flow = tflow.tflow()
    flow.request.scheme = "https"
    flow.request.host = host
    flow.request.port = 443
    flow.request.path = path
    flow.request.method = "POST"
    flow.request.headers = Headers(host=host, authorization="Bearer sk-client-abc", content_type="application/json")
    flow.request.content = json.dumps({"model": model, "stream": True, "messages": []}).encode()
    return flow


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


async def test_matching_flow_is_re_aimed_at_the_relay_with_a_single_use_token(rules_file: Path) -> None:
    keeper = RulesKeeper()
    router = Router(keeper)
    with taddons.context(keeper, router) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        flow = chat_flow()
        await router.request(flow)
        assert router.relay is not None and router.relay.port
        assert (flow.request.scheme, flow.request.host, flow.request.port) == ("http", "127.0.0.1", router.relay.port)
        assert flow.server_conn.address == ("127.0.0.1", router.relay.port)
        assert flow.server_conn.via is None
        token = flow.request.headers[TOKEN_HEADER]
        assert len(token) >= 20
        assert flow.metadata["switchyard"]["route"] == "chat"
        # the relay shows mitmweb the truth once headers are back: the original URL, no token
        flow.response = Response.make(200, b"", {"content-type": "text/event-stream"})
        router.responseheaders(flow)
        assert flow.request.url == "https://api.openai.com/v1/chat/completions"
        assert flow.request.headers["host"] == "api.openai.com"
        assert TOKEN_HEADER not in flow.request.headers
        assert flow.response.stream  # SSE answers stream through
        await router.done()


@pytest.mark.parametrize(
    "flow_args",
    [{"host": "example.com"}, {"path": "/v1/embeddings"}, {"model": "o3-mini"}],
    ids=["other-host", "other-path", "other-model"],
)
async def test_flows_that_match_no_route_are_not_touched(rules_file: Path, flow_args: dict[str, str]) -> None:
    keeper = RulesKeeper()
    router = Router(keeper)
    with taddons.context(keeper, router) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        flow = chat_flow(**flow_args)
        before = flow.request.get_state()
        server_conn = flow.server_conn
        await router.request(flow)
        assert flow.request.get_state() == before
        assert flow.server_conn is server_conn
        assert "switchyard" not in flow.metadata
        assert router.relay is None or router.relay.port is not None
        await router.done()


async def test_relay_refuses_requests_without_a_token_it_issued(rules_file: Path) -> None:
    import aiohttp

    keeper = RulesKeeper()
    router = Router(keeper)
    with taddons.context(keeper, router) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        flow = chat_flow()
        await router.request(flow)
        assert router.relay is not None
        port = router.relay.port
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {TOKEN_HEADER: "forged"}):
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers=headers, data=b"{}") as response:
                    assert response.status == 403
        await router.done()


def test_rules_option_loads_the_file_and_reload_command_reapplies_it(rules_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    keeper = RulesKeeper()
    with taddons.context(keeper) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        assert keeper.rules is not None and [r.name for r in keeper.rules.routes] == ["chat"]
        rules_file.write_text(RULES.replace("name: chat", "name: chat-renamed"))
        with caplog.at_level(logging.INFO, logger="switchyard"):
            tctx.command(keeper.reload)
        assert [r.name for r in keeper.rules.routes] == ["chat-renamed"]
        assert "switchyard.rules_reloaded" in caplog.text


def test_a_broken_edit_keeps_the_last_good_rules(rules_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keeper = RulesKeeper()
    with taddons.context(keeper) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        good = keeper.rules
        rules_file.write_text(RULES.replace("routes:", "bogus: true\nroutes:"))
        with caplog.at_level(logging.WARNING, logger="switchyard"):
            tctx.command(keeper.reload)
        assert keeper.rules is good
        assert f"{rules_file}:2: bogus: Extra inputs are not permitted" in caplog.text
        assert "last good rules" in caplog.text
        # pointing the option at a broken file is refused, and the option rolls back
        broken = tmp_path / "broken.yaml"
        broken.write_text("version: 1\nroutes: [\n")
        with pytest.raises(exceptions.OptionsError, match="broken.yaml:3: invalid YAML"):
            tctx.configure(keeper, switchyard_rules=str(broken))
        assert keeper.rules is good
        assert tctx.options.switchyard_rules == str(rules_file)


def test_status_command_lists_routes_upstreams_and_credentials(rules_file: Path) -> None:
    keeper = RulesKeeper()
    router = Router(keeper)
    with taddons.context(keeper, router) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        text = tctx.command(router.status)
        assert "route chat (openai-chat)" in text
        assert "upstream openai: original destination; client's credentials; retries=1" in text
        assert "upstream backup: https://backup.example.com/v1/chat/completions; own auth set; retries=1" in text
        assert "backup-key-123" not in text
        assert "counters: routed=0" in text
