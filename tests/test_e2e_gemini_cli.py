"""The real Gemini CLI (`gemini -p`, installed from npm by the test set-up) through a
real mitmdump in reverse mode, against a loopback upstream that speaks Gemini's API
(routes and helpers: tests/support/gemini_env.py).

Gemini CLI asks its model router first (`:generateContent`, answered with the JSON
it wants) and then streams the answer, and it retries an in-stream 503 by itself:
so each test also checks, from mitmdump's log, how many requests the CLI sent.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mitmproxy import http, io

from tests.conftest import BACKUP_SECRET, Env
from tests.support import gemini_wire
from tests.support.agents import agent_binary
from tests.support.fake_provider import NORMAL, Reply
from tests.support.mitm import start_mitmdump
from tests.support.gemini_env import (  # noqa: F401 -- env and gemini_mitm are fixtures
    CLIENT_KEY,
    FIXTURES,
    RULES,
    env,
    gemini_mitm,
    text_of,
    unavailable,
)



def run_gemini_cli(env: Env, tmp_path: Path, prefix: str = "primary") -> subprocess.CompletedProcess[str]:
    """`gemini -p` with its own HOME, pointed at Switchyard (reverse mode)."""
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    cli_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "GEMINI_API_KEY": CLIENT_KEY,
               "GOOGLE_GEMINI_BASE_URL": f"{env.mitm.reverse_url}/{prefix}", "GEMINI_CLI_TRUST_WORKSPACE": "true"}
    return subprocess.run([str(agent_binary("gemini")), "-p", "say hello"], env=cli_env, cwd=home,
                          capture_output=True, text=True, timeout=120)


def cli_calls(env: Env) -> list[tuple[str, str]]:
    return [(call.upstream, call.path.rsplit(":", 1)[1]) for call in env.provider.calls]


def assert_cli_asked_twice(env: Env, mark: int) -> str:
    """The CLI sent two requests (its router's, then the stream) and no retry of its own
    (it retries an in-stream 503 itself): mitmdump prints each client flow once done."""
    log = env.mitm.wait_for_log(": POST http", mark, count=2)
    assert log.count(": POST http") == 2, log
    return log


def test_gemini_cli_in_stream_unavailable_is_retried(env: Env, tmp_path: Path) -> None:
    # its model router's :generateContent first (answered normally), then the stream
    env.provider.script("primary", NORMAL, unavailable())
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("primary")
    assert "switchyard.retry_answered route=gemini" in assert_cli_asked_twice(env, mark)
    assert cli_calls(env) == [("primary", "generateContent"), ("primary", "streamGenerateContent"),
                              ("primary", "streamGenerateContent")]


def test_gemini_cli_falls_back_to_the_backup(env: Env, tmp_path: Path) -> None:
    env.provider.script("primary", NORMAL, unavailable(), unavailable())
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("backup")
    assert "switchyard.fallback_answered route=gemini upstream=backup" in assert_cli_asked_twice(env, mark)
    assert cli_calls(env) == [("primary", "generateContent"), ("primary", "streamGenerateContent"),
                              ("primary", "streamGenerateContent"), ("backup", "streamGenerateContent")]
    assert CLIENT_KEY not in json.dumps(env.provider.calls[-1].headers)


def test_gemini_cli_gets_invalid_argument_as_sent(env: Env, tmp_path: Path) -> None:
    sent = (FIXTURES / "gemini_http_400_api_key_invalid.json").read_bytes()
    env.provider.script("primary", NORMAL, Reply.json(400, sent))
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode != 0
    assert "decision=fatal" in assert_cli_asked_twice(env, mark)
    assert "API key not valid. Please pass a valid API key." in done.stdout + done.stderr
    assert cli_calls(env) == [("primary", "generateContent"), ("primary", "streamGenerateContent")]


def test_gemini_cli_behind_the_pre_answer_keepalive(env: Env, tmp_path: Path) -> None:
    """The stream's head and its blank-line keepalive reach the CLI before any upstream has
    answered (the flow, saved with -w, says `x-switchyard-upstream: pending`), and the CLI
    still reads the backup's answer after them."""
    saved = tmp_path / "flows"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(p2=env.provider.ports[1]))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", reverse_target=f"http://127.0.0.1:{env.provider.ports[0]}",
                          env={"SWY_TEST_GEMINI_KEY": BACKUP_SECRET}, extra_args=["-w", str(saved)])
    env.provider.script("keepalive", NORMAL, Reply.sse(0.7, *unavailable().pieces))
    try:
        done = run_gemini_cli(Env(env.provider, dump, rules), tmp_path, prefix="keepalive")
        dump.wait_for_log(": POST http", count=2)  # both of its flows have ended (and were written)
    finally:
        dump.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("backup")
    assert cli_calls(env) == [("keepalive", "generateContent"), ("keepalive", "streamGenerateContent"),
                              ("backup", "streamGenerateContent")]
    with saved.open("rb") as handle:
        streamed = [f for f in io.FlowReader(handle).stream() if isinstance(f, http.HTTPFlow)
                    and f.request.path.partition("?")[0].endswith(":streamGenerateContent")]
    assert [f.response.headers.get("x-switchyard-upstream") for f in streamed if f.response] == ["pending"]
    assert streamed[0].metadata["switchyard"]["answered_by"] == "backup"


def test_gemini_cli_gets_its_answer_after_a_429_retry_delay(env: Env, tmp_path: Path) -> None:
    retry_info = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]
    body = gemini_wire.error_body(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).",
                                  retry_info)
    env.provider.script("primary", NORMAL, Reply.json(429, body))
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("primary")
    log = assert_cli_asked_twice(env, mark)
    assert "status=429 code=RESOURCE_EXHAUSTED event=http decision=retry delay_s=1.5 " in log


def test_gemini_cli_error_after_output_is_forwarded_not_replayed(env: Env, tmp_path: Path) -> None:
    """Gemini CLI retries the in-stream 503 itself; Switchyard sends each of its
    requests upstream exactly once."""
    error = gemini_wire.error_frame(503, "UNAVAILABLE", "This model is currently experiencing high demand.")
    env.provider.script("primary", NORMAL, Reply.sse(gemini_wire.chunk("Hello"), error))
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    log = env.mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output route=gemini", mark)
    streams = [c for c in cli_calls(env) if c[1] == "streamGenerateContent"]
    client_streams = env.mitm.wait_for_log(": POST http", mark, count=1 + len(streams)).count(": POST http") - 1
    assert len(streams) == client_streams == 2, (streams, log)
    assert done.returncode == 0, done.stderr[-3000:]
    # its own retry's answer (after the "Hello" it had already printed)
    assert done.stdout.strip().endswith(text_of("primary"))
