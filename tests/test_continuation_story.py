"""What mitmweb shows of a continued answer: the flow's story, its comment and
mark, each continuation as an attempt flow, and the counters of `switchyard.status`.
The relay runs for real against a loopback provider; the test plays mitmproxy's part."""

from __future__ import annotations

import json
from pathlib import Path

from mitmproxy.addons.view import View
from mitmproxy.test import taddons

from switchyard_core.addons import Router, RulesKeeper
from switchyard_core.frame_report import story_lines
from tests.support import wire
from tests.support.fake_provider import RESET, FakeProvider, Reply
from tests.test_hooks import chat_flow, play, provider  # noqa: F401 -- the fixture

TEXT = "Hello from primary, all good."


async def test_a_continued_answer_is_in_the_story_the_attempt_flows_and_the_status(
        tmp_path: Path, provider: FakeProvider) -> None:  # noqa: F811 -- the fixture
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""\
version: 1
defaults: {{backoff_ms: 1, pre_answer_keepalive_s: 0, continue_after_cut: [prefill, regenerate]}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions", prefill: true}}
""")
    frames = wire.chat_stream(TEXT)
    provider.script("primary", Reply.sse(*frames[:3], RESET), Reply.sse(*frames))
    provider.script("backup", Reply.json(400, {"error": {"message": "prefill is not supported",
                                                         "type": "invalid_request_error"}}))
    keeper, view = RulesKeeper(), View()
    router = Router(keeper)
    with taddons.context(keeper, router, view) as tctx:
        tctx.configure(keeper, switchyard_rules=str(rules))
        flow = chat_flow(host="127.0.0.1", path="/primary/v1/chat/completions")
        flow.request.scheme, flow.request.port = "http", provider.ports[0]
        view.add([flow])
        body = await play(router, flow)
        status = router.status()
        router.done()

    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in body.decode().split("\n\n") if line.startswith("data: {") and '"choices":[{' in line)
    assert text == TEXT
    assert [c.upstream for c in provider.calls] == ["primary", "backup", "primary"]
    story = flow.metadata["switchyard"]
    assert story["outcome"] == "continued" and story["answered_by"] == "primary"
    assert [(a["upstream"], a["outcome"], a["continuation"], a["status"]) for a in story["attempts"]] == [
        ("primary", "committed", None, 200), ("backup", "continuation_failed", "prefill", 400),
        ("primary", "continued", "regenerate", 200)]
    assert flow.comment == "primary: upstream connection broke after output → primary continued it (regenerate)"
    assert flow.marked == ":arrows_counterclockwise:"
    told = story_lines(story)  # what the Switchyard SSE content view leads with
    assert told[0] == "switchyard: route chat, continued, answered by primary"
    assert told[2].startswith("  attempt 2 backup: continuation_failed (prefill after the cut) (headers")
    assert told[3].startswith("  attempt 3 primary: continued (regenerate after the cut) (output")
    attempts = list(view)[1:]
    assert [a.comment.split(" → ")[1].split(";")[0] for a in attempts] == ["continuation_failed", "continued"]
    assert attempts[0].comment.startswith("prefill continuation: 400")
    assert "; attempt 2 (chat: backup)" in attempts[0].comment
    assert attempts[0].response is not None and attempts[0].response.status_code == 400
    assert attempts[1].marked == ":arrows_counterclockwise:"
    assert "continued_after_cut=1, continuations_failed=0" in status
    assert "route chat (openai-chat); continue_after_cut=prefill,regenerate" in status
    assert "upstream backup:" in status and "; prefill" in status
