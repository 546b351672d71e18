"""What mitmweb shows of a failed attempt, read from a real mitmweb's own flow list
(`GET /flows`, the JSON its UI draws from)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from tests.support import wire
from tests.support.client_bed import bed_rules
from tests.support.fake_provider import FakeProvider, Reply, failing_reply
from tests.support.mitm import Mitmdump, free_port, start_mitmdump
from tests.support.ws_provider import WsProvider, answer_turn, failed_turn


def flows(web_url: str, what: str = "flows") -> Any:
    base, _, token = web_url.partition("/?token=")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"{base}/{what}", headers={"Authorization": f"Bearer {token}"})
    with opener.open(request, timeout=10) as answer:
        return json.loads(answer.read())


def test_a_failure_inside_a_200_stream_is_the_attempt_flows_error_and_its_headers_are_the_upstreams(
        tmp_path: Path) -> None:
    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(bed_rules(provider.ports[0], provider.ports[1]))
    web = start_mitmdump(rules, tmp_path / "mitmweb.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                         extra_args=["--set", f"web_port={free_port()}", "--set", "web_open_browser=false"], web=True)
    try:
        provider.script("primary", failing_reply("lifecycle_error", "openai-chat"))
        body = json.dumps({"model": "gpt-4o", "stream": True, "messages": []})
        out = subprocess.run(["curl", "-sS", "-N", "--max-time", "20", "-H", "Content-Type: application/json",
                              "-d", body, f"{web.reverse_url}/primary/v1/chat/completions"],
                             capture_output=True, timeout=30).stdout
        assert out == b"".join(wire.chat_stream(wire.answer_text("primary")))
        deadline = time.monotonic() + 10
        while len(shown := flows(web.web_url)) < 2 and time.monotonic() < deadline:  # bounded
            time.sleep(0.05)
    finally:
        web.stop()
        provider.stop()
    attempt = next(f for f in shown if f.get("marked") == "\N{LARGE RED CIRCLE}")  # :red_circle:, as mitmweb has it
    client = next(f for f in shown if f is not attempt)
    assert attempt["response"]["status_code"] == 200  # what the upstream sent
    assert attempt["error"]["msg"] == "failed inside the 200 answer: 503 provider overloaded"
    names = [name.lower() for name, _ in attempt["response"]["headers"]]
    assert "content-length" not in names and "content-type" in names  # a chunked stream claims no length
    assert client["response"]["status_code"] == 200 and client.get("error") is None


def flow_content(web_url: str, flow_id: str, message: str) -> bytes:
    base, _, token = web_url.partition("/?token=")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"{base}/flows/{flow_id}/{message}/content.data",
                                     headers={"Authorization": f"Bearer {token}"})
    with opener.open(request, timeout=10) as answer:
        return answer.read()


def url_of(flow: dict) -> str:
    request = flow["request"]
    return f"{request['scheme']}://{request['host']}:{request['port']}{request['path']}"


def start_mitmweb(rules: Path, log: Path, reverse_target: str | None = None) -> Mitmdump:
    return start_mitmdump(rules, log, reverse_target=reverse_target, web=True,
                          extra_args=["--set", f"web_port={free_port()}", "--set", "web_open_browser=false"])


def test_while_the_backup_answers_mitmweb_lists_each_failed_attempt_and_the_client_flow_at_the_backup(
        tmp_path: Path) -> None:
    """Two failures on the primary, then the backup's answer, which pauses: before it
    ends, mitmweb's flow list holds both failed attempts, at their own times, and the
    client's flow at the backup's URL, marked and saying why."""
    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(bed_rules(provider.ports[0], provider.ports[1]))
    web = start_mitmweb(rules, tmp_path / "mitmweb.log", f"http://127.0.0.1:{provider.ports[0]}")
    frames = wire.chat_stream(wire.answer_text("backup"))
    provider.script("primary", *[failing_reply("sse_503", "openai-chat")] * 2)
    provider.script("backup", Reply.sse(*frames[:2], 60.0, *frames[2:]))
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": []})
    client = subprocess.Popen(["curl", "-sS", "-N", "--max-time", "60", "-H", "Content-Type: application/json",
                               "-d", body, f"{web.reverse_url}/primary/v1/chat/completions"], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # bounded
            shown = flows(web.web_url)
            if len(shown) == 3 and shown[0].get("marked"):
                break
            time.sleep(0.05)
        streaming = client.poll() is None
        columns = flows(web.web_url, "options")["web_columns"]["value"]
    finally:
        client.kill()
        client.wait()
        web.stop()
        provider.stop()
    assert streaming  # all of it seen while the answer was still coming
    assert columns[-1] == "comment"  # the flow list says why, at a glance
    answering, *attempts = shown
    assert url_of(answering) == f"http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions"
    assert answering["marked"] == "\N{ANTICLOCKWISE DOWNWARDS AND UPWARDS OPEN CIRCLE ARROWS}"  # :arrows_counterclockwise:
    assert answering["comment"] == "primary: 503 provider overloaded before output → backup answered"
    assert [(a["marked"], a["comment"]) for a in attempts] == [
        ("\N{LARGE RED CIRCLE}", "503 provider overloaded → retry; attempt 1 (reverse-chat: primary)"),
        ("\N{LARGE RED CIRCLE}", "503 provider overloaded → next_upstream; attempt 2 (reverse-chat: primary)")]
    first, second = (a["request"] | {"end": a["response"]["timestamp_end"]} for a in attempts)
    assert answering["request"]["timestamp_start"] <= first["timestamp_start"] <= first["end"] < second["timestamp_start"]
    assert second["end"] - first["timestamp_start"] < 10  # their own ends, not the answer's (still going)


async def test_a_websocket_turn_posted_over_http_shows_that_post_as_its_attempt(plain: WsProvider,
                                                                               backup: WsProvider,
                                                                               tmp_path: Path) -> None:
    """The primary refuses the upgrade, so the turn is POSTed to it over HTTP SSE, where
    it fails; the backup answers over its WebSocket.  While the connection is still
    open, mitmweb lists the failed attempt as the request that was sent: the POST, to
    the primary's HTTP URL, with the turn as its body."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: live-ws\n    match: {path: /livews/v1/responses}\n"
                     "    upstreams:\n      - {name: primary, url: original, retries: 0}\n"
                     f"      - {{name: backup, url: \"{backup.http_url}\"}}\n")
    web = start_mitmweb(rules, tmp_path / "mitmweb.log")
    plain.script(failed_turn("resp_f1"))
    backup.script(answer_turn("resp_b1"))
    turn = json.dumps({"type": "response.create", "model": "gpt-4o", "input": "hello"})
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(plain.proxied_url_under("livews"), proxy=web.proxy_url) as ws:
                await ws.send_str(turn)
                while json.loads((await ws.receive(timeout=10)).data).get("type") != "response.completed":
                    pass
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # bounded
                    shown = await asyncio.to_thread(flows, web.web_url)
                    attempts = [f for f in shown if "; attempt " in f.get("comment", "")]
                    if attempts:
                        break
                    await asyncio.sleep(0.05)
                (attempt,) = attempts  # while the connection is open
                sent = await asyncio.to_thread(flow_content, web.web_url, attempt["id"], "request")
    finally:
        web.stop()
    assert plain.posts == [sent]
    assert json.loads(sent) == {"model": "gpt-4o", "input": "hello", "stream": True}
    assert attempt["request"]["method"] == "POST"
    assert url_of(attempt) == plain.proxied_url_under("livews")
    headers = {name.lower(): value for name, value in attempt["request"]["headers"]}
    assert headers["content-length"] == str(len(sent)) and headers["content-type"] == "application/json"
    assert attempt["comment"].endswith("; attempt 1 (live-ws: primary)")


def web_command(web_url: str, name: str) -> str:
    base, _, token = web_url.partition("/?token=")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    xsrf = "0123456789abcdef0123456789abcdef"  # mitmweb wants its XSRF cookie echoed on a POST
    request = urllib.request.Request(f"{base}/commands/{name}", method="POST", data=b'{"arguments": []}',
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                              "X-XSRFToken": xsrf, "Cookie": f"_mitmproxy_xsrf={xsrf}"})
    with opener.open(request, timeout=10) as answer:
        return json.loads(answer.read())["value"]


def stream_through_mitmweb(tmp_path: Path, frames: list[bytes], options: list[str]) -> tuple[bytes, bytes, str]:
    """One paced streamed answer through mitmweb in reverse mode, to curl over HTTP/1.1:
    what curl got, the flow's response body as mitmweb has it, and `switchyard.status`."""
    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(bed_rules(provider.ports[0], provider.ports[1]))
    web = start_mitmdump(rules, tmp_path / "mitmweb.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                         web=True, extra_args=["--set", f"web_port={free_port()}", "--set", "web_open_browser=false",
                                               *options])
    provider.script("primary", Reply.sse(frames[0], *[piece for frame in frames[1:] for piece in (0.002, frame)]))
    try:
        body = json.dumps({"model": "gpt-4o", "stream": True, "messages": []})
        out = subprocess.run(["curl", "-sS", "-N", "--http1.1", "--max-time", "20", "-H",
                              "Content-Type: application/json", "-d", body,
                              f"{web.reverse_url}/primary/v1/chat/completions"], capture_output=True, timeout=30).stdout
        deadline = time.monotonic() + 10
        while not (shown := flows(web.web_url)) and time.monotonic() < deadline:  # bounded
            time.sleep(0.05)
        return out, flow_content(web.web_url, shown[0]["id"], "response"), web_command(web.web_url, "switchyard.status")
    finally:
        web.stop()
        provider.stop()


def test_an_answer_that_skips_mitmproxy_on_its_way_to_the_client_is_still_shown_whole(tmp_path: Path) -> None:
    """A plain HTTP/1.1 client's streamed answer goes from the relay straight to the
    client once mitmproxy has sent the head (relay/direct_line.py): the client gets the
    upstream's bytes, paced as they came, and mitmweb shows the flow's whole body."""
    frames = wire.chat_stream("".join(f"word{i} " for i in range(40)))
    out, content, status = stream_through_mitmweb(tmp_path, frames, [])
    assert out == b"".join(frames)
    assert content == out
    assert "answers=1 (in-process=1, straight to the client=1)" in status


def test_with_store_streamed_bodies_mitmproxy_passes_on_and_keeps_every_chunk(tmp_path: Path) -> None:
    """mitmproxy's `store_streamed_bodies` keeps every chunk it passes on as the flow's
    body, past the display copy's bound too: then no chunk may skip it."""
    frames = wire.chat_stream("".join(f"word{i} " for i in range(40)))
    frames[1:1] = [wire.chat_chunk({"content": "x" * 100_000})] * 12  # past the 1 MiB a display copy keeps
    out, content, status = stream_through_mitmweb(tmp_path, frames, ["--set", "store_streamed_bodies=true"])
    assert out == b"".join(frames) and len(out) > 1 << 20
    assert content == out
    assert "answers=1 (in-process=1, straight to the client=0)" in status
