"""What mitmweb shows of a failed attempt, read from a real mitmweb's own flow list
(`GET /flows`, the JSON its UI draws from)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support import wire
from tests.support.client_bed import bed_rules
from tests.support.fake_provider import FakeProvider, failing_reply
from tests.support.mitm import free_port, start_mitmdump


def flows(web_url: str) -> list[dict]:
    base, _, token = web_url.partition("/?token=")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"{base}/flows", headers={"Authorization": f"Bearer {token}"})
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
