"""A test bed for the real CLI agents: the fake provider, a real mitmdump in front of
it in reverse mode, and a way to run an agent with nothing of the developer's own
(its own HOME or CODEX_HOME, no proxy variables, no real keys).

Each agent test runs the agent once through Switchyard and once straight at the fake
provider, so the pair shows what Switchyard changes for that agent.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .fake_provider import Call, FakeProvider
from .mitm import Mitmdump, start_mitmdump

AGENT_RULES = """\
version: 1
defaults: {{backoff_ms: 50, max_backoff_ms: 200, pre_answer_keepalive_s: 0, headers_timeout_s: 10}}
routes:
  - name: agent-responses
    match: {{path: /primary/v1/responses}}
    upstreams:
      - {{name: primary, url: original, retries: 1}}
      - {{name: backup, url: "http://127.0.0.1:{backup}/backup/v1/responses"}}
  - name: agent-messages
    match: {{path: /primary/v1/messages}}
    upstreams:
      - {{name: primary, url: original, retries: 1}}
      - {{name: backup, url: "http://127.0.0.1:{backup}/backup/v1/messages"}}
"""

AGENT_TIMEOUT_S = 120  # one agent run, its own retries included
_DROPPED = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")


@dataclass
class AgentBed:
    provider: FakeProvider
    mitm: Mitmdump
    workdir: Path

    def through_switchyard(self, upstream: str = "primary") -> str:
        """The base URL of `upstream` at Switchyard's reverse listener (no /v1)."""
        return f"{self.mitm.reverse_url}/{upstream}"

    def straight(self, upstream: str = "primary") -> str:
        """The same upstream's base URL at the fake provider itself: no Switchyard."""
        return f"http://127.0.0.1:{self.provider.ports[0]}/{upstream}"

    def api_posts(self, upstream: str) -> list[Call]:
        """The streaming-API requests `upstream` got (not HEAD, models, count_tokens)."""
        return [c for c in self.provider.calls_to(upstream) if c.method == "POST"
                and c.path.endswith(("/v1/responses", "/v1/messages"))]

    def client_requests(self, mark: int, api_path: str) -> int:
        """How many requests for `api_path` (e.g. /v1/messages) the agent itself made to
        mitmdump since `mark`: mitmdump prints a line per client flow once it has ended
        (with the URL of the upstream that answered, so any prefix counts)."""
        self.mitm.wait_for_log(": POST http", mark)
        return sum(1 for line in self.mitm.log_since(mark).splitlines()
                   if ": POST http" in line and line.partition("?")[0].endswith(api_path))

    def run(self, args: list[str | Path], env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
        """Run an agent with its own HOME and only the environment given (bounded)."""
        home.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items()
                if k not in _DROPPED and not k.startswith(("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE_"))}
        return subprocess.run([str(a) for a in args], env={**base, "HOME": str(home), **env}, cwd=home,
                              capture_output=True, text=True, timeout=AGENT_TIMEOUT_S, stdin=subprocess.DEVNULL)


def agent_bed_for(tmp: Path) -> Iterator[AgentBed]:
    provider = FakeProvider().start()
    rules = tmp / "rules.yaml"
    rules.write_text(AGENT_RULES.format(backup=provider.ports[1]))
    dump = start_mitmdump(rules, tmp / "mitmdump.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}")
    try:
        yield AgentBed(provider, dump, tmp)
    finally:
        dump.stop()
        provider.stop()


@pytest.fixture(scope="module")
def agent_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentBed]:
    yield from agent_bed_for(tmp_path_factory.mktemp("agents"))


@pytest.fixture
def bed(agent_bed: AgentBed) -> Iterator[AgentBed]:
    agent_bed.provider.reset()
    yield agent_bed
    agent_bed.provider.reset()
