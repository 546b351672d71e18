"""An upstream's own `${VAR}` values over WebSocket, through a real mitmdump, when
what a client gets was held while other upstreams were tried."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.mitm import start_mitmdump
from tests.support.ws_provider import CLOSE, WsProvider, answer_turn, event
from tests.test_e2e_websocket import create, receive_turn

RULES = """\
version: 1
routes:
  - name: responses-ws-fallback
    match: {{path: /v1/responses}}
    upstreams:
      - {{name: primary, url: original, retries: 0, auth: {{header: Authorization, value: "Bearer ${{SWY_PRIMARY_KEY}}"}}}}
      - {{name: backup, url: "{backup}", retries: 0}}
"""
KEY = "sk-primary-env-KEY-1234abcd"


@pytest.fixture
def primary() -> Iterator[WsProvider]:
    provider = WsProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def backup() -> Iterator[WsProvider]:
    provider = WsProvider().start()
    yield provider
    provider.stop()


async def test_a_failure_that_echoes_the_primarys_key_is_forwarded_redacted_after_the_backup_failed_too(
        primary: WsProvider, backup: WsProvider, tmp_path: Path) -> None:
    """The primary refuses with a failure naming its key; the backup (its own socket,
    none of its own secrets) closes before answering: the client gets the primary's
    failure, the last one that said something, with its key `[redacted]`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(backup=backup.http_url))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", env={"SWY_PRIMARY_KEY": KEY})
    response = {"id": "resp_p1", "object": "response", "status": "in_progress", "output": []}
    refusal = [event("response.created", sequence_number=0, response=response),
               event("response.failed", sequence_number=1,
                     response={**response, "status": "failed",
                               "error": {"code": "server_is_overloaded", "message": f"key {KEY} is overloaded"}})]
    primary.script(refusal)
    backup.script([CLOSE])
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(primary.proxied_url, proxy=dump.proxy_url) as ws:
                await ws.send_str(create("hi"))
                got = await receive_turn(ws)
        log = dump.wait_for_log("switchyard.websocket_closed")
    finally:
        dump.stop()
    assert primary.creates and all(h["Authorization"] == f"Bearer {KEY}" for h in primary.handshakes)
    assert backup.connections == 1  # it was tried, and closed
    assert got == [message.replace(KEY, "[redacted]") for message in refusal]
    assert KEY not in log


async def test_the_upstreams_own_key_in_a_binary_message_reaches_the_client_redacted_and_binary(
        primary: WsProvider, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(backup=primary.http_url))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", env={"SWY_PRIMARY_KEY": KEY})
    answer = answer_turn("resp_bin")
    binary = b"\x00\x01 key=" + KEY.encode() + b" \xff"
    primary.script([*answer[:5], binary, *answer[5:]])
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(primary.proxied_url, proxy=dump.proxy_url) as ws:
                await ws.send_str(create("hi"))
                got = []
                while len(got) < len(answer) + 1:
                    msg = await ws.receive(timeout=10)
                    got.append((msg.type, msg.data))
    finally:
        dump.stop()
    text, binary_type = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
    assert got == [*[(text, m) for m in answer[:5]], (binary_type, binary.replace(KEY.encode(), b"[redacted]")),
                   *[(text, m) for m in answer[5:]]]
