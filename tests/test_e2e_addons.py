"""Switchyard among mitmproxy's other addons: they see the request as the client
sent it, and what they change is what the upstream gets.

A script's hooks run where mitmproxy's script loader sits, before map-remote,
modify-body, server replay and the interactive intercept; Switchyard routes from
the end of the chain instead (`LastInLine`).  Each test runs its own mitmdump
(or mitmweb) with the addon option in question.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mitmproxy import io

from tests.conftest import CurlResult, Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import Mitmdump, free_port, start_mitmdump

RULES = """\
version: 1
defaults: {{retries: 0, backoff_ms: 1, pre_answer_keepalive_s: 0, headers_timeout_s: 5}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original}}
      - name: backup
        url: http://127.0.0.1:{p1}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer sk-backup-xyz"}}
"""


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider().start()
    yield fake
    fake.stop()


def body() -> bytes:
    return json.dumps({"model": "gpt-4o", "stream": True,
                       "messages": [{"role": "user", "content": "say hello MARK-A"}]}).encode()


def ask_primary(mitm: Mitmdump, provider: FakeProvider) -> CurlResult:
    """The routed request, with curl (conftest's `Env.curl`) through this test's own mitmdump."""
    return Env(provider, mitm, Path(mitm.log_path).parent).curl(primary_url(provider), body())


def start(tmp_path: Path, provider: FakeProvider, args: list[str], name: str = "mitm", web: bool = False) -> Mitmdump:
    rules = tmp_path / f"{name}-rules.yaml"
    rules.write_text(RULES.format(p1=provider.ports[1]))
    return start_mitmdump(rules, tmp_path / f"{name}.log", extra_args=args, web=web)


def primary_url(provider: FakeProvider) -> str:
    return provider.url("primary", "/v1/chat/completions")


def test_modify_body_applies_to_a_routed_request(tmp_path: Path, provider: FakeProvider) -> None:
    mitm = start(tmp_path, provider, ["--modify-body", "/~q/MARK-A/MARK-B"])
    try:
        result = ask_primary(mitm, provider)
    finally:
        mitm.stop()
    assert result.status == 200
    assert [c.upstream for c in provider.calls] == ["primary"]
    assert b"MARK-B" in provider.calls[0].body and b"MARK-A" not in provider.calls[0].body


def test_map_remote_decides_where_a_request_goes_before_routing(tmp_path: Path, provider: FakeProvider) -> None:
    """Mapped away from the route's path, the request is no longer routed at all."""
    port = provider.ports[0]
    mitm = start(tmp_path, provider, ["--map-remote", f"|127.0.0.1:{port}/primary/|127.0.0.1:{port}/mapped/"])
    try:
        result = ask_primary(mitm, provider)
    finally:
        mitm.stop()
    assert result.status == 200
    assert [(c.upstream, c.path) for c in provider.calls] == [("mapped", "/v1/chat/completions")]
    assert "x-switchyard-upstream" not in result.headers


def test_server_replay_answers_a_routed_request_without_calling_the_provider(tmp_path: Path, provider: FakeProvider) -> None:
    recorded = tmp_path / "recorded.flows"
    mitm = start(tmp_path, provider, ["-w", str(recorded)], name="record")
    try:
        first = ask_primary(mitm, provider)
    finally:
        mitm.stop()
    with recorded.open("rb") as file:
        flows = list(io.FlowReader(file).stream())
    assert [flow.request.url for flow in flows] == [primary_url(provider)]  # recorded as the client sent it
    provider.reset()
    mitm = start(tmp_path, provider, ["-S", str(recorded)], name="replay")
    try:
        replayed = ask_primary(mitm, provider)
    finally:
        mitm.stop()
    assert not provider.calls
    assert replayed.status == 200 and replayed.body == first.body


def test_an_intercepted_request_is_routed_as_the_user_edited_it(tmp_path: Path, provider: FakeProvider) -> None:
    """mitmweb shows the intercepted flow with its real destination (not the relay),
    and the body the user edits before resuming is what the upstream gets."""
    mitm = start(tmp_path, provider, ["--set", "intercept=~u /primary/", "--set", "web_open_browser=false",
                                      "--set", f"web_port={free_port()}"], web=True)
    try:
        base, _, token = mitm.web_url.partition("?")
        base = base.rstrip("/")
        xsrf = "0123456789abcdef0123456789abcdef"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def call(method: str, path: str, data: object = None) -> bytes:
            request = urllib.request.Request(
                f"{base}{path}?{token}", method=method, data=None if data is None else json.dumps(data).encode(),
                headers={"X-XSRFToken": xsrf, "Cookie": f"_mitmproxy_xsrf={xsrf}", "Content-Type": "application/json"})
            with opener.open(request, timeout=10) as answer:
                return answer.read()

        results: list[CurlResult] = []
        client = threading.Thread(target=lambda: results.append(ask_primary(mitm, provider)))
        client.start()
        intercepted = None
        for _ in range(100):  # until mitmweb holds the flow (bounded)
            intercepted = next((f for f in json.loads(call("GET", "/flows")) if f.get("intercepted")), None)
            if intercepted is not None:
                break
            time.sleep(0.1)
        assert intercepted is not None, "the flow was not intercepted"
        shown = intercepted["request"]
        edited = body().replace(b"MARK-A", b"EDITED-BY-USER").decode()
        call("PUT", f"/flows/{intercepted['id']}", {"request": {"content": edited}})
        call("POST", f"/flows/{intercepted['id']}/resume", {})
        client.join(30)
    finally:
        mitm.stop()
    assert (shown["host"], shown["port"], shown["path"]) == ("127.0.0.1", provider.ports[0], "/primary/v1/chat/completions")
    assert "x-switchyard-token" not in {name.lower() for name, _ in shown["headers"]}
    assert results and results[0].status == 200
    assert results[0].body == b"".join(wire.chat_stream(wire.answer_text("primary")))
    assert [c.upstream for c in provider.calls] == ["primary"]
    assert b"EDITED-BY-USER" in provider.calls[0].body


WRAPPING_ADDON = """\
class Shout:
    def responseheaders(self, flow):
        inner = flow.response.stream
        if callable(inner):
            flow.response.stream = lambda data: inner(data).replace(b"word", b"WORD")


addons = [Shout()]
"""


def test_a_later_addon_that_wraps_the_streamed_body_sees_every_chunk(tmp_path: Path, provider: FakeProvider) -> None:
    """Switchyard sends a plain HTTP/1.1 client's body past mitmproxy only while its own
    display copy is the flow's stream callback (relay/direct_line.py): an addon after it
    that wraps that callback transforms every chunk of the answer, the last ones too."""
    script = tmp_path / "shout.py"
    script.write_text(WRAPPING_ADDON)
    frames = wire.chat_stream("".join(f"word{i} " for i in range(30)))
    provider.script("primary", Reply.sse(frames[0], *[piece for frame in frames[1:] for piece in (0.005, frame)]))
    mitm = start(tmp_path, provider, ["-s", str(script)])
    try:
        result = ask_primary(mitm, provider)
    finally:
        mitm.stop()
    assert result.status == 200
    assert result.body == b"".join(frames).replace(b"word", b"WORD")
    assert b"word" not in result.body and result.body.count(b"WORD") == 30
