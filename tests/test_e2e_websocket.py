"""The Responses API over WebSocket through a real mitmdump, terminated in Switchyard.

A loopback WebSocket upstream (tests/support/ws_provider.py) speaks the
protocol and fails on demand; a plain aiohttp WebSocket client and the openai
SDK's `client.responses.connect()` talk to it through mitmdump as their proxy.
Each test asserts the exact sequence of message texts the client received,
what the upstream was sent, and what was logged.
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
from mitmproxy import io

from tests.support.mitm import Mitmdump, free_port, start_mitmdump
from tests.support.tls import make_tls_files, server_context
from tests.support.ws_provider import (
    CLOSE,
    PING,
    WsProvider,
    answer_turn,
    event,
    failed,
    failed_turn,
    full_answer_turn,
    overload_error,
    overload_turn,
    warm_up_turn,
)

WS_RULES = """\
version: 1
defaults:
  retries: 1
  backoff_ms: 1
  max_backoff_ms: 300
routes:
  - name: responses-ws-small
    match: {{path: /small/v1/responses}}
    staging_limit: 2KB
    upstreams:
      - {{name: small, url: original}}
  - name: responses-ws-slow
    match: {{path: /slow/v1/responses}}
    first_output_timeout_s: 1.0
    upstreams:
      - {{name: slow, url: original}}
  - name: responses-ws-fallback
    match: {{path: /fallback/v1/responses}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "{backup}", auth: {{header: Authorization, value: "Bearer sk-backup-key"}}}}
  - name: responses-ws-to-http
    match: {{path: /tohttp/v1/responses}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: plain, url: "{plain}", auth: {{header: Authorization, value: "Bearer sk-plain-key"}}}}
  - name: responses-ws-http-only
    match: {{path: /httponly/v1/responses}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: backup, url: "{backup}", websocket: false}}
  - name: responses-ws-busy
    match: {{path: /busy/v1/responses}}
    request_timeout_s: 2
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: backup, url: "{backup}", auth: {{header: Authorization, value: "Bearer sk-backup-key"}}}}
  - name: responses-ws-hedge
    match: {{path: /hedge/v1/responses}}
    hedge_after_s: 0.4
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: backup, url: "{backup}", auth: {{header: Authorization, value: "Bearer sk-backup-key"}}}}
  - name: responses-ws
    match: {{path: /v1/responses}}
    upstreams:
      - {{name: primary, url: original}}
"""

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


@pytest.fixture(scope="module")
def saved_flows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mitm-ws-flows") / "flows"


@pytest.fixture(scope="module")
def ws_mitm(tmp_path_factory: pytest.TempPathFactory, backup_provider: WsProvider, plain_provider: WsProvider,
            saved_flows: Path) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("mitm-ws")
    rules = workdir / "rules.yaml"
    rules.write_text(WS_RULES.format(backup=backup_provider.http_url, plain=plain_provider.http_url))
    dump = start_mitmdump(rules, workdir / "mitmdump.log", extra_args=["-w", str(saved_flows)])
    yield dump
    dump.stop()


@pytest.fixture
def upstream(primary: WsProvider) -> WsProvider:
    """The route's first upstream, `url: original`."""
    return primary


def create(text: str, **extra: object) -> str:
    return json.dumps({"type": "response.create", "model": "gpt-4o", "input": text, **extra})


def rewritten(text: str) -> str:
    return text.replace('"server_is_overloaded"', '"server_error"')


async def receive_turn(ws: aiohttp.ClientWebSocketResponse, timeout: float = 10) -> list[str]:
    """Message texts up to and including the turn's terminal event."""
    got: list[str] = []
    while True:
        msg = await ws.receive(timeout=timeout)
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        got.append(msg.data)
        try:
            kind = json.loads(msg.data).get("type")
        except ValueError:
            kind = None
        if kind in TERMINAL:
            return got


async def assert_nothing_more(ws: aiohttp.ClientWebSocketResponse, wait: float = 0.4) -> None:
    with pytest.raises(asyncio.TimeoutError):
        msg = await ws.receive(timeout=wait)
        raise AssertionError(f"unexpected message after the turn: {msg}")


async def test_first_turn_failed_before_output_is_retried_on_the_same_connection(upstream: WsProvider,
                                                                               ws_mitm: Mitmdump) -> None:
    good = answer_turn("resp_2")
    upstream.script(failed_turn("resp_1"), good)
    mark = ws_mitm.log_mark()
    request = create("hello PRIVATE-PROMPT")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good  # exactly one turn's events, none of the failed attempt
    assert upstream.creates == [request, request]  # the exact create, sent again on the same connection
    assert upstream.connections == 1
    log = ws_mitm.wait_for_log("switchyard.retry_answered", mark)
    failed_lines = [line for line in log.splitlines() if "switchyard.attempt_failed" in line]
    assert len(failed_lines) == 1
    line = failed_lines[0]
    for part in ("route=responses-ws", "upstream=primary", "attempt=1", "code=server_is_overloaded",
                 "event=response.failed", "decision=retry", "delay_s=", "transport=websocket", "turn=1"):
        assert part in line, line
    assert "switchyard.retry_answered route=responses-ws upstream=primary attempt=2" in log
    assert "PRIVATE-PROMPT" not in log
    assert "failover_suppressed" not in log


async def test_an_error_in_the_middle_of_a_response_retries_on_a_fresh_connection(upstream: WsProvider,
                                                                                ws_mitm: Mitmdump) -> None:
    """After an `error` the failed response may go on (here its response.failed comes
    late): its connection is closed, so nothing of it can reach the retry."""
    failing = overload_turn("resp_A")  # created, error, response.failed
    good = answer_turn("resp_B")
    upstream.script([failing[0], failing[1], 0.1, failing[2]], good)
    request = create("x")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good
    assert upstream.creates == [request, request]
    assert upstream.connections == 2


async def test_a_retry_that_reuses_the_failed_attempts_response_id_still_answers(upstream: WsProvider,
                                                                               ws_mitm: Mitmdump) -> None:
    """A server that gives the retried turn the same response id as the failed attempt:
    the retry's messages are its answer, never dropped as the failed attempt's."""
    good = answer_turn("resp_same")
    upstream.script(failed_turn("resp_same"), good)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("same id"))
            got = await receive_turn(ws)
    assert got == good


async def test_a_warm_up_does_not_make_the_real_turn_later(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """Codex's shape: a `generate: false` warm-up, then the real turn naming it, which
    fails before output: the real turn is re-sent, on the same connection."""
    warm, good = warm_up_turn("resp_warm"), answer_turn("resp_real")
    upstream.script(warm, failed_turn("resp_fail"), good)
    first = create("prewarm", generate=False)
    second = create("", previous_response_id="resp_warm")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(first)
            assert await receive_turn(ws) == warm
            await ws.send_str(second)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good
    assert upstream.creates == [first, second, second]
    assert upstream.connections == 1


async def test_failure_after_output_is_forwarded_rewritten_not_retried(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    turn = answer_turn("resp_out")[:5] + [overload_error(5), failed("resp_out", 6)]
    upstream.script(turn)
    mark = ws_mitm.log_mark()
    request = create("after output")
    next_turn = answer_turn("resp_next")
    upstream.script(next_turn)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            # the `error` ended the turn: the next one is answered at once, not after idle_timeout_s
            await ws.send_str(create("next", previous_response_id="resp_out"))
            got_next = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == turn[:5] + [rewritten(turn[5]), rewritten(turn[6])]
    assert '"server_error"' in got[5] and "server_is_overloaded" not in got[5] + got[6]
    assert got_next == next_turn
    assert len(upstream.creates) == 2 and upstream.creates[0] == request
    log = ws_mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    suppressed = [line for line in log.splitlines() if "failover_suppressed_after_semantic_output" in line]
    assert len(suppressed) == 1  # the error, which ended the turn (what followed passed, rewritten)
    assert all("transport=websocket" in line and "after=output" in line and "turn=1" in line for line in suppressed)
    assert "event=error" in suppressed[0]
    assert "switchyard.attempt_failed" not in log


async def test_failing_second_turn_is_forwarded_not_resent(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    first = answer_turn("resp_t1")
    second = overload_turn("resp_t2")
    upstream.script(first, second)
    mark = ws_mitm.log_mark()
    one = create("turn one")
    two = create("turn two", previous_response_id="resp_t1")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(one)
            got_one = await receive_turn(ws)
            await ws.send_str(two)
            got_two = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got_one == first
    assert got_two == [second[0], rewritten(second[1]), rewritten(second[2])]
    assert upstream.creates == [one, two]  # the second turn was not sent again
    log = ws_mitm.wait_for_log("decision=not_resent", mark)
    failed_lines = [line for line in log.splitlines() if "switchyard.attempt_failed" in line]
    assert len(failed_lines) == 1 and "turn=2" in failed_lines[0] and "transport=websocket" in failed_lines[0]
    suppressed = [line for line in log.splitlines() if "failover_suppressed_after_semantic_output" in line]
    assert len(suppressed) == 1
    assert all("transport=websocket" in line and "turn=2" in line and "after=later_turn" in line for line in suppressed)


async def test_first_turn_out_of_budget_is_forwarded_as_sent(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    attempt_1, attempt_2 = overload_turn("resp_a"), overload_turn("resp_b")
    upstream.script(attempt_1, attempt_2)
    mark = ws_mitm.log_mark()
    request = create("no luck")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == attempt_2  # the last failure as the provider sent it (retries: 1 means two tries)
    assert upstream.creates == [request, request]
    log = ws_mitm.wait_for_log("decision=give_up", mark)
    decisions = [line.split("decision=")[1].split()[0] for line in log.splitlines() if "switchyard.attempt_failed" in line]
    assert decisions == ["retry", "give_up"]
    assert "failover_suppressed" not in log


async def test_non_json_and_unknown_messages_are_output(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    turn = [answer_turn("resp_u")[0], "not json at all", event("response.something_new", x=1),
            answer_turn("resp_u")[-1]]
    upstream.script(turn)
    request = create("unknown")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == turn
    assert upstream.creates == [request]


async def test_openai_sdk_responses_connect_sees_one_clean_turn(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    good = answer_turn("resp_sdk", "Hello from the SDK")
    upstream.script(overload_turn("resp_sdk_fail"), good)
    client = openai.AsyncOpenAI(api_key="sk-test-ws", base_url=f"http://127.0.0.1:{upstream.port}/v1")
    types: list[str] = []
    text = ""
    async with (asyncio.timeout(20),
                client.responses.connect(websocket_connection_options={"proxy": ws_mitm.proxy_url}) as connection):
        await connection.response.create(model="gpt-4o", input="say hello")
        async for server_event in connection:
            types.append(server_event.type)
            if server_event.type == "response.output_text.delta":
                text += server_event.delta
            if server_event.type in TERMINAL:
                break
    assert types == [json.loads(message)["type"] for message in good]
    assert text == "Hello from the SDK"
    assert len(upstream.creates) == 2 and upstream.creates[0] == upstream.creates[1]


@pytest.mark.parametrize("over", ["websocket", "http-sse"])
async def test_openai_sdk_gets_the_backups_answer_as_one_clean_turn(upstream: WsProvider, backup: WsProvider,
                                                                   plain: WsProvider, ws_mitm: Mitmdump,
                                                                   over: str) -> None:
    other, prefix = (backup, "fallback") if over == "websocket" else (plain, "tohttp")
    upstream.script(failed_turn("resp_f1"), failed_turn("resp_f2"))
    good = answer_turn("resp_sdk_backup", "Hello from the backup")
    other.script(good)
    client = openai.AsyncOpenAI(api_key="sk-test-ws", base_url=f"http://127.0.0.1:{upstream.port}/{prefix}/v1")
    types: list[str] = []
    text = ""
    async with (asyncio.timeout(20),
                client.responses.connect(websocket_connection_options={"proxy": ws_mitm.proxy_url}) as connection):
        await connection.response.create(model="gpt-4o", input="say hello")
        async for server_event in connection:
            types.append(server_event.type)
            if server_event.type == "response.output_text.delta":
                text += server_event.delta
            if server_event.type in TERMINAL:
                break
    assert types == [json.loads(message)["type"] for message in good]
    assert text == "Hello from the backup"
    assert len(other.creates if over == "websocket" else other.posts) == 1


async def test_first_output_timeout_retries_the_first_turn_on_a_fresh_connection(upstream: WsProvider,
                                                                               ws_mitm: Mitmdump) -> None:
    """A silent response cannot be stopped on its connection: that connection is closed
    (its late answer reaches nobody), and the turn is re-sent on a new one."""
    late = answer_turn("resp_stall", text="STALE ANSWER")
    fresh = answer_turn("resp_fresh", text="FRESH ANSWER")
    upstream.script(late[:1] + [1.5] + late[1:], fresh)
    mark = ws_mitm.log_mark()
    request = create("slow one")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("slow"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws, wait=1.5)  # the stale answer never comes
    assert got == fresh
    assert upstream.creates == [request, request]
    assert upstream.connections == 2
    log = ws_mitm.wait_for_log("switchyard.retry_answered", mark)
    line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    for part in ("route=responses-ws-slow", "status=504", "event=timeout", "decision=retry", "turn=1"):
        assert part in line, line


async def test_first_output_timeout_fires_on_a_silent_second_turn(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """A later turn is never re-sent, but it is still bounded: the client gets an
    in-band `upstream_timeout` error instead of waiting forever, and nothing of the
    silent response afterwards."""
    first = answer_turn("resp_one")
    late = answer_turn("resp_stall", text="STALE ANSWER")
    upstream.script(first, late[:1] + [1.5] + late[1:])
    mark = ws_mitm.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("slow"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("one"))
            assert await receive_turn(ws) == first
            await ws.send_str(create("two", previous_response_id="resp_one"))
            got = [(await ws.receive(timeout=10)).data, (await ws.receive(timeout=10)).data]
            await assert_nothing_more(ws, wait=1.5)
    assert got[0] == late[0]  # a later turn's messages pass as they come
    error = json.loads(got[1])
    assert (error["type"], error["code"], error["error"]["code"]) == ("error", "upstream_timeout", "upstream_timeout")
    assert len(upstream.creates) == 2  # never re-sent
    log = ws_mitm.wait_for_log("decision=not_resent", mark)
    line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    for part in ("status=504", "event=timeout", "turn=2", "transport=websocket"):
        assert part in line, line


async def test_a_turns_first_output_is_due_from_its_start_whatever_the_upstream_sends_before(
        upstream: WsProvider, backup: WsProvider, ws_mitm: Mitmdump) -> None:
    """As over HTTP, `request_timeout_s` bounds the wait for a turn's first output from
    the attempt's start: an upstream that keeps sending `response.in_progress` and never
    any output is moved past, and the backup answers the turn."""
    created = answer_turn("resp_busy")[0]
    busy = event("response.in_progress", sequence_number=1, response={"id": "resp_busy", "status": "in_progress"})
    upstream.script([created, *[item for _ in range(40) for item in (0.25, busy)]])
    good = answer_turn("resp_backup", text="FROM BACKUP")
    backup.script(good)
    mark = ws_mitm.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("busy"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("think hard"))
            got = await receive_turn(ws, timeout=8)  # the primary keeps "progressing" for 10 s
    assert got == good
    log = ws_mitm.wait_for_log("switchyard.fallback_answered", mark)
    line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    for part in ("route=responses-ws-busy", "upstream=primary", "event=timeout", "decision=next_upstream",
                 'message="no output within 2s"'):
        assert part in line, line


async def test_a_slow_turn_is_hedged_on_the_backups_socket_and_the_next_turn_stays_there(
        upstream: WsProvider, backup: WsProvider, ws_mitm: Mitmdump) -> None:
    """hedge_after_s on a WebSocket turn: the backup is asked over its own socket beside
    the slow primary's; the backup's first output wins, the primary's socket goes
    (nothing of it reaches the client), and the next turn goes to the backup."""
    slow = answer_turn("resp_slow", text="SLOW PRIMARY")
    upstream.script(slow[:1] + [3.0] + slow[1:])
    good, second = answer_turn("resp_hedge", text="FROM BACKUP"), answer_turn("resp_next", text="NEXT")
    backup.script(good, second)
    mark = ws_mitm.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("hedge"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("one"))
            assert await receive_turn(ws) == good
            await ws.send_str(create("two", previous_response_id="resp_hedge"))
            assert await receive_turn(ws) == second
            await assert_nothing_more(ws, wait=1.0)  # the slow answer never comes
    assert len(upstream.creates) == 1 and len(backup.creates) == 2 and backup.connections == 1
    log = ws_mitm.wait_for_log("switchyard.hedge_lost", mark)
    assert "switchyard.hedged route=responses-ws-hedge upstream=primary attempt=1 also=backup" in log


async def test_a_session_asks_the_upstream_nothing_but_the_upgrade_and_its_turns(
        upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """Routing a WebSocket handshake sends nothing by itself: the upstream gets the
    upgrade and the turn, never a plain GET the client did not make."""
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("hi"))
            await receive_turn(ws)
    assert [handshake.get("Upgrade", "").lower() for handshake in upstream.handshakes] == ["websocket"]
    assert upstream.posts == [] and upstream.connections == 1


async def test_an_upstream_close_right_after_a_turn_reaches_the_client_after_every_message(
        upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    good = answer_turn("resp_close")
    upstream.script([*good, CLOSE])
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("then close"))
            got = [(await ws.receive(timeout=10)) for _ in good]
            closing = await ws.receive(timeout=10)
    assert [m.data for m in got] == good
    assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 1000


async def test_the_backup_answers_over_websocket_and_keeps_the_connection(
        upstream: WsProvider, backup: WsProvider, ws_mitm: Mitmdump, saved_flows: Path) -> None:
    """The primary fails the real turn twice (its budget): the backup gets it, with the
    warm-up folded in (the warm-up lives on the primary's connection only) and its own
    key, never the client's; the client sees one clean turn, and its next turn goes to
    the backup."""
    warm = warm_up_turn("resp_warm")
    upstream.script(warm, failed_turn("resp_f1"), failed_turn("resp_f2"))
    good, later = answer_turn("resp_backup", "From the backup"), answer_turn("resp_next", "Still the backup")
    backup.script(good, later)
    mark = ws_mitm.log_mark()
    prewarm = create("", generate=False, instructions="be brief", input=[{"role": "user", "content": "PROMPT"}])
    real = json.dumps({"type": "response.create", "model": "gpt-4o", "previous_response_id": "resp_warm",
                       "input": [{"role": "user", "content": "more"}]})
    third = create("next", previous_response_id="resp_backup")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("fallback"), proxy=ws_mitm.proxy_url,
                                      headers={"Authorization": "Bearer sk-client-key"}) as ws:
            await ws.send_str(prewarm)
            assert await receive_turn(ws) == warm
            await ws.send_str(real)
            got = await receive_turn(ws)
            await ws.send_str(third)
            got_later = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good and got_later == later
    assert upstream.creates == [prewarm, real, real]
    assert len(backup.creates) == 2
    assert json.loads(backup.creates[0]) == {
        "type": "response.create", "model": "gpt-4o", "instructions": "be brief",
        "input": [{"role": "user", "content": "PROMPT"}, {"role": "user", "content": "more"}]}
    assert backup.creates[1] == third  # on the backup's connection, as the client sent it
    assert backup.connections == 1
    assert upstream.handshakes[0]["Authorization"] == "Bearer sk-client-key"  # its own origin
    assert [h["Authorization"] for h in backup.handshakes] == ["Bearer sk-backup-key"]
    log = ws_mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert "switchyard.fallback_answered route=responses-ws-fallback upstream=backup attempt=3" in log
    assert "sk-client-key" not in log and "sk-backup-key" not in log


@pytest.mark.parametrize("status", [404, 200])
async def test_the_backup_answers_over_http_sse_when_it_refuses_the_upgrade(
        upstream: WsProvider, plain: WsProvider, ws_mitm: Mitmdump, status: int) -> None:
    """`websocket: auto` (the default): the backup answers the upgrade as a server that
    speaks no WebSocket does (404, or a plain 200 that ignores the upgrade), so the turn
    is POSTed to it, streamed; its SSE events reach the client as messages, and the
    next turn goes there too."""
    plain.refusal = status
    upstream.script(failed_turn("resp_f1"))
    good, later = answer_turn("resp_http", "Over HTTP"), answer_turn("resp_http2", "Again over HTTP")
    plain.script(good, later)
    mark = ws_mitm.log_mark()
    real = create("hello", metadata={"k": "v"})
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("tohttp"), proxy=ws_mitm.proxy_url,
                                      headers={"Authorization": "Bearer sk-client-key"}) as ws:
            await ws.send_str(real)
            got = await receive_turn(ws)
            await ws.send_str(create("next", previous_response_id="resp_http"))
            got_later = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good and got_later == later
    assert upstream.creates == [real]
    assert [json.loads(body) for body in plain.posts] == [
        {"model": "gpt-4o", "input": "hello", "metadata": {"k": "v"}, "stream": True},
        {"model": "gpt-4o", "input": "next", "previous_response_id": "resp_http", "stream": True}]
    assert len(plain.handshakes) == 1  # asked once; HTTP from then on
    assert all(h["Authorization"] == "Bearer sk-plain-key" for h in [*plain.handshakes, *plain.post_headers])
    log = ws_mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert f"switchyard.websocket_refused route=responses-ws-to-http upstream=plain status={status}" in log


async def test_an_upstream_with_websocket_false_is_asked_over_http_only(
        upstream: WsProvider, backup: WsProvider, ws_mitm: Mitmdump) -> None:
    upstream.script(failed_turn("resp_f1"))
    good = answer_turn("resp_http", "Over HTTP")
    backup.script(good)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("httponly"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("hello"))
            got = await receive_turn(ws)
            for _ in range(100):  # bounded: until the primary sees its socket end
                if upstream.ended:
                    break
                await asyncio.sleep(0.02)
            primary_ended = upstream.ended  # while the client is still connected
    assert got == good
    assert primary_ended == 1  # the primary's socket was closed once the turns went to HTTP
    assert backup.handshakes == [] and len(backup.posts) == 1


async def test_the_flow_tells_which_upstream_each_turn_went_to_and_why(upstream: WsProvider, backup: WsProvider,
                                                                      tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(WS_RULES.format(backup=backup.http_url, plain=backup.http_url))
    saved = tmp_path / "flows"
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", extra_args=["-w", str(saved)])
    upstream.script(warm_up_turn("resp_warm"), failed_turn("resp_f1"), failed_turn("resp_f2"))
    backup.script(answer_turn("resp_b1"), answer_turn("resp_b2"))
    try:
        mark = dump.log_mark()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(upstream.proxied_url_under("fallback"), proxy=dump.proxy_url) as ws:
                for turn in (create("", generate=False), create("real", previous_response_id="resp_warm"),
                             create("next", previous_response_id="resp_b1")):
                    await ws.send_str(turn)
                    await receive_turn(ws)
        log = dump.wait_for_log("switchyard.websocket_closed", mark)
    finally:
        dump.stop()
    assert ("switchyard.websocket_closed route=responses-ws-fallback transport=websocket turns=3 upstream=backup "
            "failed_attempts=2") in log
    with saved.open("rb") as file:
        story = next(flow.metadata["switchyard"] for flow in io.FlowReader(file).stream() if flow.websocket)
    turns = story["turns"]
    assert [(t["upstream"], t["transport"], t["outcome"], t["resendable"]) for t in turns] == [
        ("primary", "websocket", "committed", True), ("backup", "websocket", "committed", True),
        ("backup", "websocket", "committed", False)]
    assert [[(a["upstream"], a["outcome"]) for a in t["attempts"]] for t in turns] == [
        [("primary", "committed")], [("primary", "retry"), ("primary", "next_upstream"), ("backup", "committed")],
        [("backup", "passed_through")]]
    assert turns[0]["warm_up"] is True
    assert "never re-sent" in turns[2]["why"]
    assert turns[1]["attempts"][0]["code"] == "server_is_overloaded"
    assert turns[1]["why"] == "primary failed before output (server_is_overloaded): backup answered"
    with saved.open("rb") as file:
        flow = next(flow for flow in io.FlowReader(file).stream() if flow.websocket)
    assert flow.comment == "turn 2: primary failed before output (server_is_overloaded): backup answered"


async def test_mitmweb_shows_each_failed_attempt_and_status_counts_websocket_turns(
        upstream: WsProvider, backup: WsProvider, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(WS_RULES.format(backup=backup.http_url, plain=backup.http_url))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", web=True,
                          extra_args=["--set", "web_open_browser=false", "--set", f"web_port={free_port()}"])
    upstream.script(failed_turn("resp_f1"), answer_turn("resp_ok"), failed_turn("resp_f2"), failed_turn("resp_f3"))
    backup.script(answer_turn("resp_b"))
    try:
        base, _, token = dump.web_url.partition("?")
        xsrf = "0123456789abcdef0123456789abcdef"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def call(method: str, path: str, data: object = None) -> Any:
            request = urllib.request.Request(
                f"{base.rstrip('/')}{path}?{token}", method=method,
                data=None if data is None else json.dumps(data).encode(),
                headers={"X-XSRFToken": xsrf, "Cookie": f"_mitmproxy_xsrf={xsrf}", "Content-Type": "application/json"})
            with opener.open(request, timeout=10) as answer:
                return json.loads(answer.read())

        mark = dump.log_mark()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(upstream.proxied_url_under("fallback"), proxy=dump.proxy_url,
                                          headers={"Authorization": "Bearer sk-client-key"}) as ws:
                await ws.send_str(create("one"))
                await receive_turn(ws)  # answered on retry
            async with session.ws_connect(upstream.proxied_url_under("fallback"), proxy=dump.proxy_url) as ws:
                await ws.send_str(create("two"))
                await receive_turn(ws)  # the backup answered
        await asyncio.to_thread(dump.wait_for_log, "switchyard.websocket_closed", mark, 10.0, 2)
        status = (await asyncio.to_thread(call, "POST", "/commands/switchyard.status", {"arguments": []}))["value"]
        flows = await asyncio.to_thread(call, "GET", "/flows")
    finally:
        dump.stop()
    assert "websocket: connections=2, turns=2, retries_answered=1, fallbacks=1, suppressed_failovers=0" in status
    attempts = [f for f in flows if "; attempt " in f.get("comment", "")]
    assert sorted(f["comment"].split(" → ")[1].split(";")[0] for f in attempts) == [
        "next_upstream", "retry", "retry"]
    shown = json.dumps(attempts)
    assert "sk-client-key" not in shown and "[redacted]" in shown


async def test_a_warm_up_bound_for_http_is_answered_by_switchyard_and_folded_into_the_turn(
        upstream: WsProvider, backup: WsProvider, ws_mitm: Mitmdump) -> None:
    """The primary fails the warm-up itself; the next upstream speaks HTTP only, where a
    warm-up would generate a whole answer: Switchyard answers it without output, and
    the real turn reaches the backup with the warm-up's request folded in."""
    upstream.script(failed_turn("resp_f1"))
    good = answer_turn("resp_http", "Over HTTP")
    backup.script(good)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("httponly"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("", generate=False, instructions="be brief", input=[]))
            warm = await receive_turn(ws)
            rid = json.loads(warm[0])["response"]["id"]
            await ws.send_str(create("the question", previous_response_id=rid))
            got = await receive_turn(ws)
    assert [json.loads(m)["type"] for m in warm] == ["response.created", "response.completed"]
    assert json.loads(warm[1])["response"]["output"] == []
    assert got == good
    assert [json.loads(body) for body in backup.posts] == [
        {"model": "gpt-4o", "instructions": "be brief", "input": [{"role": "user", "content": "the question"}],
         "stream": True}]


async def test_a_client_message_with_no_upstream_connection_is_answered_with_an_error(
        upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(json.dumps({"type": "response.cancel"}))
            error = json.loads((await ws.receive(timeout=10)).data)
    assert (error["type"], error["code"]) == ("error", "no_upstream_connection")
    assert upstream.creates == []


async def test_a_later_turn_over_http_is_forwarded_with_capacity_codes_rewritten_never_resent(
        upstream: WsProvider, plain: WsProvider, ws_mitm: Mitmdump) -> None:
    upstream.script(failed_turn("resp_f1"))
    first, failing = answer_turn("resp_http", "Over HTTP"), overload_turn("resp_http2")
    plain.script(first, failing)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("tohttp"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("hello"))
            assert await receive_turn(ws) == first
            await ws.send_str(create("next", previous_response_id="resp_http"))
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == [rewritten(message) for message in failing]
    assert len(plain.posts) == 2  # the failing later turn was not sent again


async def test_pings_never_count_as_output(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    good = answer_turn("resp_after_ping")
    upstream.script([PING, *failed_turn("resp_pinged"), PING], [PING, *good])
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url, autoping=True) as ws:
            await ws.ping()
            await ws.send_str(create("ping me"))
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good  # the failed attempt was re-sent: a ping before it committed nothing
    assert len(upstream.creates) == 2


async def test_held_messages_past_the_staging_limit_commit_and_pass(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """More than `staging_limit` held: the turn commits (it may no longer be re-sent),
    so a failure after it is forwarded, rewritten, never re-sent."""
    big = {"id": "resp_big", "object": "response", "status": "in_progress", "output": [], "instructions": "x" * 3000}
    turn = [event("response.created", sequence_number=0, response=big), *overload_turn("resp_big")[1:]]
    upstream.script(turn)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url_under("small"), proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("big"))
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == [turn[0], rewritten(turn[1]), rewritten(turn[2])]
    assert len(upstream.creates) == 1


async def test_a_backup_on_https_is_asked_over_wss_verified_like_any_upstream(upstream: WsProvider,
                                                                             tmp_path: Path) -> None:
    """An upstream's url is its HTTP URL; its WebSocket is that URL upgraded (https→wss),
    with TLS verified as for HTTP (here: the test CA given to mitmproxy)."""
    ca, cert, key = make_tls_files(tmp_path)
    secure = WsProvider(ssl_context=server_context(cert, key)).start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(WS_RULES.format(backup=secure.http_url, plain=secure.http_url))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", extra_args=["--set", f"ssl_verify_upstream_trusted_ca={ca}"])
    try:
        upstream.script(failed_turn("resp_f1"), failed_turn("resp_f2"))
        good = answer_turn("resp_tls", "Over wss")
        secure.script(good)
        mark = dump.log_mark()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(upstream.proxied_url_under("fallback"), proxy=dump.proxy_url) as ws:
                await ws.send_str(create("secure"))
                got = await receive_turn(ws)
        log = dump.wait_for_log("switchyard.fallback_answered", mark)
    finally:
        dump.stop()
        secure.stop()
    assert got == good
    assert secure.connections == 1 and secure.posts == []  # over the WebSocket, not HTTP
    assert "upstream=backup" in log


async def test_a_backups_own_key_echoed_over_websocket_reaches_neither_the_client_nor_the_flow(
        upstream: WsProvider, backup: WsProvider, tmp_path: Path) -> None:
    """The backup's key comes from the environment; it echoes it in the failure of its
    first attempt and in the answer of its second: `[redacted]` in what the client got,
    in the flow's messages and its story, every other byte as sent."""
    key = "sk-ws-env-KEY-77aa88bb"
    rules = tmp_path / "rules.yaml"
    rules.write_text(WS_RULES.format(backup=backup.http_url, plain=backup.http_url)
                     .replace("Bearer sk-backup-key", "Bearer ${SWY_WS_BACKUP_KEY}"))
    saved = tmp_path / "flows"
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", extra_args=["-w", str(saved)],
                          env={"SWY_WS_BACKUP_KEY": key})
    upstream.script(failed_turn("resp_f1"), failed_turn("resp_f2"))
    refused = event("response.failed", sequence_number=1,
                    response={"id": "resp_b1", "object": "response", "status": "failed", "output": [],
                              "error": {"code": "server_is_overloaded", "message": f"key {key} is overloaded"}})
    answer = full_answer_turn("resp_b2", f"Your key is {key}.")
    backup.script([failed_turn("resp_b1")[0], refused], answer)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(upstream.proxied_url_under("fallback"), proxy=dump.proxy_url) as ws:
                await ws.send_str(create("hi"))
                got = await receive_turn(ws)
        log = dump.wait_for_log("switchyard.websocket_closed")
    finally:
        dump.stop()
    assert [h["Authorization"] for h in backup.handshakes] == [f"Bearer {key}"]  # it was sent its key
    assert sum(key in message for message in answer) == 5  # the delta; the text, part and item done; the response
    assert got == [message.replace(key, "[redacted]") for message in answer]
    assert key not in log and "key [redacted] is overloaded" in log
    with saved.open("rb") as file:
        flow = next(flow for flow in io.FlowReader(file).stream() if flow.websocket)
    assert all(key.encode() not in message.content for message in flow.websocket.messages)
    attempts = [a for turn in flow.metadata["switchyard"]["turns"] for a in turn["attempts"]]
    assert [(a["upstream"], a["outcome"]) for a in attempts] == [
        ("primary", "retry"), ("primary", "next_upstream"), ("backup", "retry"), ("backup", "committed")]
    assert attempts[2]["message"] == "key [redacted] is overloaded"
    assert key not in json.dumps(flow.metadata["switchyard"])
