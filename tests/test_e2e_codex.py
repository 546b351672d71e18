"""Codex CLI (`codex exec`, installed from npm) on its HTTP SSE provider, through a real
mitmdump with Switchyard, and straight at the fake provider to show what changes.

Codex ends a turn with exit status 1 and "Selected model is at capacity" when the
Responses stream says `response.failed` with `server_is_overloaded`: it does not
retry that itself.  Switchyard retries it before any output, then falls back.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import wire
from tests.support.client_bed import ClientBed, client_bed, bed  # noqa: F401  (fixtures)
from tests.support.agents import agent_binary
from tests.support.fake_provider import failing_reply

API_KEY = "sk-codex-test-key"
CAPACITY = "Selected model is at capacity"


def codex_config(base_url: str) -> str:
    """docs/clients.md's recipe (run as written by test_docs_recipes.py): a custom provider speaking the Responses API over HTTP SSE."""
    return f"""\
model_provider = "switchyard"

[model_providers.switchyard]
name = "Switchyard"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""


def run_codex(bed: ClientBed, base_url: str, name: str, env: dict[str, str] | None = None,
              ) -> subprocess.CompletedProcess[str]:
    home = bed.workdir / name
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    return bed.run([agent_binary("codex"), "exec", "--skip-git-repo-check", "Say hello"],
                   {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": API_KEY, **(env or {})}, home)


def capacity_failure() -> object:
    return failing_reply("response_failed", "openai-responses")


def answered(done: subprocess.CompletedProcess[str], upstream: str) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert wire.answer_text(upstream) in done.stdout


def test_codex_answers_through_switchyard(bed: ClientBed) -> None:
    mark = bed.mitm.log_mark()
    done = run_codex(bed, bed.through_switchyard() + "/v1", "happy")
    answered(done, "primary")
    [call] = bed.api_posts("primary")
    assert call.headers["Authorization"] == f"Bearer {API_KEY}"
    assert call.headers["Accept"] == "text/event-stream"
    assert not bed.api_posts("backup")
    # routed: Switchyard took the answer (its first attempt), not mitmproxy alone
    log = bed.mitm.wait_for_log("switchyard.committed route=reverse-responses upstream=primary attempt=1 ", mark)
    assert log.count("switchyard.committed ") == 1 and "switchyard.attempt_failed" not in log


def test_a_capacity_failure_before_output_is_retried_on_the_same_upstream(bed: ClientBed) -> None:
    bed.provider.script("primary", capacity_failure())
    mark = bed.mitm.log_mark()
    done = run_codex(bed, bed.through_switchyard() + "/v1", "retry")
    answered(done, "primary")
    assert CAPACITY not in done.stdout + done.stderr
    assert len(bed.api_posts("primary")) == 2 and not bed.api_posts("backup")
    assert bed.client_requests(mark, "/v1/responses") == 1  # Codex asked once: the retry was Switchyard's
    log = bed.mitm.wait_for_log("switchyard.retry_answered", mark)
    assert ("route=reverse-responses upstream=primary attempt=1 phase=staging code=server_is_overloaded "
            "event=response.failed decision=retry") in log


def test_a_persistent_capacity_failure_falls_back_to_the_backup(bed: ClientBed) -> None:
    bed.provider.script("primary", capacity_failure(), capacity_failure(), capacity_failure())
    mark = bed.mitm.log_mark()
    done = run_codex(bed, bed.through_switchyard() + "/v1", "fallback")
    answered(done, "backup")
    assert len(bed.api_posts("primary")) == 2 and len(bed.api_posts("backup")) == 1
    assert "switchyard.fallback_answered route=reverse-responses upstream=backup attempt=3" in bed.mitm.wait_for_log(
        "switchyard.fallback_answered", mark)
    # the backup is another origin: it never got the client's key
    assert "Authorization" not in bed.api_posts("backup")[0].headers


def test_without_switchyard_the_same_failure_ends_codex_with_an_error(bed: ClientBed) -> None:
    bed.provider.script("primary", capacity_failure())
    done = run_codex(bed, bed.straight() + "/v1", "direct")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert CAPACITY in done.stdout + done.stderr
    assert wire.answer_text("primary") not in done.stdout
    assert len(bed.api_posts("primary")) == 1  # Codex did not try again


def test_codex_honours_https_proxy_with_its_http_provider(bed: ClientBed) -> None:
    """Proxy mode: the provider's real base URL, HTTPS_PROXY, and mitmproxy's CA in SSL_CERT_FILE."""
    bed.provider.script("primary", capacity_failure())
    mark = bed.mitm.log_mark()
    done = run_codex(bed, "https://api.openai.com/v1", "proxy",
                     {"HTTPS_PROXY": bed.mitm.proxy_url, "SSL_CERT_FILE": str(bed.ca_file)})
    answered(done, "primary")
    assert len(bed.api_posts("primary")) == 2
    bed.mitm.wait_for_log("switchyard.retry_answered route=proxy-responses upstream=primary attempt=2", mark)
