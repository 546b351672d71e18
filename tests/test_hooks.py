"""The mitmproxy-facing hooks, with mitmproxy's own test helpers (taddons, tflow)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from mitmproxy import ctx, exceptions
from mitmproxy.http import Headers, Response
from mitmproxy.test import taddons, tflow

from switchyard_core.addons import Router, RulesKeeper
from switchyard_core.relay import TOKEN_HEADER
from switchyard_core.rules import SHIPPED_RULES

from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply

RULES = """\
version: 1
routes:
  - name: chat
    match: {host: api.openai.com, path: /v1/chat/completions, model: "gpt-4o*"}
    upstreams:
      - {name: openai, url: original}
      - name: backup
        url: https://backup.example.com/v1/chat/completions
        auth: {header: Authorization, value: "Bearer backup-key-123"}
"""


def chat_flow(host: str = "api.openai.com", path: str = "/v1/chat/completions", model: str = "gpt-4o") -> tflow.HTTPFlow:
    flow = tflow.tflow()
    flow.request.scheme = "https"
    flow.request.host = host
    flow.request.port = 443
    flow.request.path = path
    flow.request.method = "POST"
    flow.request.headers = Headers(host=host, authorization="Bearer sk-client-abc", content_type="application/json")
    flow.request.content = json.dumps({"model": model, "stream": True, "messages": []}).encode()
    return flow


@contextmanager
def routing(rules_file: Path) -> Iterator[Router]:
    """A Router in a mitmproxy test context, with these rules loaded."""
    keeper = RulesKeeper()
    router = Router(keeper)
    with taddons.context(keeper, router) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        yield router


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


async def test_matching_flow_is_re_aimed_at_the_relay_with_a_single_use_token(rules_file: Path) -> None:
    with routing(rules_file) as router:
        flow = chat_flow()
        await router.route(flow)
        assert router.relay is not None and router.relay.port
        assert (flow.request.scheme, flow.request.host, flow.request.port) == ("http", "127.0.0.1", router.relay.port)
        # mitmproxy connects by the request's address, and the flow's `via` and transport
        assert (flow.server_conn.via, flow.server_conn.transport_protocol) == (None, "tcp")
        token = flow.request.headers[TOKEN_HEADER]
        assert len(token) >= 20
        assert flow.metadata["switchyard"]["route"] == "chat"
        # the relay shows mitmweb the truth once headers are back: the original URL, no token
        flow.response = Response.make(200, b"", {"content-type": "text/event-stream"})
        await router.responseheaders(flow)
        assert flow.request.url == "https://api.openai.com/v1/chat/completions"
        assert flow.request.headers["host"] == "api.openai.com"
        assert TOKEN_HEADER not in flow.request.headers
        assert flow.response.stream  # SSE answers stream through
        router.done()


@pytest.mark.parametrize(("authority", "http_version"), [("", "HTTP/1.1"), ("api.openai.com", "HTTP/2.0")],
                         ids=["http1", "http2-authority"])
async def test_the_answered_flow_shows_the_request_exactly_as_the_client_sent_it(rules_file: Path, authority: str,
                                                                                 http_version: str) -> None:
    """When the original destination answered, the flow is put back field for field
    (scheme, host, port, authority, headers, body, trailers): a replay sends what the client sent."""
    with routing(rules_file) as router:
        flow = chat_flow()
        flow.request.authority = authority
        flow.request.http_version = http_version
        flow.request.trailers = Headers(x_checksum="abc")
        before = flow.request.get_state()
        await router.route(flow)
        assert flow.request.get_state() != before  # re-aimed at the relay
        if http_version == "HTTP/1.1":
            # answered at once with a provisional head: mitmproxy writes the relay, and the
            # relay reads, the token only, not the client's headers and body a second time
            assert flow.request.headers.fields == ((b"content-length", b"0"), (TOKEN_HEADER.encode(), flow.request.headers[TOKEN_HEADER].encode()))
            assert (flow.request.raw_content, flow.request.trailers) == (b"", None)
        else:  # no provisional head: the flow keeps what it shows until its head is decided
            assert flow.request.headers["authorization"] == "Bearer sk-client-abc"
            assert flow.request.trailers is not None
        flow.response = Response.make(200, b"", {"content-type": "text/event-stream"})
        await router.responseheaders(flow)
        assert flow.request.get_state() == before
        router.response(flow)
        assert flow.request.get_state() == before
        router.done()


async def test_a_flow_bound_for_an_upstream_proxy_gets_a_direct_connection_to_the_relay(rules_file: Path) -> None:
    """In upstream-proxy mode the flow's server connection names the proxy: the
    relay is on loopback, and must not be asked for through that proxy."""
    with routing(rules_file) as router:
        flow = chat_flow()
        flow.server_conn.via = ("http", ("proxy.internal", 3128))
        await router.route(flow)
        assert router.relay is not None
        assert flow.server_conn.via is None
        assert flow.server_conn.address == ("127.0.0.1", router.relay.port)
        router.done()


@pytest.mark.parametrize(("http_version", "provisional"), [("HTTP/1.1", True), ("HTTP/2.0", False)])
async def test_only_http1_flows_get_a_provisional_head(rules_file: Path, http_version: str, provisional: bool) -> None:
    """While the Router's hook waits for the real head, mitmproxy queues the flow's
    events: an HTTP/2 stream reset would wait too, and the upstream would go on."""
    with routing(rules_file) as router:
        flow = chat_flow()
        flow.request.http_version = http_version
        await router.route(flow)
        assert router._live[flow.id].ticket.provisional_head is provisional
        router.done()


@pytest.mark.parametrize(
    "flow_args",
    [{"host": "example.com"}, {"path": "/v1/embeddings"}, {"model": "o3-mini"}],
    ids=["other-host", "other-path", "other-model"],
)
async def test_flows_that_match_no_route_are_not_touched(rules_file: Path, flow_args: dict[str, str]) -> None:
    with routing(rules_file) as router:
        flow = chat_flow(**flow_args)
        before = flow.request.get_state()
        server_conn = flow.server_conn
        await router.route(flow)
        assert flow.request.get_state() == before
        assert flow.server_conn is server_conn
        assert "switchyard" not in flow.metadata
        assert router.relay is None  # no relay was started for it
        router.done()


async def test_relay_refuses_requests_without_a_token_it_issued(rules_file: Path) -> None:
    import aiohttp

    with routing(rules_file) as router:
        flow = chat_flow()
        await router.route(flow)
        assert router.relay is not None
        port = router.relay.port
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {TOKEN_HEADER: "forged"}):
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers=headers, data=b"{}") as response:
                    assert response.status == 403
        router.done()


@pytest.mark.parametrize("sni", ["api.test", None], ids=["by-sni", "by-host-header"])
async def test_a_flow_that_knows_only_the_destinations_address_is_routed_and_asked_for_by_name(
        tmp_path: Path, sni: str | None) -> None:
    """A transparent, local, WireGuard or TUN listener gives its flows the destination's
    IP address: the route matches the name the client meant, and the upstream is asked
    for by that name (TLS and `Host`) at that address."""
    from mitmproxy.proxy.mode_specs import ProxyMode

    from tests.support.tls import make_tls_files, server_context

    ca, cert, key = make_tls_files(tmp_path, dns_names=("api.test",), ip_addresses=())  # no IP: only the name verifies
    provider = FakeProvider().start(ssl_context=server_context(cert, key))
    try:
        port = provider.ports[-1]
        rules = tmp_path / "rules.yaml"
        rules.write_text("version: 1\ndefaults: {pre_answer_keepalive_s: 0}\nroutes:\n  - name: chat\n"
                         "    match: {host: api.test, path: /primary/v1/chat/completions}\n"
                         "    upstreams:\n      - {name: primary, url: original, retries: 0}\n")
        with routing(rules) as router:
            ctx.options.update(ssl_verify_upstream_trusted_ca=str(ca))
            flow = chat_flow(host="127.0.0.1", path="/primary/v1/chat/completions")
            flow.request.scheme, flow.request.port = "https", port
            if sni is None:
                flow.request.headers["host"] = f"api.test:{port}"
            else:
                del flow.request.headers["host"]
            flow.client_conn.proxy_mode = ProxyMode.parse("local")
            flow.client_conn.sni = sni
            body = await play(router, flow)
            router.done()
    finally:
        provider.stop()
    assert body == b"".join(wire.chat_stream(wire.answer_text("primary")))
    assert provider.calls[0].headers["Host"] == f"api.test:{port}"
    assert flow.request.host == "127.0.0.1"  # the flow is shown as the listener had it


def test_rules_option_loads_the_file_and_reload_command_reapplies_it(rules_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    keeper = RulesKeeper()
    with taddons.context(keeper) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        assert keeper.rules is not None and [r.name for r in keeper.rules.routes] == ["chat"]
        rules_file.write_text(RULES.replace("name: chat", "name: chat-renamed"))
        with caplog.at_level(logging.INFO, logger="switchyard"):
            said = tctx.command(keeper.reload)
        assert [r.name for r in keeper.rules.routes] == ["chat-renamed"]
        assert "switchyard.rules_reloaded" in caplog.text
        assert said == f"rules {rules_file}: routes chat-renamed; faults none"


def test_a_reload_starts_with_no_outage_memory(rules_file: Path) -> None:
    """What requests learnt of upstreams' outages belongs to the rules they ran on: a
    reload (the same file or an edited one) starts with nothing remembered."""
    from switchyard_core.attempts.outages import FailureKind

    keeper = RulesKeeper()
    with taddons.context(keeper) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        assert keeper.rules is not None
        visit = keeper.outages.begin(keeper.rules.routes[0], 100.0)
        visit.failed(keeper.rules.routes[0].upstreams[0].name, FailureKind.UNREACHABLE, 100.0, detail="refused")
        assert keeper.outages.status(101.0)
        tctx.command(keeper.reload)
        assert keeper.outages.status(101.0) == []


def test_a_broken_edit_keeps_the_last_good_rules(rules_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keeper = RulesKeeper()
    with taddons.context(keeper) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        good = keeper.rules
        rules_file.write_text(RULES.replace("routes:", "bogus: true\nroutes:"))
        with caplog.at_level(logging.WARNING, logger="switchyard"):
            # the command fails, saying why: in mitmweb's command bar as much as in the log
            with pytest.raises(exceptions.CommandError, match=r"rules.yaml:2: bogus: not a known key here .*"
                                                              r"\(keeping the last good rules\)"):
                tctx.command(keeper.reload)
        assert keeper.rules is good
        assert f"{rules_file}:2: bogus: not a known key here" in caplog.text
        assert "last good rules" in caplog.text
        # pointing the option at a broken file is refused, and the option rolls back
        broken = tmp_path / "broken.yaml"
        broken.write_text("version: 1\nroutes: [\n")
        with pytest.raises(exceptions.OptionsError, match="broken.yaml:3: invalid YAML"):
            tctx.configure(keeper, switchyard_rules=str(broken))
        assert keeper.rules is good
        assert tctx.options.switchyard_rules == str(rules_file)


def test_a_local_rules_file_gone_for_a_moment_never_brings_back_the_shipped_rules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no `switchyard_rules` set, ./rules.yaml is used; while a checkout or an
    editor has it deleted, a reload keeps the user's rules and says the file is gone."""
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "rules.yaml"
    local.write_text(RULES)
    keeper = RulesKeeper()
    with taddons.context(keeper):
        keeper.configure({"switchyard_rules"})
        mine = keeper.rules
        assert mine is not None and mine.source.resolve() == local.resolve()
        local.unlink()
        with pytest.raises(exceptions.CommandError, match="rules.yaml: cannot read rules"):
            keeper.reload()
        assert keeper.rules is mine  # not the shipped file's routes
        local.write_text(RULES.replace("name: chat", "name: chat-again"))
        keeper.reload()
        assert [route.name for route in keeper.rules.routes] == ["chat-again"]


def test_rules_written_beside_the_shipped_ones_are_taken_on_reload(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    keeper = RulesKeeper()
    with taddons.context(keeper):
        keeper.configure({"switchyard_rules"})
        assert keeper.rules is not None and keeper.rules.source == SHIPPED_RULES
        (tmp_path / "rules.yaml").write_text(RULES)
        keeper.reload()
        assert [route.name for route in keeper.rules.routes] == ["chat"]


def test_status_command_lists_routes_upstreams_and_credentials(rules_file: Path) -> None:
    with routing(rules_file) as router:
        text = router.status()
        assert "route chat (openai-chat)" in text
        assert "upstream openai: original destination; client's credentials; retries=1" in text
        assert "upstream backup: https://backup.example.com/v1/chat/completions; own auth set; retries=1" in text
        assert "backup-key-123" not in text
        assert "counters: routed=0" in text
        assert "fault:" not in text


def test_faults_in_the_file_are_announced_at_load_and_listed_by_status(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A fault fails real requests for as long as it is in the file: it must not go unnoticed."""
    path = tmp_path / "rules.yaml"
    path.write_text(RULES + "faults:\n  - {route: chat, upstream: openai, kind: sse_error, status: 503, count: 2}\n"
                            "  - {route: chat, kind: stall, rate: 0.5}\n")
    with caplog.at_level(logging.INFO, logger="switchyard"), routing(path) as router:
        assert "switchyard.rules_loaded" in caplog.text and "faults=2" in caplog.text
        active = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert active == [
            "switchyard.fault_active route=chat upstream=openai kind=sse_error 503 after_frames=0 rate=1 fired=0/2",
            "switchyard.fault_active route=chat upstream=(any) kind=stall after_frames=0 rate=0.5 "
            "fired=0 (no count: until removed)",
        ]
        assert router.keeper.faults is not None
        router.keeper.faults.pick("chat", "openai")
        text = router.status()
        assert "fault: route=chat upstream=openai kind=sse_error 503 after_frames=0 rate=1 fired=1/2" in text


# --- the flow view: what mitmweb and the console show -------------------------------------


READ_SIZE = 4096  # the pieces `play` streams a body in


async def play(router: Router, flow: tflow.HTTPFlow, *, reload_after_routing: bool = False) -> bytes:
    """mitmproxy's part, played by the test: the hooks in order, the re-aimed request
    sent to the relay, its answer handed back.  Returns the body the client got.
    `reload_after_routing`: the script is reloaded (`done`) before the request reaches the relay."""
    import aiohttp

    await router.route(flow)
    if reload_after_routing:
        router.done()
    async with aiohttp.ClientSession() as session:
        async with session.post(flow.request.url, headers=dict(flow.request.headers), data=flow.request.content) as answer:
            body = await answer.read()
            flow.response = Response.make(answer.status, b"", [(k.encode(), v.encode()) for k, v in answer.headers.items()])
    await router.responseheaders(flow)
    stream = flow.response.stream
    if callable(stream):  # streamed as mitmproxy streams it: through the callback a read at a time, no content
        for start in range(0, len(body), READ_SIZE):
            stream(body[start:start + READ_SIZE])
    else:
        flow.response.content = body
    router.response(flow)
    return body


async def test_flow_view_shows_the_story_and_each_failed_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay runs for real against a loopback provider; the test plays mitmproxy's part."""
    from mitmproxy.addons.view import View

    provider = FakeProvider().start()
    try:
        rules = tmp_path / "rules.yaml"
        rules.write_text(f"""\
version: 1
defaults: {{backoff_ms: 1, pre_answer_keepalive_s: 0}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        url: http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions
        model: backup-model
        auth: {{header: Authorization, value: "Bearer backup-key-123"}}
        headers: {{Helicone-Auth: "Bearer ${{SWY_HOOK_GATEWAY_KEY}}", X-Team: dev}}
""")
        monkeypatch.setenv("SWY_HOOK_GATEWAY_KEY", "sk-gateway-SECRET-77")
        failure = [wire.CHAT_ROLE, wire.chat_error(503, "provider overloaded")]
        provider.script("primary", Reply.sse(*failure))
        keeper, router, view = RulesKeeper(), Router(RulesKeeper()), View()
        router.keeper = keeper
        with taddons.context(keeper, router, view) as tctx:
            tctx.configure(keeper, switchyard_rules=str(rules))
            flow = chat_flow(host="127.0.0.1", path="/primary/v1/chat/completions?key=sk-query-SECRET-55")
            flow.request.scheme, flow.request.port = "http", provider.ports[0]
            view.add([flow])
            body = await play(router, flow)

            assert body == b"".join(wire.chat_stream(wire.answer_text("backup")))
            assert flow.request.url == f"http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions"
            # the flow now pairs another origin's URL with what that origin was sent, secrets
            # redacted: never the client's key (a replay would send it there)
            assert flow.request.headers["authorization"] == "[redacted]"
            assert flow.request.headers["helicone-auth"] == "[redacted]"
            assert flow.request.headers["x-team"] == "dev"
            # and what a replay needs to send it: the backup's Host, the body it got (its model), its length
            assert flow.request.headers["host"] == f"127.0.0.1:{provider.ports[1]}"
            assert flow.request.raw_content == provider.calls_to("backup")[0].body
            assert json.loads(flow.request.raw_content)["model"] == "backup-model"
            assert flow.request.headers["content-length"] == str(len(flow.request.raw_content))
            assert provider.calls_to("backup")[0].headers["Helicone-Auth"] == "Bearer sk-gateway-SECRET-77"
            assert flow.comment == "primary: 503 provider overloaded before output → backup answered"
            assert flow.marked == ":arrows_counterclockwise:"
            story = flow.metadata["switchyard"]
            assert (story["route"], story["outcome"], story["answered_by"]) == ("chat", "committed", "backup")
            assert [(a["upstream"], a["outcome"], a["status"], a["phase"]) for a in story["attempts"]] == [
                ("primary", "next_upstream", 503, "staging"), ("backup", "committed", 200, "output")]

            flows = list(view)
            assert len(flows) == 2
            attempt = flows[1]
            assert attempt.metadata["switchyard"]["attempt_of"] == flow.id
            # the client's query key (sent to its own origin only) is shown nowhere
            assert attempt.request.url == (f"http://127.0.0.1:{provider.ports[0]}/primary/v1/chat/completions"
                                           "?key=[redacted]")
            shown = json.dumps([flow.metadata, attempt.metadata]) + flow.request.url + attempt.request.url
            assert "sk-query-SECRET" not in shown
            assert attempt.request.headers["authorization"] == "[redacted]"
            # the request as that upstream was sent it, its body too
            assert attempt.request.method == "POST"
            assert attempt.request.content == provider.calls_to("primary")[0].body
            assert attempt.response is not None and attempt.response.status_code == 200
            assert attempt.response.content == b"".join(failure)
            # the headers the upstream sent (a chunked stream: no Content-Length), and the
            # 200 is not shown as a success: the failure inside it is the flow's error
            assert "content-length" not in attempt.response.headers
            assert attempt.response.headers["content-type"].startswith("text/event-stream")
            assert attempt.error is not None
            assert attempt.error.msg == "failed inside the 200 answer: 503 provider overloaded"
            assert attempt.comment == "503 provider overloaded → next_upstream; attempt 1 (chat: primary)"
            assert attempt.marked == ":red_circle:"
            router.done()
    finally:
        provider.stop()


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    running = FakeProvider().start()
    yield running
    running.stop()


def one_route(tmp_path: Path, retries: int = 1) -> Path:
    """Rules with one route, `chat`, to the request's own destination (the provider)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\ndefaults: {backoff_ms: 1, pre_answer_keepalive_s: 0}\nroutes:\n  - name: chat\n"
                     "    match: {path: /primary/v1/chat/completions}\n"
                     f"    upstreams:\n      - {{name: primary, url: original, retries: {retries}}}\n")
    return rules


def provider_flow(provider: FakeProvider, path: str = "/primary/v1/chat/completions") -> tflow.HTTPFlow:
    flow = chat_flow(host="127.0.0.1", path=path)
    flow.request.scheme, flow.request.port = "http", provider.ports[0]
    return flow


async def test_a_failure_after_output_is_in_the_flows_comment_and_story(tmp_path: Path,
                                                                       provider: FakeProvider) -> None:
    """Forwarded, never replayed: the flow says what the upstream reported after its
    output, not only the log line."""
    started = [wire.CHAT_ROLE, wire.chat_chunk({"content": "Hel"})]
    provider.script("primary", Reply.sse(*started, wire.chat_error(503, "provider overloaded")))
    with routing(one_route(tmp_path)) as router:
        flow = provider_flow(provider)
        body = await play(router, flow)
        router.done()
    assert body.startswith(b"".join(started))
    assert [c.upstream for c in provider.calls] == ["primary"]
    assert flow.marked == ":warning:"
    assert flow.comment == "primary: 503 provider overloaded after output: forwarded, never replayed"
    story = flow.metadata["switchyard"]
    assert story["suppressed_failover"] is True
    assert [(a["outcome"], a["status"], a["code"], a["message"], a["event_type"]) for a in story["attempts"]] == [
        ("committed", 503, None, "provider overloaded", "chunk")]


async def test_an_answer_on_the_same_upstreams_retry_is_not_called_a_fallback(tmp_path: Path,
                                                                             provider: FakeProvider) -> None:
    provider.script("primary", Reply.sse(wire.CHAT_ROLE, wire.chat_error(503, "provider overloaded")))
    with routing(one_route(tmp_path)) as router:
        flow = provider_flow(provider)
        body = await play(router, flow)
        status = router.status()
        router.done()
    assert body == b"".join(wire.chat_stream(wire.answer_text("primary")))
    assert flow.comment == "primary: 503 provider overloaded before output → answered on retry"
    assert "failed_attempts=1, retries_answered=1, fallbacks=0" in status


async def test_the_relay_hop_asks_with_a_plain_path_and_method_and_the_flow_shows_the_clients(
        tmp_path: Path, provider: FakeProvider) -> None:
    with routing(one_route(tmp_path)) as router:
        flow = provider_flow(provider, "/primary/v1/chat/completions?user=Jos%C3%A9")
        flow.request.data.method = b"post"
        await router.route(flow)
        assert (flow.request.data.method, flow.request.path) == (b"POST", "/")  # what the relay parses
        await play(router, flow)
        router.done()
    assert flow.request.data.method == b"post"
    assert flow.request.url == f"http://127.0.0.1:{provider.ports[0]}/primary/v1/chat/completions?user=Jos%C3%A9"
    assert provider.calls[0].path == "/v1/chat/completions"


def test_content_view_lists_frames_with_their_classification() -> None:
    from mitmproxy import contentviews

    from switchyard_core.addons.sse_view import SwitchyardSseContentview

    data = b": keep-alive\n\n" + wire.CHAT_ROLE + wire.chat_chunk({"content": "Hi"}) + wire.chat_error(503, "late") + wire.CHAT_DONE
    flow = tflow.tflow(resp=True)
    flow.request.path = "/v1/chat/completions"
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = data
    view = SwitchyardSseContentview()
    contentviews.add(view)
    with taddons.context():  # mitmproxy's content views read its options
        result = contentviews.prettify_message(flow.response, flow)
    assert result.view_name == "Switchyard SSE"
    lines = result.text.splitlines()
    assert lines[0] == "switchyard: openai-chat stream, 5 frames, first output at frame 3"
    kinds = [line.split()[1:3] for line in lines if line.startswith("#")]
    assert kinds == [["keepalive"], ["lifecycle"], ["output", "▶"], ["failure", "retryable"], ["terminal"]]
    assert "status=503 message=late" in result.text


def test_content_view_leads_with_the_flows_story() -> None:
    """mitmweb 12 shows no metadata: the view of a routed stream says what happened."""
    from mitmproxy import contentviews

    from switchyard_core.addons.sse_view import SwitchyardSseContentview

    flow = tflow.tflow(resp=True)
    flow.request.path = "/v1/chat/completions"
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = b"".join(wire.chat_stream("Hi"))
    flow.metadata["switchyard"] = {
        "route": "openai-chat", "api": "openai-chat", "outcome": "committed", "answered_by": "backup",
        "suppressed_failover": False, "attempts": [
            {"attempt": 1, "upstream": "openai", "outcome": "next_upstream", "phase": "staging", "status": 503,
             "code": None, "message": "provider overloaded", "duration_s": 0.012},
            {"attempt": 2, "upstream": "backup", "outcome": "committed", "phase": "output", "status": 200,
             "code": None, "message": None, "duration_s": 0.3}]}
    contentviews.add(SwitchyardSseContentview())
    with taddons.context():  # mitmproxy's content views read its options
        lines = contentviews.prettify_message(flow.response, flow).text.splitlines()
    assert lines[:4] == [
        "switchyard: route openai-chat, committed, answered by backup",
        "  attempt 1 openai: next_upstream (staging in 0.012s): 503 provider overloaded",
        "  attempt 2 backup: committed (output in 0.3s): 200",
        "",
    ]
    assert lines[4].startswith("switchyard: openai-chat stream,")


async def test_an_intercepted_flow_is_routed_once_resumed_as_edited_and_a_killed_one_never(rules_file: Path) -> None:
    import asyncio

    from switchyard_core.addons.router import LastInLine

    class Updates:  # what mitmweb and the console are told, through the `update` hook
        def __init__(self) -> None:
            self.intercepted: set[str] = set()

        def update(self, flows: list) -> None:
            self.intercepted |= {flow.id for flow in flows if flow.intercepted}

    keeper = RulesKeeper()
    router = Router(keeper)
    updates = Updates()
    last = LastInLine(router)
    with taddons.context(keeper, router, updates) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        router.running()
        edited, killed = chat_flow(), chat_flow()
        for flow in (edited, killed):
            flow.intercept()  # as mitmweb's intercept does in its own `request` hook, before this one
        waiting = [asyncio.create_task(last.request(flow)) for flow in (edited, killed)]
        async with asyncio.timeout(5):  # mitmweb shows them held, with their Resume button
            while updates.intercepted != {edited.id, killed.id}:
                await asyncio.sleep(0.01)
        assert not any(task.done() for task in waiting)
        assert TOKEN_HEADER not in edited.request.headers  # shown with its real destination while held
        edited.request.content = edited.request.content.replace(b'"gpt-4o"', b'"gpt-4o-edited"')
        edited.resume()
        killed.kill()
        async with asyncio.timeout(5):
            await asyncio.gather(*waiting)
        assert edited.request.host == "127.0.0.1" and TOKEN_HEADER in edited.request.headers
        exchange = router._live[edited.id].ticket.exchange
        assert json.loads(exchange.request.body)["model"] == "gpt-4o-edited"
        assert killed.request.host == "api.openai.com" and TOKEN_HEADER not in killed.request.headers
        assert killed.id not in router._live
        router.done()


async def test_a_flow_held_across_a_script_reload_is_routed_by_the_new_router(rules_file: Path) -> None:
    import asyncio

    from switchyard_core.addons.router import LastInLine

    keeper = RulesKeeper()
    old, new = Router(keeper), Router(keeper)
    with taddons.context(keeper, old) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        old.running()
        flow = chat_flow()
        flow.intercept()
        waiting = asyncio.create_task(LastInLine(old).request(flow))
        await asyncio.sleep(0.05)
        tctx.master.addons.remove(old)  # mitmproxy reloads the script: the old Router goes (`done`),
        tctx.master.addons.add(new)  # a new one comes and runs
        new.running()
        flow.resume()
        async with asyncio.timeout(5):
            await waiting
        assert new.relay is not None and flow.request.port == new.relay.port
        assert old.relay is None  # no relay started for a Router that is gone
        new.done()


@pytest.mark.parametrize("story", [{"outcome": "committed", "attempts": "?"}, {"outcome": 1, "attempts": [None, 3]},
                                   {"outcome": "committed", "attempts": [{"duration_s": "x", "status": {}}]},
                                   {"outcome": "committed", "attempts": [{"duration_s": 10 ** 400}]},
                                   {"outcome": "committed", "api": "no-such-api"}])
def test_content_view_never_fails_on_odd_metadata(story: dict) -> None:
    """Metadata is anyone's to edit (other addons, flow files): a view that raised
    would leave mitmweb without a view of the body."""
    from mitmproxy import contentviews

    from switchyard_core.addons.sse_view import SwitchyardSseContentview

    flow = tflow.tflow(resp=True)
    flow.request.path = "/v1/chat/completions"
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = b"".join(wire.chat_stream("Hi"))
    flow.metadata["switchyard"] = story
    contentviews.add(SwitchyardSseContentview())
    with taddons.context():
        result = contentviews.prettify_message(flow.response, flow, view_name="Switchyard SSE")
    assert "switchyard: openai-chat stream," in result.text


async def test_a_flow_routed_just_before_a_reload_is_still_served_by_the_old_relay(tmp_path: Path) -> None:
    """Its token was issued, mitmproxy was on its way: the retiring relay waits for it."""

    provider = FakeProvider().start()
    try:
        rules = tmp_path / "rules.yaml"
        rules.write_text("version: 1\nroutes:\n  - name: chat\n    match: {path: /primary/v1/chat/completions}\n"
                         "    upstreams:\n      - {name: primary, url: original}\n")
        with routing(rules) as router:
            router.running()
            flow = chat_flow(host="127.0.0.1", path="/primary/v1/chat/completions")
            flow.request.scheme, flow.request.port = "http", provider.ports[0]
            body = await play(router, flow, reload_after_routing=True)
    finally:
        provider.stop()
    assert body == b"".join(wire.chat_stream(wire.answer_text("primary")))


async def test_a_reload_while_the_relay_starts_leaves_no_relay_behind(rules_file: Path) -> None:
    import asyncio

    keeper = RulesKeeper()
    old, new = Router(keeper), Router(keeper)
    with taddons.context(keeper, old) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules_file))
        flow = chat_flow()
        routing_task = asyncio.create_task(old.route(flow))  # the first flow starts the relay
        await asyncio.sleep(0)
        started = old.relay
        assert started is not None and started.port is None  # still starting
        tctx.master.addons.remove(old)  # the reload, meanwhile
        tctx.master.addons.add(new)
        new.running()
        async with asyncio.timeout(5):
            await routing_task
        assert started.stopped and started.port is None  # not left listening with nobody to stop it
        assert new.relay is not None and flow.request.port == new.relay.port  # the new Router routed it
        new.done()


async def test_without_mitmproxys_readers_answers_go_through_the_socket_and_one_line_says_so(
        rules_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    """mitmproxy's test context has no proxyserver addon: the direct line's check
    fails once, at `running`, and no flow is handed a reader to look for."""
    caplog.set_level(logging.INFO, logger="switchyard")
    with routing(rules_file) as router:
        router.running()
        lines = [r.getMessage() for r in caplog.records if "switchyard.mitmproxy_parts" in r.getMessage()]
        assert len(lines) == 1
        assert "direct_line=\"inactive: mitmproxy's proxyserver addon keeps no connections map\"" in lines[0]
        assert "streaming_note=active log_hook_filter=active" in lines[0]
        flow = chat_flow()
        await router.route(flow)
        assert router._live[flow.id].ticket.mitmproxy_streams is None
        router.done()


async def test_a_mitmproxy_whose_connection_handlers_moved_keeps_its_streaming_note_unheld(
        rules_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from mitmproxy.proxy import server

    from switchyard_core.addons import streaming_note

    caplog.set_level(logging.INFO, logger="switchyard")
    monkeypatch.setattr(server, "logger", logging.getLogger("mitmproxy.proxy.elsewhere"))
    with routing(rules_file) as router:
        router.running()
        assert router._notes not in logging.getLogger(streaming_note.LOGGER).filters
        line = next(r.getMessage() for r in caplog.records if "switchyard.mitmproxy_parts" in r.getMessage())
        assert "streaming_note=\"inactive: mitmproxy's connection handlers no longer log to mitmproxy.proxy.server\"" in line
        router.done()
