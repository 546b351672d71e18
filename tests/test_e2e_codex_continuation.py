"""Codex CLI (`codex exec`, installed from npm) on its HTTP SSE provider, through a
real mitmdump whose route finishes cut answers: a reasoning model's answer that
breaks in its text, after its reasoning, is finished by a prefill backup, and
Codex prints the whole answer once.

Without Switchyard, Codex itself treats "stream closed before response.completed"
as retryable and asks again for the whole turn; here it asks once."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.support import wire
from tests.support.agents import agent_binary
from tests.support.client_bed import ClientBed, client_bed_for
from tests.support.fake_provider import RESET, Reply
from tests.test_e2e_codex import API_KEY

FULL = "Switchyard finished this answer after the cut, every word of it once."
WORDS = wire.chat_words(FULL)
SENT = "".join(WORDS[:4])
REST = FULL[len(SENT):]
THOUGHT = wire.Reasoning("rs_codex", ("**Greeting** the user.",), encrypted_content="gAAAAB-codex-thought")
AGAIN = wire.Reasoning("rs_again", ("**Continuing** the sentence.",), encrypted_content="gAAAAB-again")


def continuing_rules(primary_port: int, backup_port: int) -> str:
    return f"""\
version: 1
defaults: {{backoff_ms: 1, pre_answer_keepalive_s: 0, headers_timeout_s: 10, idle_timeout_s: 5}}
routes:
  - name: codex
    match: {{path: /primary/v1/responses}}
    continue_after_cut: [prefill]
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        url: http://127.0.0.1:{backup_port}/backup/v1/responses
        prefill: true
"""


@pytest.fixture(scope="module")
def continuing_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientBed]:
    yield from client_bed_for(tmp_path_factory.mktemp("codex-continuation"), continuing_rules)


@pytest.fixture
def cbed(continuing_bed: ClientBed) -> Iterator[ClientBed]:
    continuing_bed.provider.reset()
    yield continuing_bed
    continuing_bed.provider.reset()


def codex_config(base_url: str) -> str:
    """docs/clients.md's Codex recipe, with a reasoning model."""
    return f"""\
model = "gpt-5"
model_provider = "switchyard"
model_reasoning_summary = "auto"

[model_providers.switchyard]
name = "Switchyard"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""


def run_codex(bed: ClientBed, name: str, base_url: str) -> subprocess.CompletedProcess[str]:
    home = bed.workdir / name
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url + "/v1"))
    return bed.run([agent_binary("codex"), "exec", "--skip-git-repo-check", "Say hello"],
                   {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": API_KEY}, home)


def answer(text: str, thought: wire.Reasoning, ident: str) -> list[bytes]:
    return wire.responses_stream(text, rid=ident, reasoning=[thought], item_id=f"{ident}_item")


def cut_answer() -> Reply:
    whole = answer(FULL, THOUGHT, "orig")
    return Reply.sse(*whole[:wire.first_text_frame(whole) + len(WORDS[:4])], RESET)


def test_codex_gets_a_reasoning_answer_cut_in_its_text_whole_and_once(cbed: ClientBed) -> None:
    cbed.provider.script("primary", cut_answer())
    cbed.provider.script("backup", Reply.sse(*answer(REST, AGAIN, "cont")))
    mark = cbed.mitm.log_mark()
    done = run_codex(cbed, "reasoning-cut", cbed.through_switchyard())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(FULL) == 1, done.stdout[-3000:]
    assert REST.strip() not in done.stdout.replace(FULL, "")  # no second, partial copy of the rest
    assert "Continuing" not in done.stdout + done.stderr  # the continuation's own reasoning never reached Codex
    [asked] = cbed.api_posts("primary")
    [continued] = cbed.api_posts("backup")
    assert cbed.client_requests(mark, "/v1/responses") == 1  # Codex asked once
    original = asked.json()
    assert isinstance(original, dict) and original["store"] is False
    assert "reasoning.encrypted_content" in original["include"]
    assert continued.json() == {**original, "input": [
        *original["input"],
        {"type": "reasoning", "id": "rs_codex", "summary": [{"type": "summary_text", "text": THOUGHT.summary[0]}],
         "encrypted_content": THOUGHT.encrypted_content},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": SENT}]},
    ]}
    cbed.mitm.wait_for_log("switchyard.continued_after_cut route=codex upstream=backup attempt=2 strategy=prefill",
                           mark)


def test_without_switchyard_codex_asks_for_the_whole_turn_again(cbed: ClientBed) -> None:
    """The same cut straight from the provider: Codex reconnects and sends the turn
    again, and what it prints is whatever that second answer says."""
    cbed.provider.script("primary", cut_answer(), Reply.sse(*answer("A different answer.", AGAIN, "second")))
    done = run_codex(cbed, "reasoning-cut-direct", cbed.straight())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Reconnecting..." in done.stderr
    assert "A different answer." in done.stdout and FULL not in done.stdout
    assert len(cbed.api_posts("primary")) == 2 and not cbed.api_posts("backup")
