"""Claude Code (`claude -p`, installed from npm) through a real mitmdump with Switchyard,
and straight at the fake provider to show what changes.

Claude Code retries an `overloaded_error` first event by itself, silently; when the
failure persists it gives up after a few tries ("API returned an empty or malformed
response").  Through Switchyard it asks once: the retry and the fallback are
Switchyard's, before any output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import wire
from tests.support.client_bed import ClientBed, client_bed, bed, client_bed_for  # noqa: F401  (fixtures)
from tests.support.agents import agent_binary
from tests.support.fake_provider import Reply, failing_reply

API_KEY = "sk-ant-claude-test-key"
PERSISTENT = 12  # more overloads than Claude Code's own tries


def run_claude(bed: ClientBed, base_url: str | None, name: str, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """docs/clients.md's recipe (run as written by test_docs_recipes.py): ANTHROPIC_BASE_URL at Switchyard, the nonessential traffic off."""
    own = {"ANTHROPIC_API_KEY": API_KEY, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
    if base_url is not None:
        own["ANTHROPIC_BASE_URL"] = base_url
    return bed.run([agent_binary("claude"), "-p", "Say hello"], {**own, **(env or {})}, bed.workdir / name)


def overloaded() -> object:
    return failing_reply("sse_529", "anthropic-messages")  # HTTP 200, then an overloaded_error event


def answered(done: subprocess.CompletedProcess[str], upstream: str) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip() == wire.answer_text(upstream)


def test_claude_code_answers_through_switchyard(bed: ClientBed) -> None:
    mark = bed.mitm.log_mark()
    done = run_claude(bed, bed.through_switchyard(), "happy")
    answered(done, "primary")
    [call] = bed.api_posts("primary")
    assert call.headers["x-api-key"] == API_KEY
    assert not bed.api_posts("backup")
    # its HEAD preflight passed through and got no body (mitmproxy would log unexpected data)
    assert [c.method for c in bed.provider.calls_to("primary")].count("HEAD") >= 1
    assert "Unexpected data" not in bed.mitm.log_since(mark)
    # routed: Switchyard took the answer (its first attempt), not mitmproxy alone
    log = bed.mitm.wait_for_log("switchyard.committed route=reverse-messages upstream=primary attempt=1 ", mark)
    assert log.count("switchyard.committed ") == 1 and "switchyard.attempt_failed" not in log


def test_an_overload_before_output_is_retried_by_switchyard_not_by_claude_code(bed: ClientBed) -> None:
    bed.provider.script("primary", overloaded())
    mark = bed.mitm.log_mark()
    done = run_claude(bed, bed.through_switchyard(), "retry")
    answered(done, "primary")
    assert len(bed.api_posts("primary")) == 2 and not bed.api_posts("backup")
    assert bed.client_requests(mark, "/v1/messages") == 1  # Claude Code asked once
    log = bed.mitm.wait_for_log("switchyard.retry_answered", mark)
    assert ("route=reverse-messages upstream=primary attempt=1 phase=staging type=overloaded_error event=error "
            "decision=retry") in log


def test_a_persistent_overload_falls_back_to_the_backup(bed: ClientBed) -> None:
    bed.provider.script("primary", *[overloaded()] * PERSISTENT)
    mark = bed.mitm.log_mark()
    done = run_claude(bed, bed.through_switchyard(), "fallback")
    answered(done, "backup")
    assert len(bed.api_posts("primary")) == 2 and len(bed.api_posts("backup")) == 1
    assert bed.client_requests(mark, "/v1/messages") == 1
    assert "x-api-key" not in bed.api_posts("backup")[0].headers  # another origin: never the client's key
    bed.mitm.wait_for_log("switchyard.fallback_answered route=reverse-messages upstream=backup attempt=3", mark)


def test_without_switchyard_claude_code_retries_by_itself_and_a_persistent_overload_ends_it(bed: ClientBed) -> None:
    bed.provider.script("primary", overloaded())
    done = run_claude(bed, bed.straight(), "direct-once")
    answered(done, "primary")
    assert len(bed.api_posts("primary")) == 2  # its own retry: the provider saw both

    bed.provider.reset()
    bed.provider.script("primary", *[overloaded()] * PERSISTENT)
    done = run_claude(bed, bed.straight(), "direct-persistent")
    assert done.returncode != 0, done.stdout[-3000:]
    assert wire.answer_text("primary") not in done.stdout
    assert "API returned an empty or malformed response" in done.stdout + done.stderr
    assert 2 < len(bed.api_posts("primary")) < PERSISTENT  # a few tries of its own, then it gave up


def test_claude_code_honours_https_proxy(bed: ClientBed) -> None:
    """Proxy mode: no base URL, HTTPS_PROXY, and mitmproxy's CA in NODE_EXTRA_CA_CERTS.  Its
    other requests to api.anthropic.com (settings, policy limits) match no route and pass
    through untouched (here they fail: the machine has no route to it)."""
    bed.provider.script("primary", overloaded())
    mark = bed.mitm.log_mark()
    done = run_claude(bed, None, "proxy", {"HTTPS_PROXY": bed.mitm.proxy_url, "NODE_EXTRA_CA_CERTS": str(bed.ca_file)})
    answered(done, "primary")
    assert len(bed.api_posts("primary")) == 2
    bed.mitm.wait_for_log("switchyard.retry_answered route=proxy-messages upstream=primary attempt=2", mark)


def test_a_primary_that_said_to_wait_is_asked_once_and_later_prompts_go_straight_to_the_backup(tmp_path: Path) -> None:
    """Anthropic's 429 `rate_limit_error` with a Retry-After: the first prompt falls back
    to the backup; the next prompts skip the primary until the delay has passed
    (outage memory), each costing no failed attempt.  A bed of its own: the memory
    must not reach the other tests."""
    beds = client_bed_for(tmp_path)
    own = next(beds)
    try:
        limited = Reply.json(429, wire.error_body("anthropic-messages", 429, "Number of requests has exceeded your rate limit"),
                             headers={"retry-after": "60"})
        own.provider.script("primary", *[limited] * 5)
        mark = own.mitm.log_mark()
        for prompt in range(3):
            answered(run_claude(own, own.through_switchyard(), f"limited-{prompt}"), "backup")
        assert len(own.api_posts("primary")) == 1 and len(own.api_posts("backup")) == 3
        log = own.mitm.wait_for_log("switchyard.skipped route=reverse-messages upstream=primary", mark)
        assert log.count("switchyard.skipped route=reverse-messages upstream=primary") == 2
        assert log.count("switchyard.attempt_failed") == 1
    finally:
        beds.close()
