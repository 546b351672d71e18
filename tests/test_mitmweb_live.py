"""What mitmweb's flow list holds while a routed answer streams, and each attempt's
own flow: the real hooks and relay against a loopback provider, with mitmproxy's
own View (the flow list mitmweb and the console draw) and test helpers; the test
plays mitmproxy's part (tests/test_hooks.py, `play`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mitmproxy.addons.view import View
from mitmproxy.http import Response
from mitmproxy.test import taddons

from switchyard_core.addons import Router, RulesKeeper
from switchyard_core.addons.attempt_flows import DISPLAY_LIMIT

from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply, failing_reply
from tests.test_hooks import chat_flow
from tests.test_hooks_bounds import played

PAUSE_S = 60.0  # the backup's answer stops here: long past any check of the test


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    running = FakeProvider().start()
    yield running
    running.stop()


def rules(tmp_path: Path, provider: FakeProvider, *, retries: int = 1, extra: str = "",
          backup_extra: str = "") -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(f"""\
version: 1
defaults: {{backoff_ms: 20, max_backoff_ms: 20, pre_answer_keepalive_s: 0{extra}}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: {retries}}}
      - name: backup
        url: http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions
{backup_extra}""")
    return path


def the_flow(provider: FakeProvider, body: bytes | None = None) -> Any:
    flow = chat_flow(host="127.0.0.1", path="/primary/v1/chat/completions")
    flow.request.scheme, flow.request.port = "http", provider.ports[0]
    if body is not None:
        flow.request.content = body
    return flow


async def until(check: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):  # bounded
        while not check():
            await asyncio.sleep(0.01)


async def test_failed_attempts_and_who_answers_are_shown_while_the_answer_streams(
        tmp_path: Path, provider: FakeProvider) -> None:
    """Two failures on the primary, then the backup answers slowly: before its answer
    ends, the flow list holds both failed attempts (each at its own times), and the
    client's flow is at the backup's URL, marked and commented."""
    provider.script("primary", failing_reply("sse_503", "openai-chat"), failing_reply("sse_503", "openai-chat"))
    frames = wire.chat_stream(wire.answer_text("backup"))
    provider.script("backup", Reply.sse(*frames[:2], PAUSE_S, *frames[2:]))
    keeper, view = RulesKeeper(), View()
    router = Router(keeper)
    with taddons.context(keeper, router, view) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules(tmp_path, provider)))
        flow = the_flow(provider)
        view.add([flow])
        await router.route(flow)
        async with aiohttp.ClientSession() as session:
            async with session.post(flow.request.url, headers=dict(flow.request.headers),
                                    data=flow.request.content) as answer:
                flow.response = Response.make(answer.status, b"", [(k.encode(), v.encode())
                                                                   for k, v in answer.headers.items()])
                await router.responseheaders(flow)  # (waits for the real head: the commit)
                got = b""
                async with asyncio.timeout(10):
                    while b"".join(frames[:2]) not in got:
                        got += await answer.content.readany()
                await until(lambda: len(view) == 3)
                assert not answer.content.at_eof()  # the answer is still streaming
                client, *attempts = list(view)
                assert client is flow
                assert flow.request.url == f"http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions"
                assert flow.marked == ":arrows_counterclockwise:"
                assert flow.comment == "primary: 503 provider overloaded before output → backup answered"
                assert [a.comment for a in attempts] == [
                    "503 provider overloaded → retry; attempt 1 (chat: primary)",
                    "503 provider overloaded → next_upstream; attempt 2 (chat: primary)"]
                assert [a.marked for a in attempts] == [":red_circle:", ":red_circle:"]
                # each attempt at its own times: sent after the client's request came, the
                # second after the first ended (and its backoff), each ended long before the answer
                first, second = attempts
                assert flow.request.timestamp_start <= first.request.timestamp_start
                assert first.request.timestamp_start <= first.response.timestamp_start <= first.response.timestamp_end
                assert second.request.timestamp_start > first.response.timestamp_end
                assert second.response.timestamp_end - second.request.timestamp_start < PAUSE_S / 2
        router.error(flow)  # the client left (the test is done with it)
        assert len(view) == 3  # nothing shown twice
        router.done()


async def test_a_stalled_attempt_shows_the_head_and_frames_it_sent(tmp_path: Path, provider: FakeProvider) -> None:
    provider.script("primary", failing_reply("lifecycle_stall", "openai-chat"))
    path = rules(tmp_path, provider, retries=0, extra=", first_output_timeout_s: 0.3")
    body, (attempt,) = await played(path, the_flow(provider))
    assert body == b"".join(wire.chat_stream(wire.answer_text("backup")))
    assert attempt.response is not None and attempt.response.status_code == 200
    assert attempt.response.content == b"".join(wire.lifecycle_frames("openai-chat"))
    assert attempt.error is not None and attempt.error.msg.startswith("failed inside the 200 answer: ")
    assert "no output within 0.3s" in attempt.error.msg
    assert attempt.response.timestamp_end - attempt.request.timestamp_start == pytest.approx(0.3, abs=0.25)


SECRET = "sk-env-SECRET-9f8e7d"


async def test_an_attempt_flow_shows_the_request_it_was_sent_bounded_and_redacted(
        tmp_path: Path, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """The body the upstream got (its model rewritten), at most what a stream keeps,
    with the client's credentials and the upstream's `${VAR}` values redacted."""
    monkeypatch.setenv("SWY_LIVE_KEY", SECRET)
    provider.script("backup", failing_reply("sse_503", "openai-chat"))
    provider.script("primary", failing_reply("sse_503", "openai-chat"))
    padding = "x" * DISPLAY_LIMIT
    sent = json.dumps({"model": "gpt-4o", "stream": True, "messages": [
        {"role": "user", "content": f"keys: Bearer sk-client-abc and {SECRET}"}], "padding": padding}).encode()
    path = rules(tmp_path, provider, retries=0, backup_extra=(
        "        model: backup-model\n"
        '        auth: {header: Authorization, value: "Bearer ${SWY_LIVE_KEY}"}\n'))
    _, attempts = await played(path, the_flow(provider, sent))
    primary, backup = attempts
    got = provider.calls_to("backup")[0].body
    assert json.loads(got)["model"] == "backup-model"
    for attempt in (primary, backup):
        request = attempt.request
        assert request.method == "POST"
        body = got if attempt is backup else sent
        assert request.headers["content-length"] == str(len(body))
        assert request.headers["x-switchyard-truncated"] == f"first {DISPLAY_LIMIT} of {len(body)} bytes kept"
        shown = request.raw_content.decode()
        assert shown.startswith(body[:body.index(b"keys: ")].decode())  # its own model, each
        assert SECRET not in shown and "sk-client-abc" not in shown
        assert "keys: [redacted] and [redacted]" in shown
        assert len(shown) < DISPLAY_LIMIT
    assert backup.request.headers["authorization"] == "[redacted]"


def test_the_content_view_names_a_finish_and_usage_and_says_what_each_kind_is() -> None:
    """A Chat stream's `finish_reason` chunk commits as output does, and its usage chunk
    is held as lifecycle is: the view names them by what they are, and says what each
    kind it shows means."""
    from mitmproxy import contentviews
    from mitmproxy.test import tflow

    from switchyard_core.addons.sse_view import SwitchyardSseContentview

    flow = tflow.tflow(resp=True)
    flow.request.path = "/v1/chat/completions"
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = b"".join(wire.chat_stream("Hi there"))
    contentviews.add(SwitchyardSseContentview())
    with taddons.context():  # mitmproxy's content views read its options
        lines = contentviews.prettify_message(flow.response, flow, view_name="Switchyard SSE").text.splitlines()
    rows = [line.split(None, 2)[1:] for line in lines if line.startswith("#")]
    assert rows == [["lifecycle"], ["output", "▶ commit"], ["output"], ["finish", "finish_reason=stop"], ["usage"],
                    ["terminal"]]
    assert [line.split()[0] for line in lines[1:6]] == ["lifecycle", "output", "finish", "usage", "terminal"]
    assert lines[3] == "  finish     the answer's end reason: commits as output does"
    assert lines[4] == "  usage      token counts: held as lifecycle is until the first output"


def test_mitmwebs_comment_column_is_turned_on_unless_the_user_chose_the_columns() -> None:
    """The comments say what failed: the flow list shows them, unless the user set `web_columns`."""
    from mitmproxy.tools.web.webaddons import WebAddon

    from switchyard_core.addons import CommentColumn

    web = WebAddon()
    with taddons.context(web) as tctx:
        CommentColumn().running()
        assert tctx.options.web_columns == ["tls", "icon", "path", "method", "status", "size", "time", "comment"]
        CommentColumn().running()  # a reload adds nothing twice
        assert tctx.options.web_columns.count("comment") == 1
    with taddons.context(web) as tctx:
        tctx.configure(web, web_columns=["path", "status"])
        CommentColumn().running()
        assert tctx.options.web_columns == ["path", "status"]
    with taddons.context() as tctx:  # mitmdump: no flow list
        CommentColumn().running()
        assert "web_columns" not in tctx.options


def bytes_held(root: object) -> int:
    """The bytes objects reachable from `root` (each counted once), not through
    modules, classes or functions: what a flow kept in mitmweb's list holds."""
    import gc
    import types

    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, (type, types.ModuleType, types.FunctionType, types.MethodType,
                                                 types.BuiltinFunctionType, str)):
            continue
        seen.add(id(item))
        if isinstance(item, (bytes, bytearray)):
            total += len(item)
        else:
            stack.extend(gc.get_referents(item))
    return total


async def test_a_streamed_answer_is_held_once_by_its_finished_flow(tmp_path: Path, provider: FakeProvider) -> None:
    """The answer streamed through the display copy (mitmproxy's stream callback) is the
    flow's content once it ends, and the flow holds it once: mitmweb keeps every flow."""
    frames = wire.chat_stream(" ".join(f"word{n:04d}-" + "x" * 200 for n in range(400)))
    provider.script("primary", Reply.sse(*frames))
    flow = the_flow(provider)
    body, _ = await played(rules(tmp_path, provider), flow)
    assert body == flow.response.content == b"".join(frames)
    assert len(body) > 80_000
    assert bytes_held(flow) < len(body) * 1.2  # once, plus the request's and the heads' few bytes
