"""A test bed for the agents' tests (Codex CLI, Claude Code): the fake provider, one real
mitmdump in front of it, and a way to run a client program with nothing of the developer's
own (its own HOME, no proxy variables, no real keys).  (The docs' recipes, run as written,
have their own bed: recipes.py.)

The mitmdump has both listeners:
- reverse mode (`reverse_url`) at the fake provider; routes match by path
  (`/primary/v1/...`), as `scripts/try`'s do;
- proxy mode (`proxy_url`) for clients that keep their real base URL
  (`https://api.openai.com`, `https://api.anthropic.com`) and honour HTTPS_PROXY:
  mitmproxy intercepts their TLS (they trust its CA, `ca_file`), and the routes
  for those hosts send every attempt to the fake provider, so nothing leaves the
  machine.

Either way the upstreams are the fake provider's `primary` (with one same-upstream
retry) and, on its second port, `backup`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .fake_provider import Call, FakeProvider
from .mitm import Mitmdump, start_mitmdump

APIS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
HOSTS = {"chat": "api.openai.com", "responses": "api.openai.com", "messages": "api.anthropic.com"}


def bed_rules(primary_port: int, backup_port: int) -> str:
    lines = ["version: 1",
             "defaults: {backoff_ms: 50, max_backoff_ms: 200, pre_answer_keepalive_s: 0, headers_timeout_s: 10}",
             "routes:"]
    for api, path in APIS.items():
        backup = f"{{name: backup, url: \"http://127.0.0.1:{backup_port}/backup{path}\"}}"
        lines += [f"  - name: reverse-{api}", f"    match: {{path: /primary{path}}}", "    upstreams:",
                  "      - {name: primary, url: original, retries: 1}", f"      - {backup}"]
        lines += [f"  - name: proxy-{api}", f"    match: {{host: {HOSTS[api]}, path: {path}}}", "    upstreams:",
                  f"      - {{name: primary, url: \"http://127.0.0.1:{primary_port}/primary{path}\", retries: 1}}",
                  f"      - {backup}"]
    return "\n".join(lines) + "\n"


# a proxy-mode client's other requests to the real hosts (Claude Code asks for its
# settings) would leave the machine: mitmproxy answers them 404 itself
OFF_LOOPBACK = '#(~d api.openai.com | ~d api.anthropic.com) & !~u "/v1/(chat/completions|responses|messages)"#404'

CLIENT_TIMEOUT_S = 120  # one client run, its own retries included
_DROPPED = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy",
            "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@dataclass
class ClientBed:
    provider: FakeProvider
    mitm: Mitmdump
    workdir: Path

    def through_switchyard(self, upstream: str = "primary") -> str:
        """The base URL of `upstream` at Switchyard's reverse listener (no /v1)."""
        return f"{self.mitm.reverse_url}/{upstream}"

    def straight(self, upstream: str = "primary") -> str:
        """The same upstream's base URL at the fake provider itself: no Switchyard."""
        return f"http://127.0.0.1:{self.provider.ports[0]}/{upstream}"

    @property
    def ca_file(self) -> Path:
        """mitmproxy's CA certificate, which proxy-mode clients must trust."""
        return self.mitm.log_path.parent / "mitmproxy-conf" / "mitmproxy-ca-cert.pem"

    def api_posts(self, upstream: str) -> list[Call]:
        """The streaming-API requests `upstream` got (not HEAD, models, count_tokens)."""
        return [c for c in self.provider.calls_to(upstream) if c.method == "POST" and c.path.endswith(tuple(APIS.values()))]

    def client_requests(self, mark: int, api_path: str) -> int:
        """How many requests for `api_path` (e.g. /v1/messages) the client itself made to
        mitmdump since `mark`: mitmdump prints a line per client flow once it has ended
        (with the URL of the upstream that answered, so any prefix counts)."""
        self.mitm.wait_for_log(": POST http", mark)
        urls = [line.partition(": POST ")[2].split(" ")[0] for line in self.mitm.log_since(mark).splitlines()
                if ": POST http" in line]
        return sum(1 for url in urls if url.partition("?")[0].endswith(api_path))

    def run(self, args: list[str | Path], env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
        """Run a client with its own HOME and, beyond PATH and the like, only the environment given (bounded)."""
        home.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items()
                if k not in _DROPPED and not k.startswith(("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE_", "LLM_"))}
        return subprocess.run([str(a) for a in args], env={**base, "HOME": str(home), **env}, cwd=home,
                              capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, stdin=subprocess.DEVNULL)


def client_bed_for(tmp: Path, rules_for: Callable[[int, int], str] = bed_rules) -> Iterator[ClientBed]:
    """The bed; `rules_for(primary_port, backup_port)` writes its rules.yaml."""
    provider = FakeProvider().start()
    rules = tmp / "rules.yaml"
    rules.write_text(rules_for(provider.ports[0], provider.ports[1]))
    dump = start_mitmdump(rules, tmp / "mitmdump.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                          # debug: a first attempt's plain answer is logged too (`switchyard.committed`),
                          # so a test can tell a routed answer from one that passed through
                          extra_args=["--set", f"block_list={OFF_LOOPBACK}", "--set", "termlog_verbosity=debug"])
    try:
        yield ClientBed(provider, dump, tmp)
    finally:
        dump.stop()
        provider.stop()


@pytest.fixture(scope="module")
def client_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientBed]:
    yield from client_bed_for(tmp_path_factory.mktemp("clients"))


@pytest.fixture
def bed(client_bed: ClientBed) -> Iterator[ClientBed]:
    client_bed.provider.reset()
    yield client_bed
    client_bed.provider.reset()
