"""`faults:` on WebSocket turns: every kind, through a real mitmdump, on real upstream WebSocket answers.

The upstreams are loopback Responses WebSocket servers (tests/support/ws_provider.py);
the client is a plain aiohttp WebSocket client and the openai SDK's
`client.responses.connect()`.  Each test asserts the exact messages the client got,
what each upstream was sent, and what was logged.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from websockets.exceptions import ConnectionClosedError

from tests.support.mitm import Mitmdump, free_port, mitmdump_on, start_mitmdump
from tests.support.ws_provider import WsProvider, answer_turn
from tests.test_e2e_websocket import TERMINAL, assert_nothing_more, create, receive_turn

# route name → (its fault's fields, the route's own settings); the `last-` routes have no backup
FAULTS: dict[str, tuple[str, str]] = {
    "sse": ("kind: sse_error, status: 503, message: injected overload, after_frames: 1", ""),
    "http": ("kind: http_error, status: 429, message: injected rate limit", ""),
    "failed": ("kind: response_failed, status: 503", ""),
    "overload": ("kind: overload_message", ""),
    "reset": ("kind: reset, after_frames: 1", ""),
    "stall": ("kind: stall", "first_output_timeout_s: 0.5"),
    "last-sse": ("kind: sse_error, status: 503, message: injected overload, after_frames: 1", ""),
    "last-http": ("kind: http_error, status: 429, message: injected rate limit", ""),
    "last-failed": ("kind: response_failed, status: 500", ""),
    "last-overload": ("kind: overload_message", ""),
    "last-short": ("kind: sse_error, after_frames: 50", ""),
    "after-sse": ("kind: sse_error, status: 503, after_frames: 5, count: 1", ""),
    "after-reset": ("kind: reset, after_frames: 5", ""),
    "after-stall": ("kind: stall, after_frames: 5", ""),
    "count": ("kind: sse_error, after_frames: 1, count: 1", ""),
}


def rules_text(backup_url: str) -> str:
    lines = ["version: 1", "defaults: {retries: 0, backoff_ms: 1, max_backoff_ms: 50, idle_timeout_s: 1}",
             "routes:"]
    for name, (_, settings) in FAULTS.items():
        lines += [f"  - name: ws-{name}", f"    match: {{path: /{name}/v1/responses}}"]
        if settings:
            lines.append(f"    {settings}")
        lines += ["    upstreams:", "      - {name: primary, url: original}"]
        if not name.startswith(("last-", "after-")):
            lines.append(f'      - {{name: backup, url: "{backup_url}"}}')
    lines.append("faults:")
    lines += [f"  - {{route: ws-{name}, upstream: primary, {fault}}}" for name, (fault, _) in FAULTS.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory, backup_provider: WsProvider) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("ws-faults"), rules_text(backup_provider.http_url)) as dump:
        yield dump




async def one_turn(provider: WsProvider, route: str, dump: Mitmdump, request: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(provider.proxied_url_under(route), proxy=dump.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    return got


def line_of(log: str, event: str) -> str:
    lines = [line for line in log.splitlines() if event in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("route, kind, after_frames", [
    ("sse", "sse_error", 1), ("http", "http_error", 0), ("failed", "response_failed", 0),
    ("overload", "overload_message", 0), ("reset", "reset", 1), ("stall", "stall", 0)])
async def test_a_fault_before_output_falls_back_and_the_client_sees_only_the_backups_answer(
        primary: WsProvider, backup: WsProvider, faulty: Mitmdump, route: str, kind: str, after_frames: int) -> None:
    good = answer_turn("resp_backup", "From the backup")
    backup.script(good)
    mark = faulty.log_mark()
    request = create(f"hello {route}")
    got = await one_turn(primary, route, faulty, request)
    assert got == good  # one clean turn: nothing of the faulted attempt, no duplicate
    assert primary.creates == [request]  # the real message was sent: a fault never invents an upstream
    assert backup.creates == [request]
    log = faulty.wait_for_log("switchyard.fallback_answered", mark)
    assert (f"switchyard.fault_injected route=ws-{route} upstream=primary attempt=1 kind={kind} "
            f"after_frames={after_frames} transport=websocket turn=1") in log
    failed = line_of(log, "switchyard.attempt_failed")
    for part in (f"fault={kind}", "decision=next_upstream", "transport=websocket", "turn=1", "upstream=primary"):
        assert part in failed, failed
    assert f"switchyard.fallback_answered route=ws-{route} upstream=backup attempt=2" in log


async def test_http_error_is_the_error_message_a_websocket_server_sends_with_its_status(
        primary: WsProvider, faulty: Mitmdump) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("last-http"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = [(await ws.receive(timeout=10)).data]
            await assert_nothing_more(ws)
    assert [json.loads(m) for m in got] == [{"type": "error", "status": 429, "error": {
        "message": "injected rate limit", "type": "invalid_request_error", "param": None,
        "code": "rate_limit_exceeded"}}]
    assert len(primary.creates) == 1


async def test_sse_error_after_a_real_message_is_that_message_then_the_error(primary: WsProvider,
                                                                            faulty: Mitmdump) -> None:
    real = answer_turn("resp_real")
    primary.script(real)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("last-sse"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = [(await ws.receive(timeout=10)).data for _ in range(2)]
            await assert_nothing_more(ws)
    assert got[0] == real[0]  # the real response.created, as the upstream sent it
    assert json.loads(got[1]) == {"type": "error", "sequence_number": 0, "error": {
        "type": "server_error", "code": "server_is_overloaded", "message": "injected overload", "param": None}}


async def test_response_failed_is_a_failed_response_message(primary: WsProvider, faulty: Mitmdump) -> None:
    got = await one_turn(primary, "last-failed", faulty, create("x"))
    assert [json.loads(m) for m in got] == [{"type": "response.failed", "sequence_number": 0, "response": {
        "id": "resp_switchyard_fault", "object": "response", "status": "failed", "output": [],
        "error": {"code": "server_error", "message": "provider overloaded (switchyard fault)"}}}]


async def test_overload_message_is_an_error_with_only_the_overload_text(primary: WsProvider,
                                                                       faulty: Mitmdump) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("last-overload"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = (await ws.receive(timeout=10)).data
            await assert_nothing_more(ws)
    assert json.loads(got) == {"type": "error", "code": None, "param": None, "sequence_number": 0,
                               "message": "Our servers are currently overloaded. Please try again later."}


async def test_a_real_answer_shorter_than_after_frames_gets_the_fault_in_place_of_its_end(
        primary: WsProvider, faulty: Mitmdump) -> None:
    real = answer_turn("resp_short")
    primary.script(real)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("last-short"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = [(await ws.receive(timeout=10)).data for _ in range(len(real))]
            await assert_nothing_more(ws)
    # committed at the first delta: the error after it is forwarded, its capacity code rewritten
    assert got[:-1] == real[:-1]
    assert json.loads(got[-1])["error"]["code"] == "server_error"
    assert "response.completed" not in got[-1]


async def test_a_fault_after_output_is_forwarded_never_replayed_and_the_next_turn_is_answered(
        primary: WsProvider, backup: WsProvider, faulty: Mitmdump) -> None:
    real, later = answer_turn("resp_out"), answer_turn("resp_later")
    primary.script(real, later)
    mark = faulty.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("after-sse"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("first"))
            got = [(await ws.receive(timeout=10)).data for _ in range(6)]
            await ws.send_str(create("second"))  # the error ended the turn: the next one goes on
            got_later = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got[:5] == real[:5]  # up to and including the first delta
    assert json.loads(got[5]) == {"type": "error", "sequence_number": 0, "error": {
        "type": "server_error", "code": "server_error", "message": "provider overloaded (switchyard fault)",
        "param": None}}  # server_is_overloaded rewritten, as after any output
    assert got_later == later
    assert [json.loads(c)["input"] for c in primary.creates] == ["first", "second"]  # never re-sent
    assert primary.connections == 2  # the faulted connection was closed: its rest reached nobody
    assert backup.creates == []
    log = faulty.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    suppressed = line_of(log, "switchyard.failover_suppressed_after_semantic_output")
    assert "after=output" in suppressed and "transport=websocket" in suppressed
    assert "switchyard.attempt_failed" not in log


async def test_a_reset_after_output_breaks_the_clients_websocket_and_is_never_replayed(
        primary: WsProvider, backup: WsProvider, faulty: Mitmdump) -> None:
    real = answer_turn("resp_reset")
    primary.script(real)
    mark = faulty.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("after-reset"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = [(await ws.receive(timeout=10)).data for _ in range(5)]
            end = await ws.receive(timeout=10)
    assert got == real[:5]
    # before the turn's end, and never a clean close: nothing more of it, nothing replayed
    assert (end.type, end.data, end.extra) == (aiohttp.WSMsgType.CLOSE, 1011, "connection reset (switchyard fault)")
    assert len(primary.creates) == 1 and backup.creates == []
    log = faulty.wait_for_log("switchyard.websocket_broken", mark)
    assert "switchyard.fault_injected route=ws-after-reset upstream=primary attempt=1 kind=reset" in log


async def test_a_stall_after_output_ends_the_turn_at_the_idle_bound(primary: WsProvider, backup: WsProvider,
                                                                    faulty: Mitmdump) -> None:
    real = answer_turn("resp_stall")
    primary.script(real)
    mark = faulty.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("after-stall"), proxy=faulty.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = [(await ws.receive(timeout=10)).data for _ in range(6)]
    assert got[:5] == real[:5]
    tail = json.loads(got[5])
    assert (tail["type"], tail["code"]) == ("error", "stream_stalled")
    assert len(primary.creates) == 1 and backup.creates == []
    log = faulty.wait_for_log("switchyard.stream_cut_after_output", mark)
    assert "code=stream_stalled" in line_of(log, "switchyard.stream_cut_after_output")


async def test_a_fault_with_count_1_fires_once_then_the_primary_answers(
        primary: WsProvider, backup: WsProvider, faulty: Mitmdump) -> None:
    """The openai SDK's Responses WebSocket: the first connection's turn falls back to the
    backup (no duplicate); the fault is spent, and the next connection's primary answers."""
    backup.script(answer_turn("resp_b", "From the backup"))
    primary.script(answer_turn("resp_p1"), answer_turn("resp_p2", "From the primary"))
    client = openai.AsyncOpenAI(api_key="sk-test-ws", base_url=primary.proxied_url_under("count").removesuffix("/responses"))

    async def turn() -> tuple[list[str], str]:
        types: list[str] = []
        text = ""
        async with (asyncio.timeout(20),
                    client.responses.connect(websocket_connection_options={"proxy": faulty.proxy_url}) as connection):
            await connection.response.create(model="gpt-4o", input="hi")
            async for server_event in connection:
                types.append(server_event.type)
                if server_event.type == "response.output_text.delta":
                    text += server_event.delta
                if server_event.type in TERMINAL:
                    break
        return types, text

    mark = faulty.log_mark()
    first, second = await turn(), await turn()
    every = [json.loads(m)["type"] for m in answer_turn("x")]
    assert first == (every, "From the backup")
    assert second == (every, "From the primary")
    assert len(primary.creates) == 2 and len(backup.creates) == 1
    log = faulty.wait_for_log("switchyard.websocket_closed", mark, count=2)
    assert log.count("switchyard.fault_injected route=ws-count") == 1


async def test_status_counts_faults_fired_on_websocket_turns(primary: WsProvider, backup: WsProvider,
                                                             tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text(backup.http_url))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", web=True,
                          extra_args=["--set", "web_open_browser=false", "--set", f"web_port={free_port()}"])
    try:
        base, _, token = dump.web_url.partition("?")
        xsrf = "0123456789abcdef0123456789abcdef"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def status() -> Any:
            request = urllib.request.Request(
                f"{base.rstrip('/')}/commands/switchyard.status?{token}", method="POST",
                data=json.dumps({"arguments": []}).encode(),
                headers={"X-XSRFToken": xsrf, "Cookie": f"_mitmproxy_xsrf={xsrf}", "Content-Type": "application/json"})
            with opener.open(request, timeout=10) as answer:
                return json.loads(answer.read())["value"]

        for _ in range(2):
            await one_turn(primary, "count", dump, create("x"))
        shown = await asyncio.to_thread(status)
    finally:
        dump.stop()
    assert ("fault: route=ws-count upstream=primary kind=sse_error after_frames=1 rate=1 fired=1/1") in shown
    assert "websocket: connections=2, turns=2, retries_answered=0, fallbacks=1" in shown


async def test_a_fault_removed_from_the_file_stops_firing_on_a_websocket_opened_before(
        primary: WsProvider, tmp_path: Path) -> None:
    """A WebSocket keeps the rules it opened with, but never a fault that left the file."""
    route = ("version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n"
             "    upstreams: [{name: primary, url: original}]\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(route + "faults:\n  - {route: ws, kind: sse_error, after_frames: 5}\n")
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log")
    first, second = answer_turn("resp_1"), answer_turn("resp_2")
    primary.script(first, second)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(primary.proxied_url, proxy=dump.proxy_url) as ws:
                await ws.send_str(create("one"))
                got = [(await ws.receive(timeout=10)).data for _ in range(6)]
                mark = dump.log_mark()
                await asyncio.sleep(1.1)  # a different mtime second for coarse file systems
                rules.write_text(route)
                await asyncio.to_thread(dump.wait_for_log, "switchyard.rules_reloaded", mark)
                await ws.send_str(create("two", previous_response_id="resp_1"))
                got_second = await receive_turn(ws)
                await assert_nothing_more(ws)
    finally:
        dump.stop()
    assert got[:5] == first[:5] and json.loads(got[5])["type"] == "error"
    assert got_second == second  # whole: the fault is out of the file


async def test_a_fault_still_in_the_file_keeps_firing_on_a_websocket_opened_before_an_unrelated_edit(
        primary: WsProvider, tmp_path: Path) -> None:
    """Another route added to the file (Codex's connection stays open): the fault that
    stayed fails this connection's next turn too, as docs/faults.md says only a removed one stops."""
    route = ("version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n"
             "    upstreams: [{name: primary, url: original}]\n")
    other = "  - name: other\n    match: {path: /other/v1/responses}\n    upstreams: [{name: o, url: original}]\n"
    fault = "faults:\n  - {route: ws, kind: sse_error, after_frames: 5}\n"
    rules = tmp_path / "rules.yaml"
    rules.write_text(route + fault)
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log")
    first, second = answer_turn("resp_1"), answer_turn("resp_2")
    primary.script(first, second)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(primary.proxied_url, proxy=dump.proxy_url) as ws:
                await ws.send_str(create("one"))
                got = [(await ws.receive(timeout=10)).data for _ in range(6)]
                mark = dump.log_mark()
                await asyncio.sleep(1.1)  # a different mtime second for coarse file systems
                rules.write_text(route + other + fault)
                await asyncio.to_thread(dump.wait_for_log, "switchyard.rules_reloaded", mark)
                await ws.send_str(create("two", previous_response_id="resp_1"))
                got_second = [(await ws.receive(timeout=10)).data for _ in range(6)]
                await assert_nothing_more(ws)
    finally:
        dump.stop()
    assert got[:5] == first[:5] and json.loads(got[5])["type"] == "error"
    assert got_second[:5] == second[:5] and json.loads(got_second[5])["type"] == "error"


async def test_the_openai_sdk_sees_a_reset_after_output_as_a_broken_connection_not_an_end(
        primary: WsProvider, backup: WsProvider, faulty: Mitmdump) -> None:
    """`client.responses.connect()` (the `websockets` library beneath): the 1011 close
    is raised from the iteration, after the real events, where a clean close would have
    ended it quietly as if the answer were whole."""
    real = answer_turn("resp_sdk_reset")
    primary.script(real)
    client = openai.AsyncOpenAI(api_key="sk-test-ws", base_url=primary.proxied_url_under("after-reset").removesuffix("/responses"))
    types: list[str] = []
    with pytest.raises(ConnectionClosedError) as raised:
        async with (asyncio.timeout(20),
                    client.responses.connect(websocket_connection_options={"proxy": faulty.proxy_url}) as connection):
            await connection.response.create(model="gpt-4o", input="hi")
            async for server_event in connection:
                types.append(server_event.type)
    assert types == [json.loads(m)["type"] for m in real[:5]]
    assert raised.value.rcvd is not None and raised.value.rcvd.code == 1011
    assert len(primary.creates) == 1 and backup.creates == []
