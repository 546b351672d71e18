"""Anthropic Messages (`/v1/messages`) through a real mitmdump, real loopback upstreams, real clients.

Each test scripts what the upstreams answer and asserts what a user would
notice: the exact bytes the client received, which upstreams were called and
how often, with which credentials, and what was logged.  Wire shapes come from
the providers' recorded and documented streams (the fixtures under tests/fixtures are
copied from it byte for byte, whitespace padding included).

The `messages` route: upstream `primary` is the request's own destination
(retries: 1, so two attempts), `backup` is on the fake provider's second port
and gets `x-api-key: <BACKUP_SECRET>` instead of the client's key.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from tests.conftest import BACKUP_SECRET, BODY_MARKER, CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import Reply

FIXTURES = Path(__file__).parent / "fixtures"

BACKUP_TEXT = wire.answer_text("backup")
BACKUP_BYTES = b"".join(wire.anthropic_stream(BACKUP_TEXT))
PRIMARY_BYTES = b"".join(wire.anthropic_stream(wire.answer_text("primary")))

MODEL = "claude-opus-4-7"
OVERLOADED_BODY = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'  #, exactly 75 bytes


def fixture_frames(name: str) -> list[bytes]:
    """A wire fixture split into its frames, each with its blank-line terminator."""
    raw = (FIXTURES / name).read_bytes()
    frames = [part + b"\n\n" for part in raw.split(b"\n\n") if part.strip()]
    assert b"".join(frames) == raw, f"{name} does not end with a blank line"
    return frames


OVERLOADED_FIRST = fixture_frames("anthropic_overloaded_error_first.sse")
ERROR_AFTER_PING = fixture_frames("anthropic_error_after_ping.sse")
REFUSAL = fixture_frames("anthropic_refusal_no_content.sse")
PADDED_NORMAL = fixture_frames("anthropic_normal_text.sse")  # text: [12345,67890]
ERROR_AFTER_TEXT = fixture_frames("anthropic_error_after_partial_text.sse")


def anthropic_client(env: Env) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=CLIENT_SECRET,
        base_url=env.provider.url("primary", ""),  # the SDK appends /v1/messages
        max_retries=0,
        http_client=anthropic.DefaultHttpxClient(proxy=env.mitm.proxy_url, trust_env=False),
    )


def stream_message(client: anthropic.Anthropic, collected: list[str] | None = None) -> tuple[str, anthropic.types.Message]:
    """Stream with the SDK; return the text it streamed and its final message."""
    text: list[str] = collected if collected is not None else []
    with client.messages.stream(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": f"say hello {BODY_MARKER}"}],
    ) as stream:
        for piece in stream.text_stream:
            text.append(piece)
        final = stream.get_final_message()
    return "".join(text), final


def messages_url(env: Env, prefix: str = "primary") -> str:
    return env.provider.url(prefix, "/v1/messages")


def messages_body() -> bytes:
    return json.dumps(
        {"model": MODEL, "max_tokens": 64, "stream": True,
         "messages": [{"role": "user", "content": f"say hello {BODY_MARKER}"}]}
    ).encode()


ANTHROPIC_HEADERS = {"x-api-key": CLIENT_SECRET, "anthropic-version": "2023-06-01"}


def curl_messages(env: Env):  # type: ignore[no-untyped-def]
    return env.curl(messages_url(env), messages_body(), headers=ANTHROPIC_HEADERS)


def header_values(call, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [value for key, value in call.headers.items() if key.lower() == name]


def upstreams(env: Env) -> list[str]:
    return [c.upstream for c in env.provider.calls]


def assert_backup_answer(text: str, final: anthropic.types.Message) -> None:
    assert text == BACKUP_TEXT
    assert [block.type for block in final.content] == ["text"]
    assert final.content[0].text == BACKUP_TEXT
    assert final.stop_reason == "end_turn"


# --- in-stream errors before output fall back ---------------------------------------


def test_overloaded_error_first_event_falls_back_anthropic_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOADED_FIRST), Reply.sse(*OVERLOADED_FIRST))
    assert_backup_answer(*stream_message(anthropic_client(env)))
    assert upstreams(env) == ["primary", "primary", "backup"]
    assert [c.path for c in env.provider.calls] == ["/v1/messages"] * 3


def test_overloaded_error_first_event_curl_gets_exactly_the_backup_stream(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOADED_FIRST), Reply.sse(*OVERLOADED_FIRST))
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == BACKUP_BYTES
    assert b"overloaded_error" not in result.body
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert result.headers["x-switchyard-attempts"] == "3"
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_overloaded_error_with_request_id_falls_back(env: Env) -> None:
    frames = fixture_frames("anthropic_overloaded_error_request_id.sse")
    env.provider.script("primary", Reply.sse(*frames), Reply.sse(*frames))
    assert curl_messages(env).body == BACKUP_BYTES
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_error_after_message_start_block_start_and_ping_falls_back(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*ERROR_AFTER_PING), Reply.sse(*ERROR_AFTER_PING))
    result = curl_messages(env)
    assert result.body == BACKUP_BYTES
    # the failed attempts' lifecycle frames (message_start, block start, ping) were discarded
    assert b"msg_01Pvyf26bY17RcjmWfJsXGBn" not in result.body
    assert result.body.count(b"event: message_start") == 1
    assert result.body.count(b"event: ping") == 1
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_error_after_ping_falls_back_anthropic_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*ERROR_AFTER_PING), Reply.sse(*ERROR_AFTER_PING))
    text, final = stream_message(anthropic_client(env))
    assert_backup_answer(text, final)
    assert final.id == "msg_1"  # backup's message, not the failed one's


# --- HTTP-level failures ---------------------------------------------------------------


def test_http_529_overloaded_falls_back(env: Env) -> None:
    assert len(OVERLOADED_BODY) == 75
    reply = lambda: Reply.json(529, OVERLOADED_BODY, headers={"request-id": "req_01RCc7MbLyQNtGKzBTv8VCep"})  # noqa: E731
    env.provider.script("primary", reply(), reply())
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == BACKUP_BYTES
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert result.headers["x-switchyard-attempts"] == "3"
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_http_529_overloaded_falls_back_anthropic_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.json(529, OVERLOADED_BODY), Reply.json(529, OVERLOADED_BODY))
    assert_backup_answer(*stream_message(anthropic_client(env)))
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_http_429_rate_limit_with_x_should_retry_true_falls_back(env: Env) -> None:
    body = {
        "type": "error",
        "error": {"type": "rate_limit_error",
                  "message": "This request would exceed your organization's rate limit of 20,000,000 prompt bytes per hour. Please try again later."},
        "request_id": "req_011CYK5n67SytMUxm8WMZUWY",
    }
    reply = lambda: Reply.json(429, body, headers={"x-should-retry": "true"})  # noqa: E731
    env.provider.script("primary", reply(), reply())
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == BACKUP_BYTES
    assert b"rate_limit_error" not in result.body
    assert upstreams(env) == ["primary", "primary", "backup"]


# --- not failures ------------------------------------------------------------------------


def test_refusal_with_no_content_is_not_a_failure(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*REFUSAL))
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == b"".join(REFUSAL)
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert upstreams(env) == ["primary"]


def test_refusal_with_no_content_reaches_the_anthropic_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*REFUSAL))
    text, final = stream_message(anthropic_client(env))
    assert text == ""
    assert final.stop_reason == "refusal"
    assert final.id == "msg_01RefusalTestMessage123456789"
    assert upstreams(env) == ["primary"]


# --- fatal: returned as sent -------------------------------------------------------------


FATAL_HTTP = [
    (400, {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
           "request_id": "req_011fatal400"}, anthropic.BadRequestError),
    (401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"},
           "request_id": "req_011fatal401"}, anthropic.AuthenticationError),
]


@pytest.mark.parametrize(("status", "body", "exc"), FATAL_HTTP, ids=["400-invalid_request_error", "401-authentication_error"])
def test_fatal_http_errors_are_returned_as_sent(env: Env, status: int, body: dict, exc: type) -> None:
    raw = json.dumps(body).encode()
    env.provider.script("primary", Reply.json(status, raw, headers={"request-id": body["request_id"]}))
    result = curl_messages(env)
    assert result.status == status
    assert result.body == raw
    assert result.headers["request-id"] == body["request_id"]
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert upstreams(env) == ["primary"]


@pytest.mark.parametrize(("status", "body", "exc"), FATAL_HTTP, ids=["400-invalid_request_error", "401-authentication_error"])
def test_fatal_http_errors_raise_their_own_exception_in_the_anthropic_sdk(env: Env, status: int, body: dict, exc: type) -> None:
    env.provider.script("primary", Reply.json(status, body))
    with pytest.raises(exc) as raised:
        stream_message(anthropic_client(env))
    assert raised.value.status_code == status
    assert raised.value.body == body
    assert upstreams(env) == ["primary"]


def test_prompt_too_long_moves_to_backup_after_one_primary_call(env: Env) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 215748 tokens > 200000 maximum"}}
    # scripted twice: a wrong same-upstream retry would show up as a second primary call
    env.provider.script("primary", Reply.json(400, body), Reply.json(400, body))
    mark = env.mitm.log_mark()
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == BACKUP_BYTES
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert result.headers["x-switchyard-attempts"] == "2"
    assert upstreams(env) == ["primary", "backup"]
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    failed_line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    assert "route=messages upstream=primary attempt=1" in failed_line
    assert "decision=next_upstream" in failed_line


def test_prompt_too_long_moves_to_backup_anthropic_sdk(env: Env) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 215748 tokens > 200000 maximum"}}
    env.provider.script("primary", Reply.json(400, body), Reply.json(400, body))
    assert_backup_answer(*stream_message(anthropic_client(env)))
    assert upstreams(env) == ["primary", "backup"]


# --- after output: never replay -------------------------------------------------------


def test_error_after_text_delta_is_forwarded_not_retried(env: Env) -> None:
    mark = env.mitm.log_mark()
    env.provider.script("primary", Reply.sse(*ERROR_AFTER_TEXT), Reply.sse(*wire.anthropic_stream("must not be used")))
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == b"".join(ERROR_AFTER_TEXT)  # forwarded as sent: overloaded_error is not a rewritten code
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert upstreams(env) == ["primary"]
    log = env.mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    assert "route=messages upstream=primary api=anthropic-messages" in log


def test_error_after_text_delta_reaches_the_anthropic_sdk_after_the_partial_text(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*ERROR_AFTER_TEXT))
    collected: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        stream_message(anthropic_client(env), collected)
    assert "".join(collected) == "["
    assert raised.value.type == "overloaded_error"
    assert upstreams(env) == ["primary"]


def test_cut_after_text_delta_ends_with_an_in_band_error_event(env: Env) -> None:
    head = wire.anthropic_stream("partial answer")[:4]  # message_start, block start, ping, first delta
    env.provider.script("primary", Reply.sse(*head))  # EOF: no message_stop
    result = curl_messages(env)
    sent = b"".join(head)
    assert result.body.startswith(sent)
    tail = result.body[len(sent):]
    assert tail.startswith(b"event: error\ndata: ") and tail.endswith(b"\n\n") and tail.count(b"\n\n") == 1
    payload = json.loads(tail.removeprefix(b"event: error\ndata: "))
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "api_error"
    assert upstreams(env) == ["primary"]


# --- credentials --------------------------------------------------------------------------


def client_key_headers(call) -> list[str]:  # type: ignore[no-untyped-def]
    """Names of the headers that carry the client's key (anthropic 2.x sends api_key as a Bearer token)."""
    return sorted(key.lower() for key, value in call.headers.items() if CLIENT_SECRET in value)


def test_backup_gets_its_own_key_and_never_the_clients(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOADED_FIRST), Reply.sse(*OVERLOADED_FIRST))
    assert_backup_answer(*stream_message(anthropic_client(env)))  # the SDK sends its own api_key
    primary, again, backup = env.provider.calls
    # the original destination keeps the client's key, however the SDK sent it
    assert client_key_headers(primary) and client_key_headers(primary) == client_key_headers(again)
    assert backup.upstream == "backup" and backup.port == env.provider.ports[1]
    assert header_values(backup, "x-api-key") == [BACKUP_SECRET]  # its own key, and only that one
    assert header_values(backup, "authorization") == []
    assert client_key_headers(backup) == []
    assert header_values(backup, "anthropic-version") == header_values(primary, "anthropic-version")
    assert backup.body == primary.body  # the request itself is unchanged


def test_backup_never_gets_the_clients_x_api_key_or_authorization(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOADED_FIRST), Reply.sse(*OVERLOADED_FIRST))
    result = curl_messages(env)  # sends x-api-key and Authorization: Bearer, both the client's
    assert result.body == BACKUP_BYTES
    primary, _, backup = env.provider.calls
    assert header_values(primary, "x-api-key") == [CLIENT_SECRET]
    assert header_values(primary, "authorization") == [f"Bearer {CLIENT_SECRET}"]
    assert header_values(backup, "x-api-key") == [BACKUP_SECRET]
    assert header_values(backup, "authorization") == []
    assert client_key_headers(backup) == []


# --- valid streams ------------------------------------------------------------------------


def test_valid_padded_stream_passes_through_byte_identical(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*PADDED_NORMAL, headers={"request-id": "req_ok"}))
    result = curl_messages(env)
    assert result.status == 200
    assert result.body == b"".join(PADDED_NORMAL)
    assert b'"index":0        }' in result.body  # the padding survived
    assert result.headers["request-id"] == "req_ok"
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert upstreams(env) == ["primary"]


def test_valid_padded_stream_anthropic_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*PADDED_NORMAL))
    text, final = stream_message(anthropic_client(env))
    assert text == "[12345,67890]"
    assert final.stop_reason == "end_turn"
    assert upstreams(env) == ["primary"]


def test_valid_stream_passes_through_byte_identical(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*wire.anthropic_stream(wire.answer_text("primary"))))
    assert curl_messages(env).body == PRIMARY_BYTES
    assert upstreams(env) == ["primary"]
