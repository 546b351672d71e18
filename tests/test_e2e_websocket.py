"""The Responses API over WebSocket through a real mitmdump.

A loopback WebSocket upstream (tests/support/ws_provider.py) speaks the
protocol and fails on demand; a plain aiohttp WebSocket client and the openai
SDK's `client.responses.connect()` talk to it through mitmdump as their proxy.
Each test asserts the exact sequence of message texts the client received,
what the upstream was sent, and what was logged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from mitmproxy import io

from tests.support.mitm import Mitmdump, start_mitmdump
from tests.support.ws_provider import (
    WsProvider,
    answer_turn,
    event,
    failed,
    overload_error,
    overload_turn,
)

WS_RULES = """\
version: 1
defaults:
  retries: 1
  backoff_ms: 1
  max_backoff_ms: 300
routes:
  - name: responses-ws-slow
    match: {path: /slow/v1/responses}
    first_output_timeout_s: 1.0
    upstreams:
      - {name: slow, url: original}
  - name: responses-ws-patient
    match: {path: /patient/v1/responses}
    backoff_ms: 1500
    max_backoff_ms: 4000
    upstreams:
      - {name: patient, url: original}
  - name: responses-ws
    match: {path: /v1/responses}
    upstreams:
      - {name: primary, url: original}
"""

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


@pytest.fixture(scope="module")
def ws_provider() -> Iterator[WsProvider]:
    provider = WsProvider().start()
    yield provider
    provider.stop()


@pytest.fixture(scope="module")
def ws_mitm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("mitm-ws")
    rules = workdir / "rules.yaml"
    rules.write_text(WS_RULES)
    dump = start_mitmdump(rules, workdir / "mitmdump.log")
    yield dump
    dump.stop()


@pytest.fixture
def upstream(ws_provider: WsProvider) -> Iterator[WsProvider]:
    ws_provider.reset()
    yield ws_provider
    ws_provider.reset()


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


async def test_first_turn_overload_before_output_is_retried_once(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    good = answer_turn("resp_2")
    upstream.script(overload_turn("resp_1"), good)
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
    assert "switchyard.websocket_tracked route=responses-ws upstream=primary transport=websocket" in log
    failed_lines = [line for line in log.splitlines() if "switchyard.attempt_failed" in line]
    assert len(failed_lines) == 1
    line = failed_lines[0]
    for part in ("route=responses-ws", "upstream=primary", "transport=websocket", "turn=1", "attempt=1",
                 "code=server_is_overloaded", "event=error", "decision=retry", "delay_s="):
        assert part in line, line
    assert "switchyard.retry_answered route=responses-ws upstream=primary transport=websocket turn=1 attempt=2" in log
    assert "PRIVATE-PROMPT" not in log
    assert "failover_suppressed" not in log


async def test_failure_after_output_is_forwarded_rewritten_not_retried(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    turn = answer_turn("resp_out")[:5] + [overload_error(5), failed("resp_out", 6)]
    upstream.script(turn)
    mark = ws_mitm.log_mark()
    request = create("after output")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == turn[:5] + [rewritten(turn[5]), rewritten(turn[6])]
    assert '"server_error"' in got[5] and "server_is_overloaded" not in got[5] + got[6]
    assert upstream.creates == [request]
    log = ws_mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    suppressed = [line for line in log.splitlines() if "failover_suppressed_after_semantic_output" in line]
    assert len(suppressed) == 2  # the error and the response.failed
    assert all("transport=websocket" in line and "after=output" in line and "turn=1" in line for line in suppressed)
    assert "event=error" in suppressed[0] and "event=response.failed" in suppressed[1]
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
    assert len(suppressed) == 2
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


async def test_first_output_timeout_is_reported_in_band_and_not_retried(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """A silent response cannot be stopped on its connection, and its late messages could
    not be told from a re-sent turn's: Switchyard reports the timeout and drops the rest."""
    late = answer_turn("resp_stall")
    upstream.script(late[:1] + [1.5] + late[1:])  # response.created, silence past the 1 s bound, then the answer
    mark = ws_mitm.log_mark()
    request = create("slow one")
    url = upstream.proxied_url.replace("/v1/responses", "/slow/v1/responses")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(request)
            got = [(await ws.receive(timeout=10)).data, (await ws.receive(timeout=10)).data]
            await assert_nothing_more(ws, wait=1.5)  # the late answer is dropped
    assert got[0] == late[0]  # what was held, then the in-band error
    error = json.loads(got[1])
    assert (error["type"], error["code"], error["error"]["code"]) == ("error", "upstream_timeout", "upstream_timeout")
    assert upstream.creates == [request]  # not re-sent
    log = ws_mitm.wait_for_log("switchyard.attempt_failed", mark)
    line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    for part in ("route=responses-ws-slow", "transport=websocket", "status=504", "event=timeout", "decision=give_up"):
        assert part in line, line


async def test_late_messages_of_a_failed_attempt_never_reach_the_client(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """The failed attempt's response.failed arrives after the turn was re-sent: it is
    recognised by its response id and dropped, not counted against the retry."""
    failed_attempt = overload_turn("resp_A")  # created, error, response.failed
    good = answer_turn("resp_B")
    upstream.script([failed_attempt[0], failed_attempt[1], 0.1, failed_attempt[2]], good)
    mark = ws_mitm.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("x"))
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got == good
    log = ws_mitm.wait_for_log("switchyard.retry_answered", mark)
    assert [line.split("decision=")[1].split()[0] for line in log.splitlines() if "attempt_failed" in line] == ["retry"]


@pytest.mark.parametrize("late", [False, True], ids=["failed-at-once", "failed-after-the-next-turn-began"])
async def test_a_new_turn_during_the_backoff_gets_the_first_turns_failure_and_nothing_else_of_it(
        upstream: WsProvider, ws_mitm: Mitmdump, late: bool) -> None:
    """The client starts turn 2 during turn 1's backoff: it first gets the failure it
    would have had.  Turn 1's `response.failed`, even when it comes after turn 2 began,
    is told by its id as the failed attempt's, never turn 2's result."""
    failing = overload_turn("resp_A")  # created, error, response.failed
    good = answer_turn("resp_B")
    upstream.script([failing[0], failing[1], 0.6, failing[2]] if late else failing, good)
    url = upstream.proxied_url.replace("/v1/responses", "/patient/v1/responses")
    mark = ws_mitm.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("one"))
            # turn 1 failed; its retry waits on a 1.5 s backoff
            await asyncio.to_thread(ws_mitm.wait_for_log, "decision=retry", mark)
            await ws.send_str(create("two"))
            first = (await ws.receive(timeout=10)).data
            got = await receive_turn(ws)
            await assert_nothing_more(ws, wait=2.0)  # the abandoned retry is never sent
    assert first == failing[1]  # the failure the client would have had, not silence
    assert got == good
    assert upstream.creates == [create("one"), create("two")]


async def test_a_timed_out_responses_late_answer_never_becomes_the_next_turns(upstream: WsProvider, ws_mitm: Mitmdump) -> None:
    """The client retries at once after the in-band timeout; the silent response then
    wakes up and finishes: all of it is dropped, and turn 2 gets its own answer."""
    late = answer_turn("resp_stall", text="STALE ANSWER")
    fresh = answer_turn("resp_two", text="FRESH ANSWER")
    upstream.script(late[:1] + [1.5] + late[1:], fresh)
    url = upstream.proxied_url.replace("/v1/responses", "/slow/v1/responses")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("slow one"))
            first = [(await ws.receive(timeout=10)).data, (await ws.receive(timeout=10)).data]
            await ws.send_str(create("again"))  # the client's own retry, right after the timeout
            second = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert json.loads(first[1])["code"] == "upstream_timeout"
    assert second == fresh


async def test_the_next_turns_own_error_is_not_drained_with_a_timed_out_response(upstream: WsProvider,
                                                                                 ws_mitm: Mitmdump) -> None:
    """An `error` names no response: it may be the next turn's (a create rejected at
    once), so it reaches the client even while a timed-out response is drained."""
    late = answer_turn("resp_stall")
    rejected = event("error", status=429, error={"type": "rate_limit_error", "code": "rate_limit_exceeded",
                                                 "message": "Rate limit reached"})
    upstream.script([late[0], 1.2, overload_error(1)], [rejected])  # silent, then dies with a bare error
    url = upstream.proxied_url.replace("/v1/responses", "/slow/v1/responses")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("slow one"))
            first = [(await ws.receive(timeout=10)).data, (await ws.receive(timeout=10)).data]
            await asyncio.sleep(1.5)  # the silent response dies meanwhile (at 1.2 s)
            await ws.send_str(create("again"))
            second = (await ws.receive(timeout=5)).data
    assert json.loads(first[1])["code"] == "upstream_timeout"
    assert json.loads(second)["error"]["code"] == "rate_limit_exceeded"


async def test_a_response_that_timed_out_before_naming_itself_is_still_drained(upstream: WsProvider,
                                                                             ws_mitm: Mitmdump) -> None:
    """Silent from the start: when it wakes before the client's next turn, the first
    response it names can only be the silent one's, and all of it is dropped, also
    what comes once the next turn has begun."""
    late = answer_turn("resp_stall", text="STALE ANSWER")
    fresh = answer_turn("resp_two", text="FRESH ANSWER")
    upstream.script([1.2, *late[:2], 1.5, *late[2:]], fresh)  # wakes at 1.2 s, goes on at 2.7 s
    url = upstream.proxied_url.replace("/v1/responses", "/slow/v1/responses")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("slow one"))
            timeout_error = (await ws.receive(timeout=10)).data  # at 1 s
            await asyncio.sleep(1.0)  # it wakes and names itself meanwhile (at 1.2 s)
            await ws.send_str(create("again"))
            second = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert json.loads(timeout_error)["code"] == "upstream_timeout"
    assert second == fresh


async def test_a_failed_attempts_straggler_does_not_stop_the_draining_of_a_silent_retry(upstream: WsProvider,
                                                                                       ws_mitm: Mitmdump) -> None:
    """The first attempt failed (retried); the retry named itself, then went silent
    (timed out). A late message of the first attempt is neither the silent response
    nor a new one: the silent one goes on being dropped, and turn 2 gets its own."""
    first_attempt = overload_turn("resp_A")  # created, error, response.failed
    retry = answer_turn("resp_B", text="LATE ANSWER")
    fresh = answer_turn("resp_two", text="FRESH ANSWER")
    upstream.script(first_attempt[:2], [retry[0], 1.2, first_attempt[2], 0.3, *retry[1:]], fresh)
    url = upstream.proxied_url.replace("/v1/responses", "/slow/v1/responses")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, proxy=ws_mitm.proxy_url) as ws:
            await ws.send_str(create("slow one"))
            held, timeout_error = (await ws.receive(timeout=10)).data, (await ws.receive(timeout=10)).data
            await ws.send_str(create("again"))
            second = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert held == retry[0]  # what was held of the retry, then the timeout
    assert json.loads(timeout_error)["code"] == "upstream_timeout"
    assert second == fresh


async def test_a_route_led_by_another_upstream_keeps_the_websocket_and_says_so(upstream: WsProvider,
                                                                             tmp_path: Path) -> None:
    """A WebSocket is not re-aimed: its turns go where the client connected, and the
    log and the flow's story name that server, not the route's first upstream."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("""\
version: 1
defaults: {retries: 1, backoff_ms: 1}
routes:
  - name: responses-ws-gateway
    match: {path: /v1/responses}
    upstreams:
      - {name: gateway, url: "http://127.0.0.1:9/v1/responses", retries: 0}
""")
    saved = tmp_path / "flows"
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", extra_args=["-w", str(saved)])
    turns = [create("one"), create("two"), create("three")]
    upstream.script(overload_turn("resp_1"), answer_turn("resp_2"), answer_turn("resp_3"), answer_turn("resp_4"))
    try:
        mark = dump.log_mark()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(upstream.proxied_url, proxy=dump.proxy_url) as ws:
                answers = []
                for turn in turns:
                    await ws.send_str(turn)
                    answers.append(await receive_turn(ws))
        assert answers == [answer_turn("resp_2"), answer_turn("resp_3"), answer_turn("resp_4")]
        assert upstream.creates == [turns[0], *turns]  # the original server, turn 1 twice (the route's retries)
        log = dump.wait_for_log("switchyard.retry_answered", mark)
        assert "switchyard.websocket_stays_with_original route=responses-ws-gateway upstream=gateway" in log
        assert "switchyard.attempt_failed route=responses-ws-gateway upstream=original" in log
    finally:
        dump.stop()
    with saved.open("rb") as file:
        story = next(flow.metadata["switchyard"] for flow in io.FlowReader(file).stream() if flow.websocket)
    assert story["upstream"] == "original"
    assert [[a["outcome"] for a in turn["attempts"]] for turn in story["turns"]] == [
        ["retry", "committed"], ["passed_through"], ["passed_through"]]
