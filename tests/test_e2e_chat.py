"""Chat Completions through a real mitmdump, real loopback upstreams, real clients.

Each test scripts what the upstreams answer and asserts what a user would
notice: the exact bytes the client received, which upstreams were called and
how often, and what was logged.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import openai
import pytest

from tests.conftest import BACKUP_SECRET, BODY_MARKER, CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import RESET, Reply
from tests.support.scripted_server import LAST_CHUNK, WAIT_S, Server, answering, dechunk, response

HEADLINE = wire.chat_error(503, "provider overloaded")  # DESIGN's headline frame
BACKUP_BYTES = b"".join(wire.chat_stream(wire.answer_text("backup")))
PRIMARY_BYTES = b"".join(wire.chat_stream(wire.answer_text("primary")))


def openai_client(env: Env, *, reverse: bool = False, prefix: str = "primary") -> openai.OpenAI:
    if reverse:
        return openai.OpenAI(api_key=CLIENT_SECRET, base_url=f"{env.mitm.reverse_url}/{prefix}/v1", max_retries=0)
    return openai.OpenAI(
        api_key=CLIENT_SECRET,
        base_url=env.provider.url(prefix, "/v1"),
        max_retries=0,
        http_client=openai.DefaultHttpxClient(proxy=env.mitm.proxy_url, trust_env=False),
    )


def stream_text(client: openai.OpenAI) -> str:
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": f"hi {BODY_MARKER}"}], stream=True
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def chat_url(env: Env, prefix: str = "primary") -> str:
    return env.provider.url(prefix, "/v1/chat/completions")


# --- the headline scenario ------------------------------------------------------


def test_headline_first_frame_503_falls_back_openai_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    assert stream_text(openai_client(env)) == wire.answer_text("backup")
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary", "backup"]


def test_headline_curl_gets_exactly_the_backup_stream(env: Env) -> None:
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.status == 200
    assert result.body == BACKUP_BYTES
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert "x-switchyard-provisional" not in result.headers
    assert b"provider overloaded" not in result.body
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert result.headers["x-switchyard-attempts"] == "3"


def test_reverse_mode_falls_back_openai_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    assert stream_text(openai_client(env, reverse=True)) == wire.answer_text("backup")
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary", "backup"]


def test_retry_on_same_upstream_succeeds_without_fallback(env: Env) -> None:
    env.provider.script("primary", Reply.sse(HEADLINE))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == PRIMARY_BYTES
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary"]
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "2"


@pytest.mark.parametrize(
    "frame",
    [
        wire.chat_error(429, "rate limited"),
        wire.chat_error(500, "boom"),
        wire.chat_error(502, "bad gateway"),
        wire.chat_error(504, "timeout"),
        wire.chat_error("503", "numeric string code"),
        wire.chat_error("server_error", "string code"),
        wire.chat_error(None, "The server had an error while processing your request. Sorry about that!"),
        wire.data({"error": {"code": 429, "message": "Provider returned error"}, "choices": [{"delta": {"content": ""}, "finish_reason": "error"}]}),
    ],
    ids=["429", "500", "502", "504", "code-503-string", "server_error", "message-only", "openrouter-finish-error"],
)
def test_retryable_first_frame_errors_fall_back(env: Env, frame: bytes) -> None:
    env.provider.script("primary", Reply.sse(frame, wire.CHAT_DONE), Reply.sse(frame, wire.CHAT_DONE))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary", "backup"]


def test_role_frame_then_error_falls_back_without_duplicating_the_role(env: Env) -> None:
    failing = Reply.sse(wire.CHAT_ROLE, wire.chat_error(503, "overloaded"))
    env.provider.script("primary", failing, Reply.sse(wire.CHAT_ROLE, wire.chat_error(503, "overloaded")))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert result.body.count(b'"role":"assistant"') == 1


def test_role_frame_then_error_openai_sdk(env: Env) -> None:
    env.provider.script("primary", *[Reply.sse(wire.CHAT_ROLE, wire.chat_error(429, "slow down"))] * 2)
    assert stream_text(openai_client(env)) == wire.answer_text("backup")


# --- what must not fall back ----------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        wire.chat_error(401, "Incorrect API key provided"),
        wire.chat_error(403, "forbidden"),
        wire.chat_error(400, "bad request"),
        wire.chat_error("invalid_request_error", "Invalid 'messages'", type="invalid_request_error"),
        wire.chat_error(418, "I'm a teapot"),
        wire.chat_error("teapot_code", "an unknown string code"),
    ],
    ids=["401", "403", "400", "invalid_request_error", "418", "unknown-string-code"],
)
def test_fatal_errors_are_returned_as_sent(env: Env, frame: bytes) -> None:
    sent = [wire.CHAT_ROLE, frame, wire.CHAT_DONE]
    env.provider.script("primary", Reply.sse(*sent))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.status == 200
    assert result.body == b"".join(sent)
    assert [c.upstream for c in env.provider.calls] == ["primary"]
    assert result.headers["x-switchyard-upstream"] == "primary"


def test_fatal_sse_error_raises_in_openai_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(wire.chat_error(401, "Incorrect API key provided")))
    with pytest.raises(openai.APIError, match="Incorrect API key"):
        stream_text(openai_client(env))
    assert [c.upstream for c in env.provider.calls] == ["primary"]


def test_error_after_content_is_never_retried(env: Env) -> None:
    mark = env.mitm.log_mark()
    content = wire.chat_chunk({"content": "Half an ans"})
    error = wire.chat_error("server_is_overloaded", "Our servers are currently overloaded.")
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, content, error, wire.CHAT_DONE))
    result = env.curl(chat_url(env), env.chat_body())
    # forwarded, with the capacity code rewritten so clients treat it as a server error
    assert result.body == wire.CHAT_ROLE + content + error.replace(b'"server_is_overloaded"', b'"server_error"') + wire.CHAT_DONE
    assert [c.upstream for c in env.provider.calls] == ["primary"]
    log = env.mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    assert "route=chat upstream=primary api=openai-chat" in log


def test_valid_stream_passes_through_byte_identical(env: Env) -> None:
    frames = wire.chat_stream("A perfectly normal answer, with “unicode” ✓.")
    env.provider.script("primary", Reply.sse(*frames, headers={"x-request-id": "req_abc"}))
    mark = env.mitm.log_mark()
    result = env.curl(chat_url(env), env.chat_body())
    # mitmproxy's own line, logged once the first token is out (deferred, not dropped)
    env.mitm.wait_for_log("Streaming response from 127.0.0.1.", mark)
    assert result.body == b"".join(frames)
    assert result.headers["x-request-id"] == "req_abc"
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert [c.upstream for c in env.provider.calls] == ["primary"]


def test_frames_split_across_writes_pass_through_byte_identical(env: Env) -> None:
    raw = b"".join(wire.chat_stream("split into pieces"))
    pieces = [raw[i:i + 7] for i in range(0, len(raw), 7)]
    env.provider.script("primary", Reply.sse(*pieces))
    assert env.curl(chat_url(env), env.chat_body()).body == raw


# --- HTTP-level failures ----------------------------------------------------------


def test_plain_http_503_falls_back(env: Env) -> None:
    body = {"error": {"message": "That model is currently overloaded with other requests.", "type": "server_error", "param": None, "code": None}}
    env.provider.script("primary", Reply.json(503, body), Reply.json(503, body))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary", "backup"]


def test_overload_text_in_http_400_falls_back(env: Env) -> None:
    body = {"error": {"message": "Our servers are currently overloaded. Please try again later.", "type": "invalid_request_error"}}
    env.provider.script("primary", Reply.json(400, body), Reply.json(400, body))
    assert env.curl(chat_url(env), env.chat_body()).body == BACKUP_BYTES


def test_http_401_is_returned_as_sent(env: Env) -> None:
    body = {"error": {"message": "Incorrect API key provided: sk-...3d.", "type": "invalid_request_error", "code": "invalid_api_key"}}
    env.provider.script("primary", Reply.json(401, body, headers={"x-request-id": "req_401"}))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.status == 401
    assert json.loads(result.body) == body
    assert result.headers["x-request-id"] == "req_401"
    assert result.headers["content-length"] == str(len(result.body))
    assert "x-switchyard-provisional" not in result.headers  # the relay's head for mitmproxy never shows
    assert [c.upstream for c in env.provider.calls] == ["primary"]


def test_an_error_body_that_breaks_off_reaches_the_client_broken_off(env: Env) -> None:
    partial = b'{"error": {"message": "Invalid value for messages[0]", "type": "invalid_req'
    env.provider.script("primary", Reply(400, [partial, RESET], content_type="application/json"))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.status == 400
    assert result.body == partial
    assert result.returncode != 0  # curl saw the answer end before it was whole
    assert "content-length" not in result.headers


def test_retry_after_is_honoured_on_the_same_upstream(env: Env) -> None:
    env.provider.script("primary", Reply.json(429, {"error": {"message": "rate limited", "type": "rate_limit_error"}}, headers={"retry-after-ms": "200"}))
    mark = env.mitm.log_mark()
    started = time.monotonic()
    result = env.curl(chat_url(env), env.chat_body())
    elapsed = time.monotonic() - started
    assert result.body == PRIMARY_BYTES
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary"]
    assert elapsed >= 0.2  # waited at least what the upstream asked for (a lower bound only)
    # the same upstream answered its retry: not a fallback
    assert "switchyard.retry_answered route=chat upstream=primary attempt=2" in env.mitm.wait_for_log(
        "switchyard.retry_answered", mark)


def test_retry_after_longer_than_max_backoff_moves_on(env: Env) -> None:
    env.provider.script("primary", Reply.json(429, {"error": {"message": "rate limited"}}, headers={"retry-after": "30"}))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert [c.upstream for c in env.provider.calls] == ["primary", "backup"]


def test_x_should_retry_false_wins_over_status(env: Env) -> None:
    env.provider.script("primary", Reply.json(503, {"error": {"message": "do not"}}, headers={"x-should-retry": "false"}))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.status == 503
    assert [c.upstream for c in env.provider.calls] == ["primary"]


# --- exhaustion and transport ---------------------------------------------------------


def test_every_attempt_failing_in_stream_returns_the_last_as_sent(env: Env) -> None:
    first = [wire.CHAT_ROLE, wire.chat_error(503, "first"), wire.CHAT_DONE]
    last = [wire.CHAT_ROLE, wire.chat_error(503, "last"), wire.CHAT_DONE]
    env.provider.script("solo", Reply.sse(*first), Reply.sse(*last))
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.status == 200
    assert result.body == b"".join(last)
    assert result.headers["x-switchyard-attempts"] == "2"


@pytest.mark.parametrize("nothing", [wire.CHAT_ROLE, wire.CHAT_DONE, b""], ids=["role-then-eof", "done-only", "empty"])
def test_every_attempt_ending_before_output_is_a_502_not_an_empty_success(env: Env, nothing: bytes) -> None:
    """Forwarded as sent, a stream that ended before any output reads as a successful
    empty answer (SDKs raise nothing); the client gets Switchyard's own error instead."""
    env.provider.script("solo", Reply.sse(nothing), Reply.sse(nothing))
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.status == 502
    error = json.loads(result.body)["error"]
    assert error["code"] == "upstream_unavailable"
    assert "before any output" in error["message"]
    assert result.headers["x-switchyard-attempts"] == "2"
    assert [c.upstream for c in env.provider.calls] == ["solo", "solo"]


def test_the_openai_sdk_raises_when_every_attempt_ends_before_output(env: Env) -> None:
    env.provider.script("solo", Reply.sse(wire.CHAT_ROLE), Reply.sse(wire.CHAT_ROLE))
    with pytest.raises(openai.InternalServerError) as raised:
        stream_text(openai_client(env, prefix="solo"))
    assert raised.value.status_code == 502


def test_the_last_failure_that_said_something_is_forwarded_when_the_last_attempt_said_nothing(env: Env) -> None:
    said = [wire.CHAT_ROLE, wire.chat_error(503, "provider overloaded"), wire.CHAT_DONE]
    env.provider.script("solo", Reply.sse(*said), Reply.sse(wire.CHAT_ROLE))
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.status == 200
    assert result.body == b"".join(said)
    assert result.headers["x-switchyard-attempts"] == "2"


def test_every_attempt_failing_over_http_returns_the_last_status_and_body(env: Env) -> None:
    env.provider.script("solo", Reply.json(502, {"error": {"message": "first"}}), Reply.json(503, {"error": {"message": "last"}}))
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.status == 503
    assert json.loads(result.body) == {"error": {"message": "last"}}


def test_connection_refused_falls_back(env: Env) -> None:
    result = env.curl(chat_url(env, "deadfirst"), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert [c.upstream for c in env.provider.calls] == ["backup"]


def test_no_upstream_answering_gives_a_502_in_the_api_shape(env: Env) -> None:
    result = env.curl(chat_url(env, "unreachable"), env.chat_body())
    assert result.status == 502
    error = json.loads(result.body)["error"]
    assert error["code"] == "upstream_unavailable"
    assert "connection refused" in error["message"]
    assert result.headers["x-switchyard-attempts"] == "2"


def test_reset_before_output_falls_back(env: Env) -> None:
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, 0.05, RESET), Reply.sse(RESET))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == BACKUP_BYTES


def test_a_reset_after_the_request_was_sent_is_logged_in_that_phase_with_no_status_nobody_sent(env: Env) -> None:
    """The upstream took the request and dropped the connection before its headers: no
    upstream answered 502, and it was not a connect failure."""
    mark = env.mitm.log_mark()
    env.provider.script("primary", Reply.sse(RESET), Reply.sse(RESET))
    assert env.curl(chat_url(env), env.chat_body()).body == BACKUP_BYTES
    assert len(env.provider.calls_to("primary")) == 2  # both got the request
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert ('upstream=primary attempt=1 phase=headers event=transport decision=retry delay_s=') in log
    assert 'upstream=primary attempt=2 phase=headers event=transport decision=next_upstream message="connection reset' in log
    assert "status=502" not in log


def test_a_refused_connection_is_logged_as_a_connect_failure_with_no_status(env: Env) -> None:
    mark = env.mitm.log_mark()
    assert env.curl(chat_url(env, "deadfirst"), env.chat_body()).status == 200
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert ('upstream=dead attempt=1 phase=connect event=transport decision=next_upstream '
            'message="connection refused or unreachable"') in log


def test_empty_stream_done_only_falls_back(env: Env) -> None:
    env.provider.script("primary", *[Reply.sse(wire.CHAT_DONE)] * 2)
    assert env.curl(chat_url(env), env.chat_body()).body == BACKUP_BYTES


def test_content_only_in_an_unterminated_last_frame_is_no_output_and_falls_back(env: Env) -> None:
    """The SDKs drop an event that never got its blank line: it was no answer."""
    tail = wire.chat_chunk({"content": "lost"}).removesuffix(b"\n\n")
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, tail), Reply.sse(wire.CHAT_ROLE, tail))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary", "backup"]


def test_cut_after_output_ends_with_an_in_band_error(env: Env) -> None:
    content = wire.chat_chunk({"content": "partial"})
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, content))  # EOF, no finish_reason or [DONE]
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body.startswith(wire.CHAT_ROLE + content)
    tail = result.body[len(wire.CHAT_ROLE + content):]
    assert json.loads(tail.removeprefix(b"data: "))["error"]["code"] == "stream_cut"
    assert [c.upstream for c in env.provider.calls] == ["primary"]


def test_with_usage_asked_for_a_cut_after_the_finish_chunk_ends_with_an_in_band_error(env: Env) -> None:
    """The answer's text is whole, but the usage chunk the client asked for never came:
    that must not look like a clean end (the client's token count would be lost silently)."""
    sent = wire.chat_stream("all of it")[:-2]  # role, content, finish; no usage chunk, no [DONE]
    env.provider.script("solo", Reply.sse(*sent))
    result = env.curl(chat_url(env, "solo"), env.chat_body(stream_options={"include_usage": True}))
    assert result.body.startswith(b"".join(sent))
    error = json.loads(result.body[len(b"".join(sent)):].removeprefix(b"data: "))["error"]
    assert error["code"] == "stream_cut"
    assert [c.upstream for c in env.provider.calls] == ["solo"]


def test_with_usage_asked_for_a_usage_chunk_cut_before_its_blank_line_is_not_the_end(env: Env) -> None:
    """Clients act on an event at its blank line: a usage chunk without one never reached them."""
    frames = wire.chat_stream("all of it")
    sent, usage = frames[:-2], frames[-2].removesuffix(b"\n\n")
    env.provider.script("solo", Reply.sse(*sent, usage))
    result = env.curl(chat_url(env, "solo"), env.chat_body(stream_options={"include_usage": True}))
    assert result.body.startswith(b"".join(sent))
    error = json.loads(result.body[len(b"".join(sent)):].removeprefix(b"data: "))["error"]
    assert error["code"] == "stream_cut"


def test_without_usage_asked_for_a_stream_that_ends_after_the_finish_chunk_is_whole(env: Env) -> None:
    sent = wire.chat_stream("all of it")[:-2]
    env.provider.script("solo", Reply.sse(*sent))
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.body == b"".join(sent)


# --- the request the upstreams receive -----------------------------------------------


def test_backup_gets_its_own_credentials_and_the_body_intact(env: Env) -> None:
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    body = env.chat_body(temperature=0.25)
    env.curl(chat_url(env), body, headers={"x-api-key": "client-x-api-key", "Cookie": "session=client"})
    primary, _, backup = env.provider.calls
    assert primary.headers["Authorization"] == f"Bearer {CLIENT_SECRET}"
    assert primary.body == body  # byte for byte
    assert backup.headers["Authorization"] == f"Bearer {BACKUP_SECRET}"
    assert backup.headers["X-Team"] == "dev"
    assert "x-api-key" not in {k.lower() for k in backup.headers}
    assert "cookie" not in {k.lower() for k in backup.headers}
    assert backup.json() == {**json.loads(body), "model": "backup-model"}
    assert backup.port == env.provider.ports[1]


def test_upstream_with_unset_variable_is_skipped_with_one_warning(env: Env) -> None:
    log = env.mitm.log()
    assert log.count("upstream 'ghost' skipped: ${SWY_TEST_UNSET_VARIABLE} is not set") == 1
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    env.curl(chat_url(env), env.chat_body())
    assert "ghost" not in [c.upstream for c in env.provider.calls]


# --- non-streaming ----------------------------------------------------------------


def test_non_streaming_json_error_in_200_falls_back_openai_sdk(env: Env) -> None:
    error = {"error": {"code": 503, "message": "provider overloaded"}}
    env.provider.script("primary", Reply.json(200, error), Reply.json(200, error))
    env.provider.script("backup", Reply.json(200, wire.chat_completion("non-streamed backup answer")))
    completion = openai_client(env).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "non-streamed backup answer"
    assert [c.upstream for c in env.provider.calls] == ["primary", "primary", "backup"]


def test_non_streaming_success_passes_through(env: Env) -> None:
    answer = wire.chat_completion("plain answer")
    env.provider.script("primary", Reply.json(200, answer))
    result = env.curl(chat_url(env), env.chat_body(stream=False))
    assert result.status == 200
    assert json.loads(result.body) == answer
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["content-length"] == str(len(result.body))
    assert "x-switchyard-provisional" not in result.headers


# --- the client leaving ---------------------------------------------------------------


def test_client_disconnect_cancels_the_upstream_request(env: Env) -> None:
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, 30.0, *wire.chat_stream("never")))
    gone = env.curl(chat_url(env), env.chat_body(), max_time=1)  # curl gives up after 1 s
    assert gone.returncode == 28 and gone.body == b""
    deadline = time.monotonic() + 10
    while env.provider.cancelled < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert env.provider.cancelled == 1
    assert env.provider.finished == 0
    # the proxy is healthy afterwards
    assert env.curl(chat_url(env), env.chat_body()).body == PRIMARY_BYTES


# --- requests that match no route -----------------------------------------------------


def test_unmatched_requests_are_not_touched(env: Env) -> None:
    env.provider.script("other", Reply.json(503, {"error": {"message": "not ours"}}))
    result = env.curl(env.provider.url("other", "/v1/chat/completions"), env.chat_body())
    assert result.status == 503
    assert "x-switchyard-upstream" not in result.headers
    assert [c.upstream for c in env.provider.calls] == ["other"]


# --- logs -----------------------------------------------------------------------------


def test_log_lines_name_each_decision_and_never_a_secret(env: Env) -> None:
    mark = env.mitm.log_mark()
    env.provider.script(
        "primary",
        Reply.sse(HEADLINE, headers={"x-request-id": "req_first"}),
        Reply.json(503, {"error": {"message": f"echoing {CLIENT_SECRET}?", "type": "server_error"}}, headers={"x-request-id": "req_second"}),
    )
    env.curl(chat_url(env), env.chat_body())
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert ("switchyard.attempt_failed route=chat upstream=primary attempt=1 phase=staging status=503 "
            "event=chunk decision=retry") in log
    assert 'message="provider overloaded" request_id=req_first' in log
    assert "attempt=2 phase=headers status=503" in log and "request_id=req_second" in log
    assert "switchyard.fallback_answered route=chat upstream=backup attempt=3" in log
    assert "echoing [redacted]?" in log  # an upstream echoing a credential does not leak it
    whole = env.mitm.log()
    for secret in (CLIENT_SECRET, BACKUP_SECRET, BODY_MARKER):
        assert secret not in whole


def test_a_key_echoed_across_the_message_length_cut_is_not_logged_in_part(env: Env) -> None:
    """Messages are cut to 300 characters before they are logged: the cut can fall
    inside an echoed key, and the part before the cut is a secret too."""
    echo = "Incorrect API key provided: ".ljust(290, ".") + CLIENT_SECRET  # the cut falls after "sk-client-"
    env.provider.script("solo", *[Reply.json(503, {"error": {"message": echo, "type": "server_error"}})] * 2)
    mark = env.mitm.log_mark()
    env.curl(chat_url(env, "solo"), env.chat_body())
    log = env.mitm.wait_for_log("decision=give_up", mark)
    assert log.count('.....[redacted]"') == 2
    assert CLIENT_SECRET[:10] not in env.mitm.log()


# --- compressed upstream answers --------------------------------------------------------


def test_gzip_encoded_answers_are_classified_and_relayed_decoded(env: Env) -> None:
    import gzip

    failing = Reply.sse(gzip.compress(HEADLINE), headers={"Content-Encoding": "gzip"})
    env.provider.script("primary", failing, failing)
    answer = wire.chat_completion("decoded")
    env.provider.script("backup", Reply.sse(gzip.compress(BACKUP_BYTES), headers={"Content-Encoding": "gzip"}))
    result = env.curl(chat_url(env), env.chat_body(), headers={"Accept-Encoding": "gzip, br, zstd"})
    assert result.body == BACKUP_BYTES
    assert "content-encoding" not in result.headers
    assert all(c.headers.get("Accept-Encoding") == "gzip, deflate" for c in env.provider.calls)
    env.provider.reset()
    env.provider.script("primary", Reply(200, [gzip.compress(json.dumps(answer).encode())], content_type="application/json", headers={"Content-Encoding": "gzip"}))
    result = env.curl(chat_url(env), env.chat_body(stream=False), headers={"Accept-Encoding": "gzip"})
    assert json.loads(result.body) == answer


# --- large bodies, narrowed retry_on, attribution ---------------------------------------


def test_request_bodies_larger_than_a_mebibyte_are_relayed_intact(env: Env) -> None:
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    big = env.chat_body(padding="x" * (3 * 1024 * 1024))
    result = env.curl(chat_url(env), big)
    assert result.body == BACKUP_BYTES
    primary, _, backup = env.provider.calls
    assert primary.body == big
    assert backup.json() == {**json.loads(big), "model": "backup-model"}


def test_a_narrowed_retry_on_still_falls_back_on_transport_failures(env: Env) -> None:
    result = env.curl(chat_url(env, "narrow"), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert result.headers["x-switchyard-upstream"] == "backup"


def test_exhaustion_names_the_upstream_whose_answer_the_client_got(env: Env) -> None:
    env.provider.script("deadlast", Reply.json(503, {"error": {"message": "overloaded"}}))
    result = env.curl(chat_url(env, "deadlast"), env.chat_body())
    assert result.status == 503 and json.loads(result.body) == {"error": {"message": "overloaded"}}
    assert result.headers["x-switchyard-upstream"] == "deadlast"  # not "dead", which never answered
    assert result.headers["x-switchyard-attempts"] == "2"


def test_cut_after_output_drops_an_unterminated_last_frame_before_the_error(env: Env) -> None:
    content = wire.chat_chunk({"content": "partial"})
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, content, b'data: {"id":"chatcmpl-1","choi'))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body.startswith(wire.CHAT_ROLE + content)
    error = json.loads(result.body[len(wire.CHAT_ROLE + content):].removeprefix(b"data: "))
    assert error["error"]["code"] == "stream_cut"


def test_the_clients_connection_stays_alive_across_streamed_answers(env: Env) -> None:
    """The relay's own connection closes after each answer; the client's must not."""
    env.provider.script("primary", Reply.sse(HEADLINE), Reply.sse(HEADLINE))
    url = chat_url(env)
    args = ["curl", "-sS", "-N", "--max-time", "20", "-x", env.mitm.proxy_url, "--noproxy", "",
            "-H", f"Authorization: Bearer {CLIENT_SECRET}", "-w", "\\nconnects=%{num_connects}\\n",
            "--data-binary", env.chat_body().decode(), url, "--next", "-sS", "-N", "-x", env.mitm.proxy_url,
            "--noproxy", "", "-w", "\\nconnects=%{num_connects}\\n", "--data-binary", env.chat_body().decode(), url]
    out = __import__("subprocess").run(args, capture_output=True, timeout=40).stdout
    first, second = out.split(b"connects=")[0:2]
    assert first.strip() == BACKUP_BYTES.strip()
    assert out.count(b"connects=1") == 1 and out.count(b"connects=0") == 1  # the second reused it
    assert second.split(b"\n", 1)[1].strip() == PRIMARY_BYTES.strip()


# --- malformed upstream frames ------------------------------------------------------------


def test_malformed_frames_before_output_fail_closed_and_reach_the_client_intact(env: Env) -> None:
    garbage = b"data: \xff\xfe\x00 not json {\n\n"
    sent = [wire.CHAT_ROLE, garbage, wire.chat_chunk({"content": "after"}), wire.CHAT_DONE]
    env.provider.script("primary", Reply.sse(*sent))
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == b"".join(sent)  # unknown counts as output: committed, never replayed
    assert [c.upstream for c in env.provider.calls] == ["primary"]


def test_malformed_frames_after_output_pass_through_and_the_proxy_stays_healthy(env: Env) -> None:
    sent = [wire.CHAT_ROLE, wire.chat_chunk({"content": "ok"}), b'data: {"error": [1, 2\n\n', b"\x00" * 64 + b"\n\n",
            b"data: " + b"[" * 5000 + b"\n\n", wire.chat_chunk({}, "stop"), wire.CHAT_DONE]
    env.provider.script("primary", Reply.sse(*sent))
    mark = env.mitm.log_mark()
    result = env.curl(chat_url(env), env.chat_body())
    assert result.body == b"".join(sent)
    assert env.curl(chat_url(env), env.chat_body()).body == PRIMARY_BYTES
    # both flows printed: every hook of both has run
    assert "Traceback" not in env.mitm.wait_for_log("<< 200", mark, count=2)


# --- the client leaving in each phase ---------------------------------------------------


def wait_until(predicate, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_client_leaving_after_output_cancels_the_upstream(env: Env) -> None:
    mark = env.mitm.log_mark()
    env.provider.script("primary", Reply.sse(wire.CHAT_ROLE, wire.chat_chunk({"content": "partial"}), 30.0, wire.CHAT_DONE))
    gone = env.curl(chat_url(env), env.chat_body(), max_time=1)
    assert gone.returncode == 28
    assert gone.body == wire.CHAT_ROLE + wire.chat_chunk({"content": "partial"})
    assert wait_until(lambda: env.provider.cancelled == 1)
    env.mitm.wait_for_log("switchyard.client_gone route=chat attempts=1", mark)
    assert env.curl(chat_url(env), env.chat_body()).body == PRIMARY_BYTES


def test_client_leaving_during_backoff_stops_the_retries(env: Env) -> None:
    mark = env.mitm.log_mark()
    env.provider.script("patient", *[Reply.sse(HEADLINE)] * 4)
    gone = env.curl(chat_url(env, "patient"), env.chat_body(), max_time=0.6)  # backoff is >= 1.1 s
    assert gone.returncode == 28 and gone.body == b""
    env.mitm.wait_for_log("switchyard.client_gone route=chat-patient attempts=1", mark)
    time.sleep(2.5)  # past when the retry would have gone out
    assert [c.upstream for c in env.provider.calls] == ["patient"]


def test_persistent_429_without_retry_after_is_bounded_and_backs_off(env: Env) -> None:
    mark = env.mitm.log_mark()
    env.provider.script("solo", *[Reply.json(429, {"error": {"message": "rate limited", "type": "rate_limit_error"}})] * 5)
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.status == 429
    assert [c.upstream for c in env.provider.calls] == ["solo", "solo"]  # retries: 1, then the last failure as sent
    log = env.mitm.wait_for_log("upstream=solo attempt=2", mark)
    first = next(line for line in log.splitlines() if "upstream=solo attempt=1" in line)
    assert "decision=retry delay_s=" in first  # a jittered wait, not a tight loop
    assert float(first.split("delay_s=")[1].split()[0]) > 0


def test_a_variable_in_an_upstreams_host_still_streams_and_shows(env: Env) -> None:
    mark = env.mitm.log_mark()
    env.provider.script("varhost", Reply.sse(HEADLINE))
    result = env.curl(chat_url(env, "varhost"), env.chat_body())
    assert result.body == BACKUP_BYTES
    assert result.headers["transfer-encoding"] == "chunked"  # streamed, not buffered whole
    # mitmdump prints the flow after every script's `response` hook: the display is done by then
    log = env.mitm.wait_for_log("<< 200", mark)
    assert "Addon error" not in log and "display_failed" not in log


def test_a_forwarded_failure_that_breaks_off_reaches_the_client_as_a_cut(env: Env) -> None:
    first = [wire.CHAT_ROLE, wire.chat_error(503, "first")]
    last = [wire.CHAT_ROLE, wire.chat_error(503, "last"), 0.05, RESET]
    env.provider.script("solo", Reply.sse(*first), Reply.sse(*last))
    result = env.curl(chat_url(env, "solo"), env.chat_body())
    assert result.body == wire.CHAT_ROLE + wire.chat_error(503, "last")
    assert result.returncode == 18  # curl: transfer closed with outstanding data, not a clean end
    assert env.curl(chat_url(env), env.chat_body()).body == PRIMARY_BYTES  # and the proxy is fine


# --- requests only a lenient parser takes ---------------------------------------------------


async def test_a_request_mitmproxy_accepts_reaches_the_upstream_as_the_client_sent_it(env: Env) -> None:
    """A raw UTF-8 query, a lowercase method, a control character in a header value:
    mitmproxy takes them, and so must the relay hop (the relay's parser is stricter)."""
    answer = b"".join(wire.chat_stream("as sent"))
    body = env.chat_body()
    async with Server(answering(response(headers=[("Content-Type", "text/event-stream")], body=answer))) as up:
        target = up.url("/solo/v1/chat/completions").encode() + "?user=José".encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", int(env.mitm.proxy_url.rsplit(":", 1)[1]))
        writer.write(b"post " + target + b" HTTP/1.1\r\nHost: " + target.split(b"/")[2] + b"\r\n"
                     b"X-Trace: a\x01b\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
            received = await reader.readuntil(LAST_CHUNK)  # streamed to the client, chunked
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert dechunk(received) == answer
    sent = up.requests[0]
    method, _, rest = sent.partition(b" ")
    assert method.upper() == b"POST"  # mitmproxy's own request.method is upper case
    assert rest.startswith("/solo/v1/chat/completions?user=José HTTP/1.1\r\n".encode())
    assert b"\r\nX-Trace: a\x01b\r\n" in sent
    assert sent.endswith(body)


def test_an_http_1_0_client_gets_the_stream_without_chunks(env: Env) -> None:
    """HTTP/1.0 has no chunked coding: the answer ends with the connection."""
    done = subprocess.run(["curl", "-sS", "-N", "--http1.0", "-D", "-", "--max-time", "20", "-x", env.mitm.proxy_url,
                           "--noproxy", "", "-H", "Content-Type: application/json", "--data-binary", "@-",
                           chat_url(env)], input=env.chat_body(), capture_output=True, timeout=30)
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    assert done.returncode == 0, done.stderr
    assert b"transfer-encoding" not in head.lower()
    assert body == PRIMARY_BYTES
