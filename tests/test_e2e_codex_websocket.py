"""The real Codex CLI (from npm) on its built-in provider, over WebSocket, through mitmdump in reverse mode.

Codex's built-in OpenAI provider, pointed at Switchyard with
`-c openai_base_url=...`, speaks the Responses API over one WebSocket: a
`generate: false` warm-up, then the real turn naming it.  The loopback
upstreams (tests/support/ws_provider.py) fail that real turn on demand.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import agent_binary
from tests.support.mitm import Mitmdump, mitmdump_on, start_mitmdump
from tests.support.ws_provider import WsProvider, failed_turn, full_answer_turn, warm_up_turn

RULES = """\
version: 1
defaults: {{retries: 1, backoff_ms: 1}}
routes:
  - name: codex
    match: {{path: /v1/responses}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "{backup}", auth: {{header: Authorization, value: "Bearer sk-backup-key"}}}}
"""


@pytest.fixture
def primary() -> Iterator[WsProvider]:
    provider = WsProvider().start()
    yield provider
    provider.stop()


@pytest.fixture(params=[True, False], ids=["backup-websocket", "backup-http-sse"])
def backup(request: pytest.FixtureRequest) -> Iterator[WsProvider]:
    provider = WsProvider(websocket=request.param).start()
    yield provider
    provider.stop()


def switchyard(tmp_path: Path, primary: WsProvider, backup_url: str, *, bare: bool = False) -> Mitmdump:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(backup=backup_url))
    return start_mitmdump(rules, tmp_path / "mitmdump.log", reverse_target=f"http://127.0.0.1:{primary.port}",
                          bare=bare)


def codex(tmp_path: Path, dump: Mitmdump, prompt: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "codex-home"  # its own: every run writes there
    home.mkdir(exist_ok=True)
    env = {**os.environ, "CODEX_HOME": str(home), "OPENAI_API_KEY": "sk-codex-key"}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(name, None)
    return subprocess.run(
        [str(agent_binary("codex")), "exec", "--skip-git-repo-check", "-c", f"openai_base_url={dump.reverse_url}/v1",
         prompt],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL, check=False)


def test_without_switchyard_codex_fails_on_an_overloaded_real_turn(tmp_path: Path, primary: WsProvider) -> None:
    """The baseline the next test fixes: plain mitmdump relays the failure, and Codex gives up."""
    primary.script(warm_up_turn("resp_warm"), failed_turn("resp_fail"), failed_turn("resp_fail2"),
                   *[failed_turn(f"resp_more{n}") for n in range(8)])
    dump = switchyard(tmp_path, primary, "http://127.0.0.1:9/v1/responses", bare=True)
    try:
        run = codex(tmp_path, dump, "say hi")
    finally:
        dump.stop()
    assert run.returncode != 0
    assert "capacity" in (run.stdout + run.stderr).lower()


def test_codex_real_turn_overloaded_before_output_is_retried_on_the_same_connection(
        tmp_path: Path, primary: WsProvider) -> None:
    primary.script(warm_up_turn("resp_warm"), failed_turn("resp_fail"),
                   full_answer_turn("resp_ok", "CODEX-ANSWER-TEXT"))
    dump = switchyard(tmp_path, primary, "http://127.0.0.1:9/v1/responses")
    try:
        mark = dump.log_mark()
        run = codex(tmp_path, dump, "say hi")
        log = dump.wait_for_log("switchyard.retry_answered", mark)
    finally:
        dump.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "CODEX-ANSWER-TEXT"
    assert "Reconnecting" not in run.stderr
    warm_up, real, again = (json.loads(text) for text in primary.creates)
    assert warm_up["generate"] is False and real["previous_response_id"] == "resp_warm"
    assert primary.creates[1] == primary.creates[2]  # re-sent exactly
    assert primary.connections == 1  # on the same connection, where the warm-up lives
    line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    for part in ("code=server_is_overloaded", "decision=retry", "transport=websocket", "turn=2"):
        assert part in line, line


def test_codex_gets_the_backups_answer_when_the_primary_keeps_failing(
        tmp_path: Path, primary: WsProvider, backup: WsProvider) -> None:
    """Over WebSocket where the backup speaks it, else over HTTP SSE; the warm-up, which
    lives on the primary's connection only, is folded into the turn the backup gets."""
    primary.script(warm_up_turn("resp_warm"), failed_turn("resp_f1"), failed_turn("resp_f2"))
    backup.script(full_answer_turn("resp_backup", "ANSWER-FROM-BACKUP"))
    dump = switchyard(tmp_path, primary, backup.http_url)
    try:
        mark = dump.log_mark()
        run = codex(tmp_path, dump, "say hi")
        log = dump.wait_for_log("switchyard.fallback_answered", mark)
    finally:
        dump.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ANSWER-FROM-BACKUP"
    assert "Reconnecting" not in run.stderr
    assert len(primary.creates) == 3
    real = json.loads(primary.creates[1])
    if backup.websocket:
        assert len(backup.creates) == 1 and backup.posts == []
        sent = json.loads(backup.creates[0])
        assert sent["type"] == "response.create"
        headers = backup.handshakes[0]
    else:
        assert backup.creates == [] and len(backup.posts) == 1
        sent = json.loads(backup.posts[0])
        assert "type" not in sent and sent["stream"] is True
        headers = backup.post_headers[0]
    assert "previous_response_id" not in sent and "generate" not in sent
    assert sent["input"] == real["input"]  # the warm-up's input was empty
    assert sent["model"] == real["model"]
    assert headers["Authorization"] == "Bearer sk-backup-key"
    assert "upstream=backup" in log and "transport=websocket" in log


# no retries: the fault alone moves the turn to the backup
FAULT_RULES = RULES.replace("retries: 1", "retries: 0") + """\
faults:
  - {{route: codex, upstream: primary, kind: response_failed, count: 1}}
"""


def test_a_fault_from_rules_yaml_on_the_primarys_websocket_makes_codex_finish_with_the_backups_answer(
        tmp_path: Path, primary: WsProvider, backup: WsProvider) -> None:
    """The fault fires on the first message Codex sends on its connection, its warm-up: a
    `response.failed` (server_is_overloaded) in place of the primary's real answer, which
    alone would make Codex exit at once.  The warm-up falls back to the backup, the real
    turn follows it there, and Codex prints the backup's answer."""
    primary.script(warm_up_turn("resp_warm"), full_answer_turn("resp_primary", "ANSWER-FROM-PRIMARY"))
    if backup.websocket:  # over HTTP, Switchyard answers the warm-up itself
        backup.script(warm_up_turn("resp_backup_warm"))
    backup.script(full_answer_turn("resp_backup", "ANSWER-FROM-BACKUP"))
    with mitmdump_on(tmp_path, FAULT_RULES.format(backup=backup.http_url),
                     reverse_target=f"http://127.0.0.1:{primary.port}") as dump:
        run = codex(tmp_path, dump, "say hi")
        log = dump.wait_for_log("switchyard.websocket_closed")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ANSWER-FROM-BACKUP"
    assert "capacity" not in run.stderr.lower() and "Reconnecting" not in run.stderr
    assert len(primary.creates) == 1 and json.loads(primary.creates[0])["generate"] is False  # sent for real
    if backup.websocket:
        assert [json.loads(c).get("generate") for c in backup.creates] == [False, None]
    else:  # the warm-up bound for HTTP is answered by Switchyard; the real turn is POSTed
        assert backup.creates == [] and len(backup.posts) == 1
    assert ("switchyard.fault_injected route=codex upstream=primary attempt=1 kind=response_failed after_frames=0 "
            "transport=websocket turn=1") in log
    failed = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    for part in ("fault=response_failed", "code=server_is_overloaded", "decision=next_upstream", "turn=1"):
        assert part in failed, failed
    assert log.count("switchyard.fault_injected") == 1  # count: 1
