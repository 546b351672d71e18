"""What the Gemini end-to-end tests share: a mitmdump with Gemini routes in front of
the session's fake provider, and helpers that script it and read what it was asked.

The `gemini` route: upstream `primary` is the request's own destination
(retries: 1, so two attempts); `backup` is on the fake provider's second port,
names its own model call in its URL (`gemini-2.5-flash-lite`), and carries its
own key in the query (`?key=${SWY_TEST_GEMINI_KEY}`), never the client's.  A
test module takes the fixtures by importing `env` and `gemini_mitm`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BACKUP_SECRET, CurlResult, Env
from tests.support import gemini_wire, wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import Mitmdump, mitmdump_on

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLIENT_KEY = "AIzaSy-client-GEMINI-5e6f7a"
MODEL = "gemini-2.5-flash"
STREAM_PATH = f"/v1beta/models/{MODEL}:streamGenerateContent"

RULES = """\
version: 1
defaults:
  # each test is about one request: outage memory would leak from test to test (it has its own tests)
  max_skip_s: 0
  unreachable_skip_s: 0
  retries: 1
  backoff_ms: 1
  max_backoff_ms: 3000
  headers_timeout_s: 5
  idle_timeout_s: 3
  pre_answer_keepalive_s: 0
routes:
  - name: gemini
    match: {{path: "/primary/v1*/models/*"}}
    upstreams:
      - {{name: primary, url: original}}
      - name: backup
        url: "http://127.0.0.1:{p2}/backup/v1beta/models/gemini-2.5-flash-lite:generateContent?key=${{SWY_TEST_GEMINI_KEY}}"
        retries: 0
  - name: gemini-pro
    match: {{path: "/routed/v1*/models/*", model: "gemini-2.5-pro*"}}
    upstreams:
      - {{name: routed, url: original, model: gemini-2.5-flash}}
  - name: gemini-faulty
    match: {{path: "/faulty/v1*/models/*"}}
    upstreams:
      - {{name: faulty, url: original, retries: 0}}
      - name: backup
        url: "http://127.0.0.1:{p2}/backup"
        auth: {{header: x-goog-api-key, value: "${{SWY_TEST_GEMINI_KEY}}"}}
  - name: gemini-keepalive
    match: {{path: "/keepalive/v1*/models/*"}}
    pre_answer_keepalive_s: 0.2
    upstreams:
      - {{name: keepalive, url: original, retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup"}}
faults:
  - {{route: gemini-faulty, upstream: faulty, kind: sse_error, status: 503, message: "The model is overloaded."}}
"""


@pytest.fixture(scope="module")
def gemini_mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("mitm-gemini"), RULES.format(p2=provider.ports[1]),
                     reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                     env={"SWY_TEST_GEMINI_KEY": BACKUP_SECRET}) as dump:
        yield dump


@pytest.fixture
def env(provider: FakeProvider, gemini_mitm: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, gemini_mitm, Path(gemini_mitm.log_path).parent / "rules.yaml")
    provider.reset()


def curl_stream(env: Env, prefix: str = "primary", query: str = "alt=sse", key_header: bool = True) -> CurlResult:
    """A stream asked with curl at mitmdump's reverse listener: the exact bytes it got.
    The client's key goes in `x-goog-api-key` unless `key_header` is off."""
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "say hello"}]}]}).encode()
    return env.curl(f"{env.mitm.reverse_url}/{prefix}{STREAM_PATH}?{query}", body,
                    headers={"x-goog-api-key": CLIENT_KEY} if key_header else {}, via_proxy=False)


def upstreams(env: Env) -> list[str]:
    return [call.upstream for call in env.provider.calls]


def unavailable() -> Reply:
    """A 200 stream whose first frame is Gemini's 503 UNAVAILABLE."""
    return Reply.sse(*[(FIXTURES / "gemini_unavailable_first.sse").read_bytes()])


def text_of(upstream: str) -> str:
    return wire.answer_text(upstream)


def stream_bytes(upstream: str) -> bytes:
    """The fake provider's normal stream for `upstream`, byte for byte."""
    return b"".join(gemini_wire.stream(text_of(upstream)))
