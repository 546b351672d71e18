"""Shared end-to-end fixtures: one fake provider and one mitmdump per test session.

Each test scripts the provider's replies; the autouse fixture clears scripts
and recorded calls between tests, so tests stay independent while paying for
mitmdump's start-up once.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_provider import FakeProvider
from tests.support.mitm import Mitmdump, start_mitmdump
from tests.support.ws_provider import WsProvider

CLIENT_SECRET = "sk-client-SECRET-1b2c3d"
BACKUP_SECRET = "sk-backup-SECRET-9z8y7x"
BODY_MARKER = "PRIVATE-PROMPT-4f5e6d"

E2E_RULES = """\
version: 1
defaults:
  # these tests are each about one request: what a request teaches later ones (outage
  # memory) would leak from test to test; it has tests of its own (test_e2e_outages.py)
  max_skip_s: 0
  unreachable_skip_s: 0
  retries: 1
  backoff_ms: 1
  max_backoff_ms: 300
  headers_timeout_s: 5
  idle_timeout_s: 3
  pre_answer_keepalive_s: 0
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - name: primary
        url: original
      - name: ghost                # its variable is unset: skipped with one warning
        url: http://127.0.0.1:{p2}/ghost/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer ${{SWY_TEST_UNSET_VARIABLE}}"}}
      - name: backup
        url: http://127.0.0.1:{p2}/backup/v1/chat/completions
        model: backup-model
        retries: 0
        auth: {{header: Authorization, value: "Bearer ${{SWY_TEST_BACKUP_KEY}}"}}
        headers: {{X-Team: dev}}
  - name: chat-solo
    match: {{path: /solo/v1/chat/completions}}
    upstreams:
      - {{name: solo, url: original}}
  - name: chat-dead
    match: {{path: /deadfirst/v1/chat/completions}}
    upstreams:
      - {{name: dead, url: "http://127.0.0.1:{dead}/dead/v1/chat/completions", retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: chat-unreachable
    match: {{path: /unreachable/v1/chat/completions}}
    upstreams:
      - {{name: dead, url: "http://127.0.0.1:{dead}/dead/v1/chat/completions", retries: 1}}
  - name: chat-slow
    match: {{path: /slow/v1/chat/completions}}
    headers_timeout_s: 0.5
    first_output_timeout_s: 0.8
    idle_timeout_s: 0.5
    upstreams:
      - {{name: slow, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: chat-keepalive
    match: {{path: /keepalive/v1/chat/completions}}
    pre_answer_keepalive_s: 0.2
    upstreams:
      - {{name: keepalive, url: original, retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions", retries: 0}}
  - name: chat-thinking            # a long pause before output (a reasoning model)
    match: {{path: /thinking/v1/chat/completions}}
    idle_timeout_s: 0.3
    request_timeout_s: 2
    pre_answer_keepalive_s: 0.2
    upstreams:
      - {{name: thinking, url: original, retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions", retries: 0}}
  - name: chat-tiny-staging
    match: {{path: /tiny/v1/chat/completions}}
    staging_limit: 300
    upstreams:
      - {{name: tiny, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: chat-narrow-retry-on       # retry_on narrowed: transport failures still fall back
    match: {{path: /narrow/v1/chat/completions}}
    retry_on: [429]
    upstreams:
      - {{name: dead, url: "http://127.0.0.1:{dead}/dead/v1/chat/completions", retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: chat-patient             # a long backoff, to leave during it
    match: {{path: /patient/v1/chat/completions}}
    backoff_ms: 1500
    max_backoff_ms: 3000
    upstreams:
      - {{name: patient, url: original, retries: 3}}
  - name: chat-varhost              # a variable in an upstream's host
    match: {{path: /varhost/v1/chat/completions}}
    upstreams:
      - {{name: varhost, url: original, retries: 0}}
      - {{name: backup, url: "http://${{SWY_TEST_BACKUP_HOST}}:{p2}/backup/v1/chat/completions"}}
  - name: chat-dead-last
    match: {{path: /deadlast/v1/chat/completions}}
    upstreams:
      - {{name: deadlast, url: original, retries: 0}}
      - {{name: dead, url: "http://127.0.0.1:{dead}/dead/v1/chat/completions", retries: 0}}
  - name: responses
    match: {{path: /primary/v1/responses}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/responses"}}
  - name: messages
    match: {{path: /primary/v1/messages}}
    upstreams:
      - {{name: primary, url: original}}
      - name: backup
        url: http://127.0.0.1:{p2}/backup/v1/messages
        auth: {{header: x-api-key, value: "${{SWY_TEST_BACKUP_KEY}}"}}
"""


@dataclass
class Env:
    provider: FakeProvider
    mitm: Mitmdump
    rules_path: Path

    def chat_body(self, stream: bool = True, **extra: object) -> bytes:
        body = {
            "model": "gpt-4o",
            "stream": stream,
            "messages": [{"role": "user", "content": f"say hello {BODY_MARKER}"}],
            **extra,
        }
        return json.dumps(body).encode()

    def curl(self, url: str, body: bytes, *, headers: dict[str, str] | None = None, via_proxy: bool = True,
             max_time: float = 20) -> "CurlResult":
        """POST with curl through mitmdump; returns status, headers and the exact body bytes."""
        args = ["curl", "-sS", "-N", "-D", "-", "--max-time", str(max_time), "-X", "POST", "--data-binary", "@-",
                "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {CLIENT_SECRET}"]
        if via_proxy:
            args += ["-x", self.mitm.proxy_url, "--noproxy", ""]
        for name, value in (headers or {}).items():
            args += ["-H", f"{name}: {value}"]
        args.append(url)
        done = subprocess.run(args, input=body, capture_output=True, timeout=max_time + 10)
        return CurlResult.parse(done.stdout, done.returncode, done.stderr)


@dataclass
class CurlResult:
    status: int
    headers: dict[str, str]
    body: bytes
    returncode: int
    stderr: bytes

    @classmethod
    def parse(cls, raw: bytes, returncode: int, stderr: bytes) -> "CurlResult":
        while raw.startswith(b"HTTP/1.1 100"):  # curl's Expect: 100-continue for large bodies
            raw = raw.partition(b"\r\n\r\n")[2]
        head, sep, body = raw.partition(b"\r\n\r\n")
        if not sep:
            return cls(0, {}, b"", returncode, stderr)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return cls(status, headers, body, returncode, stderr)


@pytest.fixture(scope="session")
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    from tests.support.mitm import refused_port

    workdir = tmp_path_factory.mktemp("mitm")
    rules = workdir / "rules.yaml"
    rules.write_text(E2E_RULES.format(p2=provider.ports[1], dead=refused_port()))
    dump = start_mitmdump(
        rules,
        workdir / "mitmdump.log",
        reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
        env={"SWY_TEST_BACKUP_KEY": BACKUP_SECRET, "SWY_TEST_BACKUP_HOST": "127.0.0.1"},
    )
    yield dump
    dump.stop()


@pytest.fixture
def env(provider: FakeProvider, mitm: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, mitm, Path(mitm.log_path).parent / "rules.yaml")
    provider.reset()


# --- loopback Responses WebSocket upstreams, one set per test module ---------------------


def _serving(provider: WsProvider) -> Iterator[WsProvider]:
    provider.start()
    yield provider
    provider.stop()


def _fresh(provider: WsProvider) -> Iterator[WsProvider]:
    provider.reset()
    yield provider
    provider.reset()


@pytest.fixture(scope="module")
def primary_provider() -> Iterator[WsProvider]:
    yield from _serving(WsProvider())


@pytest.fixture(scope="module")
def backup_provider() -> Iterator[WsProvider]:
    yield from _serving(WsProvider())


@pytest.fixture(scope="module")
def plain_provider() -> Iterator[WsProvider]:
    yield from _serving(WsProvider(websocket=False))  # refuses the upgrade: speaks HTTP SSE only


@pytest.fixture
def primary(primary_provider: WsProvider) -> Iterator[WsProvider]:
    """The module's first upstream, with no script and no records left by another test."""
    yield from _fresh(primary_provider)


@pytest.fixture
def backup(backup_provider: WsProvider) -> Iterator[WsProvider]:
    yield from _fresh(backup_provider)


@pytest.fixture
def plain(plain_provider: WsProvider) -> Iterator[WsProvider]:
    yield from _fresh(plain_provider)
