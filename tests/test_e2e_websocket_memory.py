"""Memory a WebSocket peer controls, through a real mitmdump: one side sends fast
while the other reads nothing, then everything."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsproto.events import TextMessage

from tests.support.mitm import Mitmdump, start_mitmdump
from tests.support.ws_provider import HOLD, WsProvider, answer_turn, event, slow_client
from tests.test_load import memory_kib

MESSAGES = 1500
PIECE = base64.b64encode(os.urandom(48 * 1024)).decode()  # 64 KiB a message, incompressible
GROWTH_BOUND_MB = 48  # the README's bound while the client reads nothing; the upstream offers 96 MiB


@pytest.fixture
def upstream() -> Iterator[WsProvider]:
    provider = WsProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def dump(tmp_path: Path) -> Iterator[Mitmdump]:
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n"
                     "    upstreams: [{name: primary, url: original}]\n")
    proxy = start_mitmdump(rules, tmp_path / "mitmdump.log")
    yield proxy
    proxy.stop()


def test_an_upstream_sending_fast_to_a_client_that_reads_nothing_is_held_back_in_bounded_memory(
        upstream: WsProvider, dump: Mitmdump) -> None:
    head, end = answer_turn("resp_big")[:5], answer_turn("resp_big")[-1]
    delta = event("response.output_text.delta", item_id="msg_resp_big", output_index=0, content_index=0,
                  delta=PIECE)
    upstream.script([*head, *[delta] * MESSAGES, end])
    before_mb = memory_kib(dump.process.pid, "VmRSS") / 1024
    sock, ws = slow_client(dump.proxy_port, upstream)
    sock.sendall(ws.send(TextMessage(data=json.dumps({"type": "response.create", "model": "m", "input": "x"}))))
    sent, unchanged = -1, 0
    for _ in range(200):  # bounded: until the upstream has been held back a while (or sent everything)
        time.sleep(0.25)
        unchanged = unchanged + 1 if upstream.sent == sent else 0
        sent = upstream.sent
        if unchanged >= 8 or sent == MESSAGES + 6:
            break
    grown_mb = memory_kib(dump.process.pid, "VmRSS") / 1024 - before_mb
    assert sent < MESSAGES // 2  # held back: Switchyard stopped reading the upstream
    assert grown_mb < GROWTH_BOUND_MB
    # the client reads now: everything arrives, in order, whole
    digest, expected = hashlib.sha256(), hashlib.sha256()
    for text in [*head, *[delta] * MESSAGES, end]:
        expected.update(text.encode())
    got = 0
    while got < MESSAGES + 6:
        data = sock.recv(1 << 20)
        assert data, f"the connection ended after {got} messages"
        ws.receive_data(data)
        for item in ws.events():
            if isinstance(item, TextMessage):
                digest.update(item.data.encode())
                got += item.message_finished
    sock.close()
    assert got == MESSAGES + 6 and digest.hexdigest() == expected.hexdigest()


@pytest.mark.parametrize("what", ["other", "create"])
def test_a_client_sending_fast_while_its_turn_waits_on_the_upstream_is_held_back_in_bounded_memory(
        upstream: WsProvider, dump: Mitmdump, what: str) -> None:
    """Messages for the upstream's connection (it reads nothing), or turns queued behind
    the one in progress: the client is read no further than a bound, and loses nothing."""
    upstream.script([answer_turn("resp_held")[0], HOLD, *answer_turn("resp_held")[1:]])
    before_mb = memory_kib(dump.process.pid, "VmRSS") / 1024
    sock, ws = slow_client(dump.proxy_port, upstream)
    sock.sendall(ws.send(TextMessage(data=json.dumps({"type": "response.create", "model": "m", "input": "x"}))))
    for _ in range(200):  # bounded: until the upstream holds (the turn is on)
        if upstream.creates:
            break
        time.sleep(0.05)
    count = MESSAGES if what == "other" else MESSAGES // 8  # as many bytes, fewer turns to answer
    if what == "create":
        text = json.dumps({"type": "response.create", "model": "m", "input": PIECE * 8})
    else:
        text = json.dumps({"type": "conversation.item.create", "item": {"type": "message", "content": PIECE}})
    frame = ws.send(TextMessage(data=text))
    written = [0]

    def blast() -> None:
        for _ in range(count):
            sock.sendall(frame)
            written[0] += 1

    sender = threading.Thread(target=blast, daemon=True)
    sender.start()
    sent, unchanged = -1, 0
    for _ in range(200):  # bounded: until the client has been held back a while (or sent everything)
        time.sleep(0.25)
        unchanged = unchanged + 1 if written[0] == sent else 0
        sent = written[0]
        if unchanged >= 8 or sent == count:
            break
    grown_mb = memory_kib(dump.process.pid, "VmRSS") / 1024 - before_mb
    assert sent < count // 2  # held back: Switchyard stopped reading the client
    assert grown_mb < GROWTH_BOUND_MB
    upstream.release()  # it reads now: everything arrives, in order, whole
    completed = 0
    while what == "create" and completed < 1 + count:  # every turn answered, read as it comes
        data = sock.recv(1 << 20)
        assert data, f"the connection ended after {completed} turns"
        ws.receive_data(data)
        completed += sum(isinstance(e, TextMessage) and '"response.completed"' in e.data for e in ws.events())
    sender.join(60)
    for _ in range(600):  # bounded: until the upstream has read them all
        if upstream.others == count or what == "create":
            break
        time.sleep(0.05)
    sock.close()
    if what == "create":
        assert len(upstream.creates) == 1 + count and all(c == text for c in upstream.creates[1:])
    else:
        expected = hashlib.sha256()
        for _ in range(count):
            expected.update(text.encode())
        assert upstream.others == count and upstream.others_digest.hexdigest() == expected.hexdigest()


def test_a_client_that_reads_nothing_for_longer_than_idle_timeout_s_still_gets_the_whole_answer(
        upstream: WsProvider, tmp_path: Path) -> None:
    """The upstream is quiet only because Switchyard holds it back for the client: that is
    no stall (as over HTTP), so the turn is not cut with an error and its upstream dropped."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n"
                     "    idle_timeout_s: 1\n    upstreams: [{name: primary, url: original}]\n")
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log")
    count = 300
    head, end = answer_turn("resp_big")[:5], answer_turn("resp_big")[-1]
    delta = event("response.output_text.delta", item_id="msg_resp_big", output_index=0, content_index=0,
                  delta=PIECE)
    upstream.script([*head, *[delta] * count, end])
    try:
        sock, ws = slow_client(dump.proxy_port, upstream)
        sock.sendall(ws.send(TextMessage(data=json.dumps({"type": "response.create", "model": "m", "input": "x"}))))
        sent, unchanged = -1, 0
        for _ in range(200):  # bounded: until the upstream has been held back for over 2 s
            time.sleep(0.25)
            unchanged = unchanged + 1 if upstream.sent == sent else 0
            sent = upstream.sent
            if unchanged >= 10 or sent == count + 6:
                break
        assert sent < count  # held back for the client
        texts: list[str] = []
        part = ""
        while len(texts) < count + 6:
            data = sock.recv(1 << 20)
            assert data, f"the connection ended after {len(texts)} messages"
            ws.receive_data(data)
            for item in ws.events():
                if isinstance(item, TextMessage):
                    part += item.data
                    if item.message_finished:
                        texts.append(part)
                        part = ""
        sock.close()
    finally:
        dump.stop()
    log = dump.log()
    assert texts[-1] == end and texts == [*head, *[delta] * count, end]
    assert "stream_stalled" not in log and "sent nothing" not in log


def test_a_turn_answered_over_http_sse_to_a_client_that_reads_nothing_is_held_back_in_bounded_memory(
        tmp_path: Path) -> None:
    """An upstream that speaks only HTTP (`websocket: false`) answers the WebSocket turn
    with 96 MiB of SSE: while the client reads nothing it is held back as a WebSocket
    upstream is, and everything arrives whole once the client reads."""
    plain = WsProvider(websocket=False).start()
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n"
                     f"    upstreams: [{{name: plain, url: \"{plain.http_url}\", websocket: false}}]\n")
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log")
    head, end = answer_turn("resp_big")[:5], answer_turn("resp_big")[-1]
    delta = event("response.output_text.delta", item_id="msg_resp_big", output_index=0, content_index=0,
                  delta=PIECE)
    plain.script([*head, *[delta] * MESSAGES, end])
    try:
        before_mb = memory_kib(dump.process.pid, "VmRSS") / 1024
        sock, ws = slow_client(dump.proxy_port, plain)
        sock.sendall(ws.send(TextMessage(data=json.dumps({"type": "response.create", "model": "m", "input": "x"}))))
        rss, unchanged = -1.0, 0
        for _ in range(200):  # bounded: until mitmdump's memory stops growing a while
            time.sleep(0.25)
            now = memory_kib(dump.process.pid, "VmRSS") / 1024
            unchanged = unchanged + 1 if abs(now - rss) < 1 else 0
            rss = now
            if unchanged >= 8:
                break
        grown_mb = memory_kib(dump.process.pid, "VmRSS") / 1024 - before_mb
        digest, expected = hashlib.sha256(), hashlib.sha256()
        for text in [*head, *[delta] * MESSAGES, end]:
            expected.update(text.encode())
        got = 0
        while got < MESSAGES + 6:
            data = sock.recv(1 << 20)
            assert data, f"the connection ended after {got} messages"
            ws.receive_data(data)
            for item in ws.events():
                if isinstance(item, TextMessage):
                    digest.update(item.data.encode())
                    got += item.message_finished
        sock.close()
    finally:
        dump.stop()
        plain.stop()
    assert grown_mb < GROWTH_BOUND_MB
    assert got == MESSAGES + 6 and digest.hexdigest() == expected.hexdigest()
