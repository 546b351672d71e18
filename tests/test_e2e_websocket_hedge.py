"""Hedged WebSocket turns through a real mitmdump, where the hedge's own socket meets
the primary's: a hedge that fails before output must leave the primary's socket (and
its answer) alone.  Loopback WebSocket upstreams (tests/support/ws_provider.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.mitm import Mitmdump, start_mitmdump
from tests.support.ws_provider import WsProvider, answer_turn, failed_turn

RULES = """\
version: 1
defaults: {{max_skip_s: 0, unreachable_skip_s: 0, pre_answer_keepalive_s: 0, request_timeout_s: 30}}
routes:
  - name: ws-hedge
    match: {{path: /hedge/v1/responses}}
    hedge_after_s: 0.3
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: backup, url: "{backup}", retries: 0}}
"""
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


@pytest.fixture(scope="module")
def hedging(tmp_path_factory: pytest.TempPathFactory, backup_provider: WsProvider) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("mitm-ws-hedge")
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(backup=backup_provider.http_url))
    dump = start_mitmdump(rules, workdir / "mitmdump.log")
    yield dump
    dump.stop()


def _create(text: str) -> str:
    return json.dumps({"type": "response.create", "model": "gpt-4o", "input": text})


async def _turn(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> list[str]:
    got: list[str] = []
    while True:
        msg = await ws.receive(timeout=timeout)
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        got.append(msg.data)
        if json.loads(msg.data).get("type") in TERMINAL:
            return got


async def test_a_hedge_that_fails_before_output_leaves_the_primarys_socket_answering(
        primary: WsProvider, backup: WsProvider, hedging: Mitmdump) -> None:
    """The backup's `response.failed` keeps its socket (a failed response is over), but
    that socket must not replace the primary's, which is still answering the turn: the
    client gets the primary's answer, not a turn that waits for request_timeout_s."""
    slow = answer_turn("resp_slow", text="SLOW PRIMARY")
    primary.script(slow[:1] + [1.0] + slow[1:])
    backup.script(failed_turn("resp_hedge"))
    mark = hedging.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("hedge"), proxy=hedging.proxy_url) as ws:
            await ws.send_str(_create("one"))
            assert await _turn(ws, timeout=10) == slow
    log = hedging.wait_for_log("switchyard.attempt_failed", mark)
    assert "switchyard.hedged route=ws-hedge upstream=primary attempt=1 also=backup" in log
    assert len(primary.creates) == 1 and len(backup.creates) == 1
