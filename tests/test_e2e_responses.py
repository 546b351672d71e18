"""OpenAI Responses API (`/v1/responses`) through a real mitmdump, real loopback upstreams, real clients.

Each test scripts what the upstreams answer and asserts what a user would
notice: the exact bytes the client received, which upstreams were called and
how often, and what was logged.  Wire shapes come from
the providers' recorded and documented streams (the fixtures under tests/fixtures are
copied from it byte for byte).

The `responses` route: upstream `primary` is the request's own destination
(retries: 1, so two attempts), `backup` is on the fake provider's second port.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.conftest import BODY_MARKER, CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import Reply

FIXTURES = Path(__file__).parent / "fixtures"

BACKUP_TEXT = wire.answer_text("backup")
BACKUP_BYTES = b"".join(wire.responses_stream(BACKUP_TEXT))
PRIMARY_BYTES = b"".join(wire.responses_stream(wire.answer_text("primary")))

OVERLOAD_TEXT = "Our servers are currently overloaded. Please try again later."


def fixture_frames(name: str) -> list[bytes]:
    """A wire fixture split into its frames, each with its blank-line terminator."""
    raw = (FIXTURES / name).read_bytes()
    frames = [part + b"\n\n" for part in raw.split(b"\n\n") if part.strip()]
    assert b"".join(frames) == raw, f"{name} does not end with a blank line"
    return frames


#: created, in_progress, nested error (server_is_overloaded), response.failed
OVERLOAD_SEQUENCE = fixture_frames("responses_overload_canonical.sse")
# The same payload re-emitted by gateways as data-only frames
OVERLOAD_SEQUENCE_NO_EVENT_LINES = fixture_frames("responses_overload_no_event_lines.sse")

CREATED = wire.event(
    "response.created",
    {"type": "response.created", "sequence_number": 0,
     "response": {"id": "resp_fail", "object": "response", "created_at": 1761565462, "status": "in_progress", "model": "gpt-4o", "output": []}},
)
IN_PROGRESS = wire.event(
    "response.in_progress",
    {"type": "response.in_progress", "sequence_number": 1,
     "response": {"id": "resp_fail", "object": "response", "created_at": 1761565462, "status": "in_progress", "model": "gpt-4o", "output": []}},
)


def failed(code: str, message: str, seq: int = 1) -> bytes:
    """`response.failed` in the spec's shape."""
    return wire.event(
        "response.failed",
        {"type": "response.failed", "sequence_number": seq,
         "response": {"id": "resp_fail", "object": "response", "created_at": 1761565462, "status": "failed",
                      "error": {"code": code, "message": message}, "output": [], "usage": None}},
    )


def flat_error(code: str, message: str, seq: int = 0) -> bytes:
    """The spec's flat `error` event."""
    return wire.event("error", {"type": "error", "code": code, "message": message, "param": None, "sequence_number": seq})


def nested_error(code: str, message: str, seq: int) -> bytes:
    """The nested `error` event seen on the public API."""
    return wire.event(
        "error",
        {"type": "error", "error": {"type": "service_unavailable_error", "code": code, "message": message, "param": None},
         "sequence_number": seq},
    )


def text_delta(text: str, seq: int) -> bytes:
    return wire.event(
        "response.output_text.delta",
        {"type": "response.output_text.delta", "sequence_number": seq, "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": text, "logprobs": []},
    )


def started_message() -> list[bytes]:
    """The lifecycle frames of a normal stream up to (not including) the first delta."""
    return wire.responses_stream("x")[:4]


def openai_client(env: Env) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=CLIENT_SECRET,
        base_url=env.provider.url("primary", "/v1"),
        max_retries=0,
        http_client=openai.DefaultHttpxClient(proxy=env.mitm.proxy_url, trust_env=False),
    )


def stream_events(client: openai.OpenAI, collected: list[str] | None = None) -> tuple[str, list[str]]:
    """Stream a response with the SDK; return the output_text and the event types seen."""
    stream = client.responses.create(model="gpt-4o", input=f"say hello {BODY_MARKER}", stream=True)
    text: list[str] = collected if collected is not None else []
    types: list[str] = []
    for event in stream:
        types.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
    return "".join(text), types


def responses_url(env: Env, prefix: str = "primary") -> str:
    return env.provider.url(prefix, "/v1/responses")


def responses_body(stream: bool = True) -> bytes:
    return json.dumps({"model": "gpt-4o", "stream": stream, "input": f"say hello {BODY_MARKER}"}).encode()


def upstreams(env: Env) -> list[str]:
    return [c.upstream for c in env.provider.calls]


def assert_backup_stream(env: Env, result) -> None:  # type: ignore[no-untyped-def]
    assert result.status == 200
    assert result.body == BACKUP_BYTES
    assert result.headers["x-switchyard-upstream"] == "backup"


# --- the canonical overload sequence ---------------------------------------


def test_canonical_overload_sequence_curl_gets_exactly_the_backup_stream(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOAD_SEQUENCE), Reply.sse(*OVERLOAD_SEQUENCE))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert b"resp_overload" not in result.body  # nothing of the failed attempts, not even their lifecycle frames
    assert b"server_is_overloaded" not in result.body
    assert result.headers["x-switchyard-attempts"] == "3"
    assert upstreams(env) == ["primary", "primary", "backup"]
    assert [c.path for c in env.provider.calls] == ["/v1/responses"] * 3


def test_canonical_overload_sequence_falls_back_openai_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOAD_SEQUENCE), Reply.sse(*OVERLOAD_SEQUENCE))
    text, types = stream_events(openai_client(env))
    assert text == BACKUP_TEXT
    assert types.count("response.created") == 1
    assert types[-1] == "response.completed"
    assert "error" not in types and "response.failed" not in types
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_canonical_overload_then_retry_on_primary_succeeds(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOAD_SEQUENCE))
    result = env.curl(responses_url(env), responses_body())
    assert result.body == PRIMARY_BYTES
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "2"
    assert upstreams(env) == ["primary", "primary"]


# --- other retryable shapes before output -----------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        fixture_frames("responses_failed_server_is_overloaded.sse")[0],
        fixture_frames("responses_failed_slow_down.sse")[0],
        failed("server_error", "The model failed to generate a response."),
        fixture_frames("responses_failed_rate_limit_exceeded.sse")[0],
    ],
    ids=["server_is_overloaded", "slow_down", "server_error", "rate_limit_exceeded"],
)
def test_response_failed_only_falls_back(env: Env, failure: bytes) -> None:
    attempt = Reply.sse(CREATED, failure)
    env.provider.script("primary", attempt, Reply.sse(CREATED, failure))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert b"resp_fail" not in result.body
    assert upstreams(env) == ["primary", "primary", "backup"]


@pytest.mark.parametrize(
    "error",
    [
        flat_error("server_is_overloaded", OVERLOAD_TEXT),
        flat_error("server_error", "Something went wrong"),
    ],
    ids=["server_is_overloaded", "server_error"],
)
def test_flat_error_event_first_falls_back(env: Env, error: bytes) -> None:
    env.provider.script("primary", Reply.sse(error), Reply.sse(error))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_flat_error_event_first_falls_back_openai_sdk(env: Env) -> None:
    # openai-python yields a flat error event instead of raising: the
    # user would see an "error" event, so none must reach the SDK.
    error = flat_error("server_is_overloaded", OVERLOAD_TEXT)
    env.provider.script("primary", Reply.sse(error), Reply.sse(error))
    text, types = stream_events(openai_client(env))
    assert text == BACKUP_TEXT
    assert "error" not in types
    assert types[-1] == "response.completed"


def test_overload_sequence_without_event_lines_falls_back(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*OVERLOAD_SEQUENCE_NO_EVENT_LINES), Reply.sse(*OVERLOAD_SEQUENCE_NO_EVENT_LINES))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert b"resp_overload" not in result.body
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_empty_reasoning_item_then_response_failed_falls_back(env: Env) -> None:
    reasoning = {"id": "rs_68ca7f6f73448193a2a0d794ba786bb20a7529be66016d03", "type": "reasoning", "summary": []}
    frames = [
        CREATED,
        IN_PROGRESS,
        wire.event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": reasoning}),
        wire.event("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": reasoning}),
        failed("server_error", "The model failed to generate a response.", seq=4),
    ]
    env.provider.script("primary", Reply.sse(*frames), Reply.sse(*frames))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert b"rs_68ca7f6f" not in result.body
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_empty_reasoning_item_then_response_failed_openai_sdk(env: Env) -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    frames = [
        CREATED,
        wire.event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": reasoning}),
        wire.event("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": reasoning}),
        failed("server_is_overloaded", OVERLOAD_TEXT, seq=3),
    ]
    env.provider.script("primary", Reply.sse(*frames), Reply.sse(*frames))
    text, types = stream_events(openai_client(env))
    assert text == BACKUP_TEXT
    assert "response.failed" not in types
    assert types.count("response.output_item.added") == 1  # only backup's message item


# --- HTTP-level failures ------------------------------------------------------------


def test_http_503_server_is_overloaded_falls_back(env: Env) -> None:
    body = {"error": {"type": "service_unavailable_error", "code": "server_is_overloaded", "message": OVERLOAD_TEXT, "param": None}}
    env.provider.script("primary", Reply.json(503, body), Reply.json(503, body))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert result.headers["x-switchyard-attempts"] == "3"
    assert upstreams(env) == ["primary", "primary", "backup"]


def test_http_503_server_is_overloaded_falls_back_openai_sdk(env: Env) -> None:
    body = {"error": {"type": "service_unavailable_error", "code": "server_is_overloaded", "message": OVERLOAD_TEXT, "param": None}}
    env.provider.script("primary", Reply.json(503, body), Reply.json(503, body))
    text, types = stream_events(openai_client(env))
    assert text == BACKUP_TEXT
    assert types[-1] == "response.completed"


@pytest.mark.parametrize(
    "reply",
    [
        Reply.json(400, {"error": {"message": OVERLOAD_TEXT}}),
        Reply(400, [OVERLOAD_TEXT.encode()], content_type="text/plain"),
    ],
    ids=["json-message-only", "plain-text"],
)
def test_http_400_with_only_the_overload_message_falls_back(env: Env, reply: Reply) -> None:
    env.provider.script("primary", reply, Reply(reply.status, list(reply.pieces), content_type=reply.content_type))
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert upstreams(env) == ["primary", "primary", "backup"]


# --- next-upstream-only: no retry on the same upstream ---------------------------


@pytest.mark.parametrize(
    ("fixture", "code"),
    [
        ("responses_failed_context_length_exceeded.sse", "context_length_exceeded"),
        ("responses_failed_insufficient_quota.sse", "insufficient_quota"),
    ],
    ids=["context_length_exceeded", "insufficient_quota"],
)
def test_next_upstream_only_codes_move_to_backup_after_one_primary_call(env: Env, fixture: str, code: str) -> None:
    frames = [CREATED, *fixture_frames(fixture)]
    # scripted twice: a wrong same-upstream retry would show up as a second primary call
    env.provider.script("primary", Reply.sse(*frames), Reply.sse(*frames))
    mark = env.mitm.log_mark()
    result = env.curl(responses_url(env), responses_body())
    assert_backup_stream(env, result)
    assert result.headers["x-switchyard-attempts"] == "2"
    assert upstreams(env) == ["primary", "backup"]
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    failed_line = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    assert "route=responses upstream=primary attempt=1" in failed_line
    assert f"code={code}" in failed_line
    assert "decision=next_upstream" in failed_line


def test_insufficient_quota_nested_error_event_moves_to_backup_openai_sdk(env: Env) -> None:
    frames = fixture_frames("responses_error_insufficient_quota_nested.sse")
    env.provider.script("primary", Reply.sse(*frames), Reply.sse(*frames))
    text, types = stream_events(openai_client(env))
    assert text == BACKUP_TEXT
    assert upstreams(env) == ["primary", "backup"]


# --- fatal ------------------------------------------------------------------------------


def test_invalid_prompt_is_returned_as_sent(env: Env) -> None:
    sent = [CREATED, IN_PROGRESS, *fixture_frames("responses_failed_invalid_prompt.sse")]
    env.provider.script("primary", Reply.sse(*sent, headers={"x-request-id": "req_invalid"}))
    result = env.curl(responses_url(env), responses_body())
    assert result.status == 200
    assert result.body == b"".join(sent)
    assert result.headers["x-request-id"] == "req_invalid"
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert upstreams(env) == ["primary"]


def test_invalid_prompt_reaches_the_openai_sdk_as_response_failed(env: Env) -> None:
    sent = [CREATED, *fixture_frames("responses_failed_invalid_prompt.sse")]
    env.provider.script("primary", Reply.sse(*sent))
    stream = openai_client(env).responses.create(model="gpt-4o", input="hi", stream=True)
    events = list(stream)
    assert [e.type for e in events] == ["response.created", "response.failed"]
    assert events[-1].response.error.code == "invalid_prompt"
    assert upstreams(env) == ["primary"]


# --- after output: never replay ----------------------------------------------------


def test_error_after_output_is_forwarded_not_retried(env: Env) -> None:
    mark = env.mitm.log_mark()
    head = [*started_message(), text_delta("Half an ans", 4)]
    error = nested_error("server_is_overloaded", OVERLOAD_TEXT, 5)
    fail = failed("server_is_overloaded", OVERLOAD_TEXT, seq=6)
    env.provider.script("primary", Reply.sse(*head, error, fail), Reply.sse(*wire.responses_stream("must not be used")))
    result = env.curl(responses_url(env), responses_body())
    rewritten = error.replace(b'"server_is_overloaded"', b'"server_error"')
    assert rewritten != error
    # forwarded, with the capacity code rewritten so clients treat it as a server error
    assert result.body == b"".join(head) + rewritten + fail.replace(b'"server_is_overloaded"', b'"server_error"')
    assert b"server_is_overloaded" not in result.body
    assert OVERLOAD_TEXT.encode() in result.body  # only the code changes, never the message
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert upstreams(env) == ["primary"]
    log = env.mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    assert "route=responses upstream=primary api=openai-responses" in log


def test_error_after_output_reaches_the_openai_sdk_after_the_partial_text(env: Env) -> None:
    head = [*started_message(), text_delta("Half an ans", 4)]
    env.provider.script("primary", Reply.sse(*head, nested_error("server_is_overloaded", OVERLOAD_TEXT, 5)))
    collected: list[str] = []
    with pytest.raises(openai.APIError, match="overloaded"):
        stream_events(openai_client(env), collected)
    assert "".join(collected) == "Half an ans"
    assert upstreams(env) == ["primary"]


def test_reference_flat_error_after_content_is_forwarded_byte_identical(env: Env) -> None:
    sent = fixture_frames("responses_stream_error_after_content.sse")
    env.provider.script("primary", Reply.sse(*sent))
    result = env.curl(responses_url(env), responses_body())
    assert result.body == b"".join(sent)
    assert upstreams(env) == ["primary"]


def test_cut_after_output_ends_with_an_in_band_error_event(env: Env) -> None:
    mark = env.mitm.log_mark()
    head = [*started_message(), text_delta("partial", 4)]
    env.provider.script("primary", Reply.sse(*head))  # EOF: no response.completed
    result = env.curl(responses_url(env), responses_body())
    sent = b"".join(head)
    assert result.body.startswith(sent)
    tail = result.body[len(sent):]
    assert tail.startswith(b"event: error\ndata: ")
    assert tail.endswith(b"\n\n") and tail.count(b"\n\n") == 1  # exactly one frame, then the end
    payload = json.loads(tail.removeprefix(b"event: error\ndata: "))
    assert payload["type"] == "error"
    assert payload["code"] == "stream_cut"
    assert upstreams(env) == ["primary"]
    env.mitm.wait_for_log("switchyard.stream_cut_after_output route=responses upstream=primary", mark)


def test_cut_after_output_is_an_error_for_the_openai_sdk(env: Env) -> None:
    env.provider.script("primary", Reply.sse(*started_message(), text_delta("partial", 4)))
    collected: list[str] = []
    with pytest.raises(openai.APIError):
        stream_events(openai_client(env), collected)
    assert "".join(collected) == "partial"


# --- valid streams ------------------------------------------------------------------


def test_valid_stream_passes_through_byte_identical(env: Env) -> None:
    frames = wire.responses_stream("A perfectly normal answer, with “unicode” ✓.")
    env.provider.script("primary", Reply.sse(*frames, headers={"x-request-id": "req_ok"}))
    result = env.curl(responses_url(env), responses_body())
    assert result.status == 200
    assert result.body == b"".join(frames)
    assert result.headers["x-request-id"] == "req_ok"
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert upstreams(env) == ["primary"]


def test_reference_recorded_stream_passes_through_byte_identical(env: Env) -> None:
    frames = fixture_frames("responses_normal_text.sse")
    env.provider.script("primary", Reply.sse(*frames))
    assert env.curl(responses_url(env), responses_body()).body == b"".join(frames)
    assert upstreams(env) == ["primary"]


def test_valid_stream_openai_sdk(env: Env) -> None:
    text, types = stream_events(openai_client(env))
    assert text == wire.answer_text("primary")
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert upstreams(env) == ["primary"]
