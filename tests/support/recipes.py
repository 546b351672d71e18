"""The docs' recipes, read out of the docs and run as they are written.

A recipe is a fenced block right after a `<!-- recipe: NAME -->` line (both may
be indented, as in a list item).  A test takes its text from the doc, never from
a copy, and runs it with only this changed: the ports the docs use
(`127.0.0.1:8080` for proxy mode; `8091`, `8092`, `8093` for the reverse
listeners of OpenAI, Anthropic and Gemini) become the test bed's, since a
test may not take fixed ports on a shared machine.  `~` is the client's own
HOME, where `~/.mitmproxy/` is the bed's mitmproxy folder (its CA).

The bed (`DocsBed`) is the fake provider and one mitmdump in front of it, with
a proxy listener and a reverse one at the fake provider; its routes match by
path, so they take a request in either mode, and send it to the fake
provider's `primary` (one same-upstream retry), then to `backup`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .fake_provider import Call, ScriptedByApi
from .mitm import Mitmdump, start_mitmdump

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"^(?P<indent>[ \t]*)<!-- recipe: (?P<name>[\w-]+) -->\n(?P=indent)```(?P<lang>\w*)\n"
                    r"(?P<body>.*?)\n(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL)
DOC_PORTS = {"8080": "proxy", "8091": "reverse", "8092": "reverse", "8093": "reverse"}


@dataclass(frozen=True)
class Recipe:
    doc: str
    name: str
    lang: str
    text: str


def recipes(doc: str) -> dict[str, Recipe]:
    """Every recipe of `doc` (a path under the repository's root), by name."""
    found: dict[str, Recipe] = {}
    for match in MARKED.finditer((ROOT / doc).read_text()):
        indent = len(match["indent"])
        lines = [line[indent:] if line[:indent].strip() == "" else line for line in match["body"].split("\n")]
        name = match["name"]
        assert name not in found, f"{doc}: recipe {name} twice"
        found[name] = Recipe(doc, name, match["lang"], "\n".join(lines) + "\n")
    return found


def recipe(doc: str, name: str) -> Recipe:
    every = recipes(doc)
    assert name in every, f"{doc} has no recipe {name!r} (it has {sorted(every)})"
    return every[name]


def _rules(primary: int, backup: int) -> str:
    lines = ["version: 1",
             "defaults: {backoff_ms: 50, max_backoff_ms: 200, pre_answer_keepalive_s: 0, headers_timeout_s: 10}",
             "routes:"]
    for name, path, tail in (("chat", "/v1/chat/completions", "/v1/chat/completions"),
                             ("responses", "/v1/responses", "/v1/responses"),
                             ("messages", "/v1/messages", "/v1/messages"),
                             ("gemini", "/v1*/models/*", "")):  # a Gemini upstream's url: a base URL
        lines += [f"  - name: {name}", f'    match: {{path: "{path}"}}', "    upstreams:",
                  f'      - {{name: primary, url: "http://127.0.0.1:{primary}/primary{tail}", retries: 1}}',
                  f'      - {{name: backup, url: "http://127.0.0.1:{backup}/backup{tail}"}}']
    return "\n".join(lines) + "\n"


# a proxy-mode client's other requests to the real hosts (Claude Code asks for its
# settings) would leave the machine: mitmproxy answers them 404 itself
OFF_LOOPBACK = ('#(~d api.openai.com | ~d api.anthropic.com | ~d generativelanguage.googleapis.com) & '
                '!~u "/v1(beta)?/(chat/completions|responses|messages|models/)"#404')
_DROPPED = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy",
            "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
_OWN_PREFIXES = ("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE_", "LLM_", "GEMINI_", "GOOGLE_")
RUN_TIMEOUT_S = 180  # one recipe, the client's own retries included


@dataclass
class DocsBed:
    provider: ScriptedByApi
    mitm: Mitmdump
    workdir: Path

    def fail(self, kind: str, count: int = 1) -> None:
        """The primary's next `count` streaming-API requests fail with `kind` (scripts/try's kinds)."""
        self.provider.failures["primary"] = [kind, count]

    def posts(self, upstream: str) -> list[Call]:
        return [c for c in self.provider.calls_to(upstream) if c.method == "POST"
                and c.path.endswith(("/v1/chat/completions", "/v1/responses", "/v1/messages", ":streamGenerateContent"))]

    @property
    def mitmproxy_dir(self) -> Path:
        return self.mitm.log_path.parent / "mitmproxy-conf"

    def as_run(self, text: str, *, straight: bool = False) -> str:
        """The recipe's text at this bed's ports; `straight`: its reverse-mode URLs at the fake
        provider's primary itself, to see what the client does without Switchyard."""
        def port(found: re.Match[str]) -> str:
            if straight:
                return f"127.0.0.1:{self.provider.ports[0]}/primary"
            kind = DOC_PORTS[found.group(1)]
            return f"127.0.0.1:{self.mitm.proxy_port if kind == 'proxy' else self.mitm.reverse_port}"

        return re.sub(r"127\.0\.0\.1:(8080|8091|8092|8093)(?![0-9])", port, text)

    def home(self, name: str) -> Path:
        """A fresh HOME for one client, whose ~/.mitmproxy is the bed's (its CA)."""
        home = self.workdir / name
        home.mkdir(parents=True)
        (home / ".mitmproxy").symlink_to(self.mitmproxy_dir)
        return home

    def run(self, text: str, home: Path) -> subprocess.CompletedProcess[str]:
        """A shell block run by bash in `home`, as a user's shell would: the project's venv
        (python, llm) and the npm agents on PATH, none of the developer's keys or proxies."""
        from .agents import agent_binary

        base = {k: v for k, v in os.environ.items() if k not in _DROPPED and not k.startswith(_OWN_PREFIXES)}
        path = os.pathsep.join([str(Path(sys.executable).parent), str(agent_binary("codex").parent),
                                base.get("PATH", "/usr/bin:/bin")])
        return subprocess.run(["bash", "-e", "-c", text], env={**base, "PATH": path, "HOME": str(home)}, cwd=home,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)


def docs_bed_for(tmp: Path) -> Iterator[DocsBed]:
    provider = ScriptedByApi({})
    provider.start()
    rules = tmp / "rules.yaml"
    rules.write_text(_rules(provider.ports[0], provider.ports[1]))
    dump = start_mitmdump(rules, tmp / "mitmdump.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                          extra_args=["--set", f"block_list={OFF_LOOPBACK}"])
    try:
        yield DocsBed(provider, dump, tmp)
    finally:
        dump.stop()
        provider.stop()


@pytest.fixture(scope="module")
def docs_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsBed]:
    yield from docs_bed_for(tmp_path_factory.mktemp("recipes"))


@pytest.fixture
def recipe_bed(docs_bed: DocsBed) -> Iterator[DocsBed]:
    docs_bed.provider.reset()
    docs_bed.provider.failures.clear()
    yield docs_bed
    docs_bed.provider.reset()
    docs_bed.provider.failures.clear()
