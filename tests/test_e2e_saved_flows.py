"""Flows saved with `mitmdump -w`: what docs/debugging.md says they hold, read back with
mitmproxy's own reader."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mitmproxy import http, io

from tests.support import wire
from tests.support.client_bed import bed_rules
from tests.support.fake_provider import FakeProvider, failing_reply
from tests.support.mitm import start_mitmdump

KEY = "sk-saved-flows-SECRET-31"


def test_saved_flows_hold_the_clients_request_or_after_a_fallback_the_backups(tmp_path: Path) -> None:
    provider = FakeProvider().start()
    saved = tmp_path / "flows.mitm"
    rules = tmp_path / "rules.yaml"
    rules.write_text(bed_rules(provider.ports[0], provider.ports[1]))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                          extra_args=["-w", str(saved)])
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": []})
    url = f"{dump.reverse_url}/primary/v1/chat/completions"
    try:
        for failures in (1, 2):  # a retry on the client's own destination, then a fallback
            provider.script("primary", *[failing_reply("sse_503", "openai-chat")] * failures)
            out = subprocess.run(["curl", "-sS", "-N", "--max-time", "20", "-H", f"Authorization: Bearer {KEY}",
                                  "-H", "Content-Type: application/json", "-d", body, url],
                                 capture_output=True, timeout=30).stdout
            assert out == b"".join(wire.chat_stream(wire.answer_text("backup" if failures == 2 else "primary")))
        dump.wait_for_log(": POST http", count=2)  # both flows have ended (and were written)
    finally:
        dump.stop()
        provider.stop()
    with saved.open("rb") as handle:
        flows = [f for f in io.FlowReader(handle).stream() if isinstance(f, http.HTTPFlow)]
    retried, fell_back = flows
    # the client's own destination answered: the request as the client sent it, replayable
    assert retried.request.url == f"http://127.0.0.1:{provider.ports[0]}/primary/v1/chat/completions"
    assert retried.request.headers["authorization"] == f"Bearer {KEY}"
    assert retried.request.content == body.encode()
    # another origin answered: its URL, and the headers it was sent (never the client's key)
    assert fell_back.request.url == f"http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions"
    assert "authorization" not in fell_back.request.headers
    assert KEY.encode() not in fell_back.request.content
