"""What mitmweb keeps and shows of hostile or secret-carrying exchanges, through the
real hooks and relay (mitmproxy.test's taddons, a real View, a loopback provider)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy.addons.view import View
from mitmproxy.test import taddons

from switchyard_core.addons import Router, RulesKeeper
from switchyard_core.redaction import looks_like_credential
from switchyard_core.relay import TOKEN_HEADER

from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.test_hooks import chat_flow, play


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    running = FakeProvider().start()
    yield running
    running.stop()


def rules(tmp_path: Path, provider: FakeProvider, backup_extra: str = "") -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(f"""\
version: 1
defaults: {{backoff_ms: 1, pre_answer_keepalive_s: 0}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        url: http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions
{backup_extra}""")
    return path


def the_flow(provider: FakeProvider, query: str = "") -> Any:
    flow = chat_flow(host="127.0.0.1", path="/primary/v1/chat/completions" + query)
    flow.request.scheme, flow.request.port = "http", provider.ports[0]
    return flow


BACKUP_KEY = "sk-bounds-KEY-0a1b2c3d"
BACKUP_WITH_ITS_OWN_KEY = ('        auth: {header: Authorization, value: "Bearer ${SWY_BOUNDS_KEY}"}\n'
                           "        retries: 0\n")


async def played(path: Path, flow: Any) -> tuple[bytes, list[Any]]:
    """`flow` through the real hooks and relay on the rules at `path`: the body the
    client got, and the attempt flows mitmweb shows beside it."""
    keeper, view = RulesKeeper(), View()
    router = Router(keeper)
    with taddons.context(keeper, router, view) as tctx:
        tctx.configure(keeper, switchyard_rules=str(path))
        view.add([flow])
        body = await play(router, flow)
        router.done()
    return body, [shown for shown in view if shown is not flow]


async def test_an_attempt_flow_keeps_at_most_a_mebibyte_of_what_the_failed_attempt_held(
        tmp_path: Path, provider: FakeProvider) -> None:
    held = [wire.CHAT_ROLE] * 20_000  # about 4 MB of lifecycle frames, staged, then a failure
    provider.script("primary", Reply.sse(*held, wire.chat_error(503, "provider overloaded")))
    body, (attempt,) = await played(rules(tmp_path, provider), the_flow(provider))
    assert body == b"".join(wire.chat_stream(wire.answer_text("backup")))
    size = len(b"".join(held)) + len(wire.chat_error(503, "provider overloaded"))
    assert attempt.response is not None
    assert attempt.response.content == b"".join(held)[:1024 * 1024]
    assert attempt.response.headers["x-switchyard-truncated"] == f"first 1048576 of {size} bytes kept"
    assert attempt.comment.endswith(f"; answer cut to its first 1048576 of {size} bytes")


async def test_credentials_an_upstream_names_reach_it_and_are_shown_redacted(
        tmp_path: Path, provider: FakeProvider) -> None:
    provider.script("primary", Reply.sse(wire.chat_error(503, "provider overloaded")))
    path = rules(tmp_path, provider, "        forward_headers: [X-Auth-Token]\n        forward_query: [subscription-key]\n")
    flow = the_flow(provider, "?subscription-key=q-SECRET-1&access-token=q-SECRET-2&alt=sse")
    flow.request.headers["X-Auth-Token"] = "h-SECRET-3"
    flow.request.headers["Ocp-Apim-Subscription-Key"] = "h-SECRET-4"
    _, (attempt,) = await played(path, flow)  # the primary's attempt: its own origin got everything
    backup = provider.calls_to("backup")[0]
    assert backup.headers["X-Auth-Token"] == "h-SECRET-3"
    assert "Ocp-Apim-Subscription-Key" not in backup.headers and "Authorization" not in backup.headers
    # what the flow shows beside the backup's URL: what it was sent, credentials redacted
    assert flow.request.url == (f"http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions"
                                "?subscription-key=[redacted]&alt=sse")
    assert flow.request.headers["X-Auth-Token"] == "[redacted]"
    assert "Ocp-Apim-Subscription-Key" not in flow.request.headers
    # none of what the primary got is shown
    assert attempt.request.url.endswith("?subscription-key=[redacted]&access-token=[redacted]&alt=sse")
    assert attempt.request.headers["X-Auth-Token"] == "[redacted]"
    assert attempt.request.headers["Ocp-Apim-Subscription-Key"] == "[redacted]"


async def test_a_flow_that_is_not_live_is_never_routed(tmp_path: Path, provider: FakeProvider) -> None:
    keeper = RulesKeeper()
    router = Router(keeper)
    with taddons.context(keeper, router) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules(tmp_path, provider)))
        flow = the_flow(provider)
        flow.live = False  # read from a file, or about to be replayed from one
        await router.route(flow)
        assert flow.request.url == provider.url("primary", "/v1/chat/completions")
        assert TOKEN_HEADER not in flow.request.headers
        assert router.counters["routed"] == 0
        router.done()


@pytest.mark.parametrize("name", [
    "Authorization", "Ocp-Apim-Subscription-Key", "X-Amz-Security-Token", "X-Auth-Token", "subscription-key",
    "access-token", "x-api-key", "x-goog-api-key", "key", "sig", "X-Amz-Signature", "api_key", "apikey", "Cookie",
    "client_secret", "password", "sessionid", "X-Vendor-Api-Key", "Helicone-Auth", "OpenAI-Organization",
])
def test_names_that_look_like_credentials(name: str) -> None:
    assert looks_like_credential(name)


@pytest.mark.parametrize("name", [
    "Content-Type", "Accept", "Accept-Encoding", "User-Agent", "anthropic-version", "anthropic-beta", "OpenAI-Beta",
    "x-stainless-arch", "X-Team", "keep-alive", "x-request-id", "alt", "api-version", "traceparent", "design",
])
def test_names_that_do_not(name: str) -> None:
    assert not looks_like_credential(name)


async def test_a_backups_own_key_echoed_back_is_redacted_in_its_attempt_flow(
        tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWY_BOUNDS_KEY", BACKUP_KEY)
    provider.script("primary", Reply.sse(wire.chat_error(503, "provider overloaded")))
    provider.script("backup", Reply.json(429, {"error": {"message": f"Rate limit for key {BACKUP_KEY}",
                                                         "type": "rate_limit_error"}}))
    body, shown = await played(rules(tmp_path, provider, BACKUP_WITH_ITS_OWN_KEY), the_flow(provider))
    assert b"sk-bounds-KEY" not in body and b"Rate limit for key [redacted]" in body
    assert [f.metadata["switchyard"]["upstream"] for f in shown] == ["primary", "backup"]
    assert b"Rate limit for key [redacted]" in shown[1].response.content
    assert all(b"sk-bounds-KEY" not in (f.response.content if f.response else b"") for f in shown)
    assert shown[1].metadata["switchyard"]["message"] == "Rate limit for key [redacted]"


async def test_a_backups_own_key_split_across_two_reads_of_what_it_sends_is_still_redacted(
        tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last upstream's failure is forwarded as sent, and the rest of its stream read
    by read: there its key arrives in two writes with a pause between (two reads for the
    relay); a tail that only looks like the key's start ("sk-b…", then something else)
    passes whole."""
    key = BACKUP_KEY
    monkeypatch.setenv("SWY_BOUNDS_KEY", key)
    provider.script("primary", Reply.sse(wire.chat_error(503, "provider overloaded")))
    failure = wire.chat_error(503, "provider overloaded")
    echo = wire.data({"error": {"message": f"key {key} is over quota; sk-bounds-not-it"}})
    cut = echo.index(b"sk-bounds-KEY") + 6
    near = echo.index(b"sk-bounds-not-it") + 9
    provider.script("backup", Reply.sse(failure, 0.2, echo[:cut], 0.2, echo[cut:near], 0.2, echo[near:], wire.CHAT_DONE))
    body, _ = await played(rules(tmp_path, provider, BACKUP_WITH_ITS_OWN_KEY), the_flow(provider))
    assert body == failure + echo.replace(key.encode(), b"[redacted]") + wire.CHAT_DONE


@pytest.mark.parametrize("key", ["sk-clé-KEY-0a1b2c3d", 'sk-"quoted"/KEY\\0a1b'])
async def test_a_backups_own_key_echoed_json_escaped_is_redacted(
        tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    """A key with characters JSON escapes (non-ASCII, a quote, a backslash) is echoed as
    the upstream's JSON encoder writes it (`\\u00e9`, `\\"`, PHP's `\\/`): still `[redacted]`."""
    monkeypatch.setenv("SWY_BOUNDS_KEY", key)
    provider.script("primary", Reply.sse(wire.chat_error(503, "provider overloaded")))
    escaped = json.dumps(key)[1:-1]
    raw = ('{"error": {"message": "Rate limit for key %s; again: %s", "type": "rate_limit_error"}}'
           % (escaped, escaped.replace("/", "\\/"))).encode()
    provider.script("backup", Reply.json(429, raw))
    body, shown = await played(rules(tmp_path, provider, BACKUP_WITH_ITS_OWN_KEY), the_flow(provider))
    assert json.loads(body)["error"]["message"] == "Rate limit for key [redacted]; again: [redacted]"
    assert b"KEY" not in shown[1].response.content
