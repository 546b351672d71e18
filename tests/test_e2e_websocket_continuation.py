"""`continue_after_cut` on WebSocket turns, through a real mitmdump.

The upstreams are loopback Responses servers that speak WebSocket and HTTP SSE
(tests/support/ws_provider.py); the clients are a plain aiohttp WebSocket
client and the openai SDK's `client.responses.connect()`.  A turn's answer is
cut after output (the upstream closes its WebSocket, or goes silent past
`idle_timeout_s`); the continuation is asked over HTTP SSE and re-framed into
the client's response.  Each test asserts the exact messages the client got,
the exact continuation body each upstream was sent, and what was logged.
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
from mitmproxy import http, io

from tests.support.mitm import Mitmdump, free_port, mitmdump_on, start_mitmdump
from tests.support.ws_provider import CLOSE, WsProvider, event, full_answer_turn
from tests.test_e2e_websocket import TERMINAL, assert_nothing_more, create, receive_turn

RULES = """\
version: 1
defaults: {{retries: 0, backoff_ms: 1, idle_timeout_s: 1}}
routes:
  - name: ws-continue
    match: {{path: /cont/v1/responses}}
    continue_after_cut: [prefill, regenerate]
    upstreams:
      - {{name: primary, url: original, prefill: true}}
      - {{name: backup, url: "{backup}", auth: {{header: Authorization, value: "Bearer sk-backup-key"}}}}
  - name: ws-regenerate
    match: {{path: /regen/v1/responses}}
    continue_after_cut: [regenerate]
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "{backup}", auth: {{header: Authorization, value: "Bearer sk-backup-key"}}}}
  - name: ws-over-http
    match: {{path: /overhttp/v1/responses}}
    continue_after_cut: [prefill]
    upstreams:
      - {{name: primary, url: original, websocket: false, prefill: true}}
  - name: ws-small
    match: {{path: /small/v1/responses}}
    staging_limit: 2KB
    continue_after_cut: [regenerate]
    upstreams:
      - {{name: primary, url: original}}
  - name: ws-reset
    match: {{path: /reset/v1/responses}}
    continue_after_cut: [prefill]
    upstreams:
      - {{name: primary, url: original, prefill: true}}
  - name: ws-plain
    match: {{path: /plain/v1/responses}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "{backup}"}}
faults:
  - {{route: ws-reset, upstream: primary, kind: reset, after_frames: 5}}
"""

WHOLE = "Hello, world! How are you today?"
SENT = "Hello, wor"  # what the client has when the cut comes


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory, backup_provider: WsProvider) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("ws-continue"), RULES.format(backup=backup_provider.http_url)) as started:
        yield started




def cut_turn(rid: str, then: list[str | float]) -> list[str | float]:
    """The start of `WHOLE` as OpenAI streams it, cut after `SENT`: `then` says how
    (CLOSE, or a pause longer than idle_timeout_s)."""
    item_id = f"msg_{rid}"
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    return [
        event("response.created", sequence_number=0, response=response),
        event("response.output_item.added", sequence_number=1, output_index=0,
              item={"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}),
        event("response.content_part.added", sequence_number=2, **where,
              part={"type": "output_text", "text": "", "annotations": []}),
        event("response.output_text.delta", sequence_number=3, **where, delta=SENT[:5]),
        event("response.output_text.delta", sequence_number=4, **where, delta=SENT[5:]),
        *then,
    ]


def continued_messages(rid: str, rest: str, after: int = 4) -> list[dict[str, Any]]:
    """What the client gets after the cut: the rest of the text and the ends, with the
    original response's ids and its sequence numbers going on from `after`."""
    item_id = f"msg_{rid}"
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": WHOLE, "annotations": []}
    item = {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    return [
        {"type": "response.output_text.delta", "sequence_number": after + 1, **where, "delta": rest},
        {"type": "response.output_text.done", "sequence_number": after + 2, **where, "text": WHOLE},
        {"type": "response.content_part.done", "sequence_number": after + 3, **where, "part": part},
        {"type": "response.output_item.done", "sequence_number": after + 4, "output_index": 0, "item": item},
        {"type": "response.completed", "sequence_number": after + 5,
         "response": {"id": rid, "object": "response", "status": "completed", "output": [item], "usage": usage}},
    ]


def prefilled_body(user: str, text: str = SENT) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": [{"role": "user", "content": user},
                                         {"type": "message", "role": "assistant",
                                          "content": [{"type": "output_text", "text": text}]}],
            "stream": True}


def lines_of(log: str, name: str) -> list[str]:
    return [line for line in log.splitlines() if name in line]


async def test_a_websocket_closed_after_output_is_finished_by_a_prefill_and_the_connection_lives_on(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    cut = cut_turn("resp_cut", [CLOSE])
    primary.script(cut, full_answer_turn("resp_more", WHOLE[len(SENT):]),  # the POSTed prefill
                   full_answer_turn("resp_next", "Second answer"))  # the next turn, on a new WebSocket
    mark = dump.log_mark()
    first = create("hi")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("cont"), proxy=dump.proxy_url) as ws:
            await ws.send_str(first)
            got = await receive_turn(ws)
            await ws.send_str(create("and then?", previous_response_id="resp_cut"))
            second = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got[:5] == cut[:5]  # what the client had, exactly as sent
    assert [json.loads(m) for m in got[5:]] == continued_messages("resp_cut", WHOLE[len(SENT):])
    assert second == full_answer_turn("resp_next", "Second answer")
    # the continuation asked the cut upstream over HTTP for the rest of the text the client has
    assert [json.loads(body) for body in primary.posts] == [prefilled_body("hi")]
    assert backup.posts == [] and backup.creates == []
    # the next turn names the cut response: it is folded with the whole answer the client got
    assert primary.creates[0] == first
    assert json.loads(primary.creates[1]) == {
        "type": "response.create", "model": "gpt-4o",
        "input": [{"role": "user", "content": "hi"},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": WHOLE}]},
                  {"role": "user", "content": "and then?"}]}
    assert primary.connections == 2
    log = dump.wait_for_log("switchyard.websocket_closed", mark)
    continued = lines_of(log, "switchyard.continued_after_cut")
    assert len(continued) == 1, log
    for part in ("route=ws-continue", "upstream=primary", "attempt=2", "strategy=prefill", f"chars_sent={len(SENT)}",
                 "transport=websocket turn=1"):
        assert part in continued[0], continued[0]
    assert "switchyard.continuation_failed" not in log and "stream_cut_after_output" not in log
    assert "turns=2" in lines_of(log, "switchyard.websocket_closed")[0]


async def test_a_turn_answered_over_http_sse_and_cut_is_finished_the_same_way(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    """An upstream asked over HTTP for the client's WebSocket turns (`websocket: false`):
    its stream ends early, and the prefill's events reach the client as messages."""
    cut = cut_turn("resp_h", [CLOSE])  # over HTTP: the stream ends there
    primary.script(cut, full_answer_turn("resp_more", WHOLE[len(SENT):]), full_answer_turn("resp_h2", "Again."))
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("overhttp"), proxy=dump.proxy_url) as ws:
            await ws.send_str(create("hi"))
            got = await receive_turn(ws)
            await ws.send_str(create("more", previous_response_id="resp_h"))
            second = await receive_turn(ws)
    assert got[:5] == cut[:5]
    assert [json.loads(m) for m in got[5:]] == continued_messages("resp_h", WHOLE[len(SENT):])
    assert second == full_answer_turn("resp_h2", "Again.")
    assert primary.creates == []
    asked, prefill, later = (json.loads(body) for body in primary.posts)
    assert asked == {"model": "gpt-4o", "input": "hi", "stream": True}
    assert prefill == prefilled_body("hi")
    assert later == {"model": "gpt-4o", "stream": True, "input": [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": WHOLE}]},
        {"role": "user", "content": "more"}]}


async def test_a_connection_broken_after_output_is_finished_too(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    """A `reset` fault breaks the upstream socket off after five messages (no close
    frame): without continuation the client's WebSocket would end with 1011."""
    whole = full_answer_turn("resp_reset", WHOLE)
    primary.script(cut_turn("resp_reset", [0.2, *whole[3:]]), full_answer_turn("resp_more", WHOLE[len(SENT):]))
    mark = dump.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("reset"), proxy=dump.proxy_url) as ws:
            await ws.send_str(create("hi"))
            got = await receive_turn(ws)
            await assert_nothing_more(ws)
    assert got[:5] == cut_turn("resp_reset", [])
    assert [json.loads(m) for m in got[5:]] == continued_messages("resp_reset", WHOLE[len(SENT):])
    assert [json.loads(body) for body in primary.posts] == [prefilled_body("hi")]
    log = dump.wait_for_log("switchyard.continued_after_cut", mark)
    assert "kind=reset" in log
    assert "route=ws-reset upstream=primary attempt=2 strategy=prefill" in log


async def test_a_stall_after_output_is_regenerated_by_the_backup_when_the_primarys_regeneration_differs(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    cut = cut_turn("resp_stall", [3.0, event("response.output_text.delta", sequence_number=5,
                                              item_id="msg_resp_stall", output_index=0, content_index=0,
                                              delta="LATE TEXT")])
    primary.script(cut, full_answer_turn("resp_other", "Hello, there! Something else entirely."))
    backup.script(full_answer_turn("resp_again", WHOLE))
    mark = dump.log_mark()
    request = create("hi", store=False)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("regen"), proxy=dump.proxy_url) as ws:
            await ws.send_str(request)
            got = await receive_turn(ws)
            await assert_nothing_more(ws, wait=2.5)  # nothing of the stalled answer, ever
    assert got[:5] == cut[:5]
    assert [json.loads(m) for m in got[5:]] == continued_messages("resp_stall", WHOLE[len(SENT):])
    regenerate = {"model": "gpt-4o", "input": "hi", "store": False, "stream": True}  # the request as it was
    assert [json.loads(body) for body in primary.posts] == [regenerate]
    assert [json.loads(body) for body in backup.posts] == [regenerate]
    assert backup.post_headers[0]["Authorization"] == "Bearer sk-backup-key"
    log = dump.wait_for_log("switchyard.continued_after_cut", mark)
    failed = lines_of(log, "switchyard.continuation_failed")
    assert len(failed) == 1, log
    for part in ("upstream=primary", "attempt=2", "strategy=regenerate",
                 "the regenerated text differs (matched 7 of 10 characters)"):
        assert part in failed[0], failed[0]
    continued = lines_of(log, "switchyard.continued_after_cut")[0]
    for part in ("route=ws-regenerate", "upstream=backup", "attempt=3", "strategy=regenerate"):
        assert part in continued, continued


async def test_when_no_continuation_finishes_the_answer_the_client_gets_the_close(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    cut = cut_turn("resp_lost", [CLOSE])
    primary.script(cut, full_answer_turn("resp_x", "Goodbye."))
    backup.script(full_answer_turn("resp_y", "Something else."))
    mark = dump.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("regen"), proxy=dump.proxy_url) as ws:
            await ws.send_str(create("hi"))
            got = [(await ws.receive(timeout=10)).data for _ in range(5)]
            closing = await ws.receive(timeout=10)
    assert got == cut[:5]
    assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1000)  # the original cut: the upstream's close
    assert len(primary.posts) == 1 and len(backup.posts) == 1
    log = dump.wait_for_log("switchyard.websocket_closed", mark)
    assert len(lines_of(log, "switchyard.continuation_failed")) == 2
    assert "switchyard.continued_after_cut" not in log


@pytest.mark.parametrize("how", ["close", "stall"])
async def test_a_route_without_continue_after_cut_ends_the_turn_as_before(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump, how: str) -> None:
    cut = cut_turn("resp_plain", [CLOSE] if how == "close" else [3.0])
    primary.script(cut)
    mark = dump.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("plain"), proxy=dump.proxy_url) as ws:
            await ws.send_str(create("hi"))
            got = [(await ws.receive(timeout=10)).data for _ in range(5)]
            end = await ws.receive(timeout=10)
    assert got == cut[:5]
    if how == "close":
        assert (end.type, end.data) == (aiohttp.WSMsgType.CLOSE, 1000)
    else:
        error = json.loads(end.data)
        assert (error["type"], error["code"]) == ("error", "stream_stalled")
    assert primary.posts == [] and backup.posts == [] and backup.creates == []
    log = dump.wait_for_log("switchyard.websocket_closed" if how == "close" else "stream_cut_after_output", mark)
    assert "switchyard.continued_after_cut" not in log and "continuation" not in log


async def test_the_openai_sdk_gets_one_whole_answer_and_its_next_turn(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    primary.script(cut_turn("resp_sdk", [CLOSE]), full_answer_turn("resp_more", WHOLE[len(SENT):]),
                   full_answer_turn("resp_sdk2", "Fine, thanks."))
    client = openai.AsyncOpenAI(api_key="sk-test-ws", base_url=f"http://127.0.0.1:{primary.port}/cont/v1")
    texts: list[str] = []
    finals: list[Any] = []
    async with (asyncio.timeout(20),
                client.responses.connect(websocket_connection_options={"proxy": dump.proxy_url}) as connection):
        for request, previous in (("hi", None), ("and you?", "resp_sdk")):
            extra = {"previous_response_id": previous} if previous else {}
            await connection.response.create(model="gpt-4o", input=request, **extra)  # type: ignore[arg-type]
            text = ""
            async for server_event in connection:
                if server_event.type == "response.output_text.delta":
                    text += server_event.delta
                if server_event.type in TERMINAL:
                    finals.append(server_event.response)  # type: ignore[union-attr]
                    break
            texts.append(text)
    assert texts == [WHOLE, "Fine, thanks."]
    assert finals[0].id == "resp_sdk" and finals[0].output_text == WHOLE
    assert finals[0].output[0].id == "msg_resp_sdk"
    assert [json.loads(body) for body in primary.posts] == [prefilled_body("hi")]
    later = json.loads(primary.creates[1])
    assert "previous_response_id" not in later
    assert later["input"][1] == {"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": WHOLE}]}


async def test_reasoning_the_client_got_whole_is_carried_back_and_kept_in_its_answer(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    """How Codex's models answer: a finished reasoning item, then the text.  The prefill
    carries the item back (its encrypted content: `store: false`); the continuation's
    own reasoning never reaches the client; the next turn gets the whole answer."""
    thought = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Greeting."}],
               "encrypted_content": "gAAAAB-thought"}
    response = {"id": "resp_r", "object": "response", "status": "in_progress", "output": []}
    where = {"item_id": "msg_r", "output_index": 1, "content_index": 0}
    cut = [
        event("response.created", sequence_number=0, response=response),
        event("response.output_item.added", sequence_number=1, output_index=0, item={**thought, "summary": []}),
        event("response.output_item.done", sequence_number=2, output_index=0, item=thought),
        event("response.output_item.added", sequence_number=3, output_index=1,
              item={"id": "msg_r", "type": "message", "role": "assistant", "status": "in_progress", "content": []}),
        event("response.content_part.added", sequence_number=4, **where,
              part={"type": "output_text", "text": "", "annotations": []}),
        event("response.output_text.delta", sequence_number=5, **where, delta=SENT),
        CLOSE,
    ]
    again = {"id": "rs_2", "type": "reasoning", "summary": [], "encrypted_content": "gAAAAB-again"}
    theirs = {"item_id": "msg_c", "output_index": 1, "content_index": 0}
    rest = WHOLE[len(SENT):]
    part = {"type": "output_text", "text": rest, "annotations": []}
    item = {"id": "msg_c", "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    continuation = [
        event("response.created", sequence_number=0, response={**response, "id": "resp_c"}),
        event("response.output_item.added", sequence_number=1, output_index=0, item=again),
        event("response.output_item.done", sequence_number=2, output_index=0, item=again),
        event("response.output_item.added", sequence_number=3, output_index=1, item={**item, "content": []}),
        event("response.content_part.added", sequence_number=4, **theirs, part={**part, "text": ""}),
        event("response.output_text.delta", sequence_number=5, **theirs, delta=rest),
        event("response.output_text.done", sequence_number=6, **theirs, text=rest),
        event("response.content_part.done", sequence_number=7, **theirs, part=part),
        event("response.output_item.done", sequence_number=8, output_index=1, item=item),
        event("response.completed", sequence_number=9,
              response={**response, "id": "resp_c", "status": "completed", "output": [again, item]}),
    ]
    primary.script(cut, continuation, full_answer_turn("resp_next", "Next."))
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("cont"), proxy=dump.proxy_url) as ws:
            await ws.send_str(create("hi", store=False, include=["reasoning.encrypted_content"]))
            got = await receive_turn(ws)
            await ws.send_str(create("next", store=False, previous_response_id="resp_r"))
            assert await receive_turn(ws) == full_answer_turn("resp_next", "Next.")
    whole_part = {**part, "text": WHOLE}
    whole_item = {**item, "id": "msg_r", "content": [whole_part]}
    assert got[:6] == cut[:6]
    assert [json.loads(m) for m in got[6:]] == [
        {"type": "response.output_text.delta", "sequence_number": 6, **where, "delta": rest},
        {"type": "response.output_text.done", "sequence_number": 7, **where, "text": WHOLE},
        {"type": "response.content_part.done", "sequence_number": 8, **where, "part": whole_part},
        {"type": "response.output_item.done", "sequence_number": 9, "output_index": 1, "item": whole_item},
        {"type": "response.completed", "sequence_number": 10,
         "response": {**response, "status": "completed", "output": [thought, whole_item]}},
    ]
    carried = {"type": "reasoning", "id": "rs_1", "summary": thought["summary"], "encrypted_content": "gAAAAB-thought"}
    assert [json.loads(body) for body in primary.posts] == [{
        "model": "gpt-4o", "store": False, "include": ["reasoning.encrypted_content"], "stream": True,
        "input": [{"role": "user", "content": "hi"}, carried,
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": SENT}]}]}]
    assert json.loads(primary.creates[1])["input"] == [
        {"role": "user", "content": "hi"}, carried,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": WHOLE}]},
        {"role": "user", "content": "next"}]


async def test_an_answer_longer_than_the_staging_limit_is_not_continued(
        primary: WsProvider, backup: WsProvider, dump: Mitmdump) -> None:
    """What the client got of a turn is kept only up to `staging_limit`: past it, the
    cut is the final word, and nothing is asked."""
    long = cut_turn("resp_long", [CLOSE])
    long[4] = event("response.output_text.delta", sequence_number=4, item_id="msg_resp_long", output_index=0,
                    content_index=0, delta="x" * 3000)
    primary.script(long)
    mark = dump.log_mark()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(primary.proxied_url_under("small"), proxy=dump.proxy_url) as ws:
            await ws.send_str(create("hi"))
            got = [(await ws.receive(timeout=10)).data for _ in range(5)]
            closing = await ws.receive(timeout=10)
    assert got == long[:5]
    assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1000)
    assert primary.posts == []
    log = dump.wait_for_log("switchyard.not_continued", mark)
    line = lines_of(log, "switchyard.not_continued")[0]
    assert "route=ws-small" in line and "staging_limit" in line and "transport=websocket turn=1" in line, line


async def test_the_flow_story_mitmweb_and_status_say_who_continued_each_turn(
        primary: WsProvider, backup: WsProvider, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(backup=backup.http_url))
    saved = tmp_path / "flows"
    web = start_mitmdump(rules, tmp_path / "mitmdump.log", web=True,
                         extra_args=["-w", str(saved), "--set", "web_open_browser=false",
                                     "--set", f"web_port={free_port()}"])
    primary.script(cut_turn("resp_a", [CLOSE]), full_answer_turn("resp_more", WHOLE[len(SENT):]),
                   cut_turn("resp_b", [CLOSE]), full_answer_turn("resp_x", "Goodbye."))
    backup.script(full_answer_turn("resp_y", "Something else."))
    try:
        mark = web.log_mark()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(primary.proxied_url_under("cont"), proxy=web.proxy_url) as ws:
                await ws.send_str(create("one"))
                await receive_turn(ws)  # continued
            async with session.ws_connect(primary.proxied_url_under("regen"), proxy=web.proxy_url) as ws:
                await ws.send_str(create("two"))
                while (await ws.receive(timeout=10)).type is aiohttp.WSMsgType.TEXT:
                    pass  # cut: the client gets the close
        await asyncio.to_thread(web.wait_for_log, "switchyard.websocket_closed", mark, 10.0, 2)
        status = (await asyncio.to_thread(web_call, web, "POST", "/commands/switchyard.status",
                                          {"arguments": []}))["value"]
        flows = await asyncio.to_thread(web_call, web, "GET", "/flows")
    finally:
        web.stop()
    assert ("websocket: connections=2, turns=2, retries_answered=0, fallbacks=0, suppressed_failovers=0, "
            "continued_after_cut=1, continuations_failed=1") in status
    attempts = sorted(f["comment"] for f in flows if "; attempt " in f.get("comment", ""))
    assert attempts == [
        "prefill continuation: 200 → continued; attempt 2 (ws-continue: primary)",
        "regenerate continuation: 200 the regenerated text differs (matched 0 of 10 characters) "
        "→ continuation_failed; attempt 2 (ws-regenerate: primary)",
        "regenerate continuation: 200 the regenerated text differs (matched 0 of 10 characters) "
        "→ continuation_failed; attempt 3 (ws-regenerate: backup)",
    ]
    with saved.open("rb") as file:
        stories = [(flow.comment, flow.marked, flow.metadata["switchyard"]) for flow in io.FlowReader(file).stream()
                   if isinstance(flow, http.HTTPFlow) and flow.websocket]
    (continued_comment, continued_mark, continued), (failed_comment, failed_mark, failed) = stories
    assert (continued_mark, failed_mark) == (":arrows_counterclockwise:", ":warning:")
    cut = "primary: upstream closed the WebSocket after output (code 1000)"
    assert continued_comment == f"turn 1: {cut} → primary continued it (prefill)"
    assert failed_comment == f"turn 1: {cut} → 2 continuation(s) failed"
    turn = continued["turns"][0]
    assert (turn["upstream"], turn["transport"], turn["outcome"]) == ("primary", "websocket", "continued")
    assert [(a["upstream"], a["outcome"], a["continuation"]) for a in turn["attempts"]] == [
        ("primary", "committed", None), ("primary", "continued", "prefill")]
    turn = failed["turns"][0]
    assert [(a["upstream"], a["outcome"], a["continuation"]) for a in turn["attempts"]] == [
        ("primary", "committed", None), ("primary", "continuation_failed", "regenerate"),
        ("backup", "continuation_failed", "regenerate")]


def web_call(web: Mitmdump, method: str, path: str, data: object = None) -> Any:
    base, _, token = web.web_url.partition("?")
    xsrf = "0123456789abcdef0123456789abcdef"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{base.rstrip('/')}{path}?{token}", method=method, data=None if data is None else json.dumps(data).encode(),
        headers={"X-XSRFToken": xsrf, "Cookie": f"_mitmproxy_xsrf={xsrf}", "Content-Type": "application/json"})
    with opener.open(request, timeout=10) as answer:
        return json.loads(answer.read())
