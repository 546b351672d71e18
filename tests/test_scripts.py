"""The README's own tools: `scripts/fake_provider.py` and `scripts/demo`, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_provider() -> Iterator[str]:
    """`scripts/fake_provider.py` with the primary's first request failing; yields its first origin."""
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "fake_provider.py"), "--seconds", "60",
                                "--fail", "primary=sse_503:1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        origins = process.stdout.readline().decode().split()
        assert origins, "the fake provider printed no address"
        yield origins[0]
    finally:
        process.terminate()
        process.wait(10)


def post(url: str, body: dict) -> tuple[int, str, str]:
    """Status, content type and text; no proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=10) as answer:
        return answer.status, answer.headers["Content-Type"], answer.read().decode()


def test_the_fake_provider_fails_on_demand_then_answers_streams_and_whole_answers(fake_provider: str) -> None:
    url = f"{fake_provider}/primary/v1/chat/completions"
    status, _, text = post(url, {"model": "gpt-4o", "stream": True, "messages": []})
    assert status == 200 and json.loads(text.split("data: ", 1)[1])["error"]["code"] == 503  # an error frame in a 200
    status, content_type, text = post(url, {"model": "gpt-4o", "stream": True, "messages": []})
    assert content_type.startswith("text/event-stream") and text.endswith("data: [DONE]\n\n")
    # without "stream": true, the SDKs get a whole answer in their API's shape
    chat = openai.OpenAI(api_key="sk-test", base_url=f"{fake_provider}/primary/v1", max_retries=0)
    completion = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "Hello from primary, all good."
    response = chat.responses.create(model="gpt-4o", input="hi")
    assert response.output_text == "Hello from primary, all good."
    claude = anthropic.Anthropic(api_key="sk-test", base_url=f"{fake_provider}/primary", max_retries=0)
    message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "Hello from primary, all good."  # type: ignore[union-attr]


def test_the_demo_shows_a_fallback_end_to_end() -> None:
    done = subprocess.run([str(ROOT / "scripts" / "demo")], capture_output=True, timeout=120)
    output = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "answer text: 'Hello from backup, all good.'" in output
    assert "switchyard.fallback_answered route=demo-chat upstream=backup" in output
