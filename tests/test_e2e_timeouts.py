"""Time-bound behaviours through a real mitmdump: silent upstreams, stalls, keepalives, staging bound.

No test asserts how fast anything was; timings here only choose which rule applies
(a route with sub-second timeouts), and every wait is bounded.
"""

from __future__ import annotations

import json

from tests.conftest import Env
from tests.support import wire
from tests.support.fake_provider import Reply

BACKUP_BYTES = b"".join(wire.chat_stream(wire.answer_text("backup")))


def url(env: Env, prefix: str) -> str:
    return env.provider.url(prefix, "/v1/chat/completions")


def test_no_response_headers_in_time_moves_to_the_next_upstream_at_once(env: Env) -> None:
    slow = Reply.sse(*wire.chat_stream("too late"))
    slow.delay_headers_s = 3.0
    env.provider.script("slow", slow)
    result = env.curl(url(env, "slow"), env.chat_body())
    assert result.body == BACKUP_BYTES
    # a timeout skips the rest of the same upstream's budget when there is a next upstream
    assert [c.upstream for c in env.provider.calls] == ["slow", "backup"]


def test_no_output_in_time_is_a_retryable_failure(env: Env) -> None:
    env.provider.script("slow", Reply.sse(wire.CHAT_ROLE, 3.0, *wire.chat_stream("too late")))
    mark = env.mitm.log_mark()
    result = env.curl(url(env, "slow"), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert b"too late" not in result.body
    assert [c.upstream for c in env.provider.calls] == ["slow", "backup"]
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert "upstream=slow attempt=1 phase=staging status=504 event=timeout decision=next_upstream" in log


def test_stall_after_output_ends_with_an_in_band_error(env: Env) -> None:
    content = wire.chat_chunk({"content": "started"})
    env.provider.script("slow", Reply.sse(wire.CHAT_ROLE, content, 5.0, wire.CHAT_DONE))
    result = env.curl(url(env, "slow"), env.chat_body())
    assert result.body.startswith(wire.CHAT_ROLE + content)
    error = json.loads(result.body[len(wire.CHAT_ROLE + content):].removeprefix(b"data: "))["error"]
    assert error["code"] == "stream_stalled"
    assert [c.upstream for c in env.provider.calls] == ["slow"]  # never replayed after output


def test_long_pre_answer_phase_sends_headers_and_keepalive_comments(env: Env) -> None:
    env.provider.script("keepalive", Reply.sse(wire.CHAT_ROLE, 0.7, wire.chat_error(503, "overloaded")))
    env.provider.script("backup", Reply.sse(0.5, *wire.chat_stream(wire.answer_text("backup"))))
    result = env.curl(url(env, "keepalive"), env.chat_body())
    assert result.status == 200
    assert result.headers["x-switchyard-upstream"] == "pending"
    keepalive = b": switchyard keepalive\n\n"
    assert result.body.startswith(keepalive)
    announce = b": switchyard upstream=backup attempts=2\n\n"
    head, sep, answer = result.body.partition(announce)
    assert sep and answer == BACKUP_BYTES
    assert head == keepalive * head.count(keepalive)  # only comments before the answer


def test_final_failure_after_keepalive_arrives_as_an_in_band_error(env: Env) -> None:
    body = {"error": {"message": "Overloaded everywhere", "type": "server_error"}}
    env.provider.script("keepalive", Reply.sse(0.5, wire.chat_error(503, "first")))
    slow_503 = Reply.json(503, body)
    slow_503.delay_headers_s = 0.5
    env.provider.script("backup", slow_503)
    result = env.curl(url(env, "keepalive"), env.chat_body())
    assert result.status == 200
    frames = [f for f in result.body.split(b"\n\n") if f]
    assert all(f == b": switchyard keepalive" for f in frames[:-1])
    error = json.loads(frames[-1].removeprefix(b"data: "))["error"]
    assert error["message"] == "Overloaded everywhere"
    assert [c.upstream for c in env.provider.calls] == ["keepalive", "backup"]


def test_a_fatal_failure_after_keepalive_keeps_the_providers_type_and_code_in_band(env: Env) -> None:
    """A bad key must not read as a server error worth retrying."""
    body = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                      "param": None, "code": "invalid_api_key"}}
    late = Reply.json(401, body)
    late.delay_headers_s = 0.5
    env.provider.script("keepalive", late)
    result = env.curl(url(env, "keepalive"), env.chat_body())
    frames = [f for f in result.body.split(b"\n\n") if f]
    assert frames[0] == b": switchyard keepalive"
    assert json.loads(frames[-1].removeprefix(b"data: ")) == body
    assert [c.upstream for c in env.provider.calls] == ["keepalive"]  # fatal: nothing else tried


def test_a_fatal_failure_naming_no_type_after_keepalive_gets_the_type_its_status_stands_for(env: Env) -> None:
    late = Reply.json(401, {"error": "Invalid API key"})
    late.delay_headers_s = 0.5
    env.provider.script("keepalive", late)
    result = env.curl(url(env, "keepalive"), env.chat_body())
    frames = [f for f in result.body.split(b"\n\n") if f]
    error = json.loads(frames[-1].removeprefix(b"data: "))["error"]
    assert (error["type"], error["message"]) == ("invalid_request_error", "Invalid API key")
    assert [c.upstream for c in env.provider.calls] == ["keepalive"]


def test_every_upstream_ending_before_output_after_keepalive_is_an_in_band_error(env: Env) -> None:
    env.provider.script("keepalive", Reply.sse(0.5, wire.CHAT_ROLE))
    env.provider.script("backup", Reply.sse(wire.CHAT_ROLE))
    result = env.curl(url(env, "keepalive"), env.chat_body())
    assert result.status == 200
    assert wire.CHAT_ROLE not in result.body  # neither empty answer is passed off as the answer
    frames = [f for f in result.body.split(b"\n\n") if f]
    assert all(f == b": switchyard keepalive" for f in frames[:-1])
    error = json.loads(frames[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_unavailable"
    assert "before any output" in error["message"]
    assert [c.upstream for c in env.provider.calls] == ["keepalive", "backup"]


def test_staging_past_the_limit_commits_and_passes_through(env: Env) -> None:
    # lifecycle frames only, more than the route's 300-byte staging limit: replay is no longer safe
    filler = [wire.chat_chunk({"role": "assistant", "content": ""}) for _ in range(3)]
    sent = [*filler, wire.chat_error(503, "late failure"), wire.CHAT_DONE]
    env.provider.script("tiny", Reply.sse(*sent))
    result = env.curl(url(env, "tiny"), env.chat_body())
    assert result.body == b"".join(sent)
    assert [c.upstream for c in env.provider.calls] == ["tiny"]


def test_non_streaming_requests_are_bounded_by_request_timeout_not_headers_timeout(env: Env) -> None:
    slow = Reply.json(200, wire.chat_completion("worth the wait"))
    slow.delay_headers_s = 1.0  # past the route's headers_timeout_s (0.5), within request_timeout_s
    env.provider.script("slow", slow)
    result = env.curl(url(env, "slow"), env.chat_body(stream=False))
    assert json.loads(result.body)["choices"][0]["message"]["content"] == "worth the wait"
    assert [c.upstream for c in env.provider.calls] == ["slow"]


def test_a_pause_before_output_longer_than_idle_timeout_is_thinking_not_a_failure(env: Env) -> None:
    """A reasoning model may say nothing for minutes after its first (lifecycle)
    frame: `idle_timeout_s` bounds silence after output only."""
    env.provider.script("thinking", Reply.sse(wire.CHAT_ROLE, 1.0, *wire.chat_stream("thought it through")[1:]))
    result = env.curl(url(env, "thinking"), env.chat_body())
    head, sep, answer = result.body.partition(b": switchyard upstream=thinking attempts=1\n\n")
    assert sep and head.startswith(b": switchyard keepalive\n\n")
    assert answer == b"".join(wire.chat_stream("thought it through"))
    assert [c.upstream for c in env.provider.calls] == ["thinking"]


def test_silence_before_output_behind_keepalives_is_bounded_by_request_timeout(env: Env) -> None:
    """Behind the keepalive comments a client never times out on its own, so a
    silent upstream is given up on after `request_timeout_s` (first_output_timeout_s off)."""
    env.provider.script("thinking", Reply.sse(wire.CHAT_ROLE, 30.0, *wire.chat_stream("never")))
    mark = env.mitm.log_mark()
    result = env.curl(url(env, "thinking"), env.chat_body())
    head, sep, answer = result.body.partition(b": switchyard upstream=backup attempts=2\n\n")
    assert sep and answer == BACKUP_BYTES
    assert head.startswith(b": switchyard keepalive\n\n")
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert 'upstream=thinking attempt=1 phase=staging status=504 event=timeout decision=next_upstream message="no output within 2s"' in log


def test_a_non_streaming_body_after_keepalive_headers_is_reported_in_band(env: Env) -> None:
    late = Reply.json(200, wire.chat_completion("not a stream"))
    late.delay_headers_s = 0.5
    env.provider.script("keepalive", late)
    result = env.curl(url(env, "keepalive"), env.chat_body())
    frames = [f for f in result.body.split(b"\n\n") if f]
    assert frames[0] == b": switchyard keepalive"
    assert frames[-2] == b": switchyard upstream=keepalive attempts=1"
    assert json.loads(frames[-1].removeprefix(b"data: "))["error"]["code"] == "non_streaming_answer"
