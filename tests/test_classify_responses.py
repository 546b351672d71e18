"""OpenAI Responses classifier against wire fixtures in the API's real shapes.

Each fixture holds a recorded or documented stream's lines byte for byte, every
event ended by its blank line; where its source cut a frame short with `…`, the
cut was removed so the JSON parses, and where it gave a bare JSON object the
object is wrapped in `event:`/`data:` lines.  SOURCES says what each is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import openai
import pytest
from pydantic import TypeAdapter

from switchyard_core.apis import APIS
from switchyard_core.apis.base import Classification, ErrorInfo, FrameKind
from switchyard_core.apis.errors import Decision, ErrorPolicy
from switchyard_core.apis.openai_responses import OVERLOAD_OUTPUT_TEXT, OpenAIResponses
from switchyard_core.sse import FrameSplitter, SseEvent

FIXTURES = Path(__file__).parent / "fixtures"

SOURCES = {
    "responses_normal_text.sse": "normal text stream (recorded), elided frames completed",
    "responses_reasoning_summary.sse": "reasoning summary, first block",
    "responses_reasoning_function_call.sse": "empty reasoning item then function call, second block",
    "responses_refusal_delta.sse": "spec example response.refusal.delta, wrapped",
    "responses_reasoning_text_delta.sse": "spec example response.reasoning_text.delta, wrapped",
    "responses_queued.sse": "spec example response.queued, wrapped",
    "responses_failed_rate_limit_exceeded.sse": "codex responses.rs rate_limit_exceeded",
    "responses_failed_context_length_exceeded.sse": "codex responses.rs context_length_exceeded",
    "responses_failed_insufficient_quota.sse": "codex responses.rs insufficient_quota",
    "responses_failed_invalid_prompt.sse": "codex responses.rs invalid_prompt",
    "responses_failed_server_is_overloaded.sse": "sub2api PR #3476 server_is_overloaded, wrapped",
    "responses_failed_server_error_processing.sse": "sub2api #6714 server_error, elision removed",
    "responses_failed_top_level_error.sse": "sub2api #5281 top-level error envelope",
    "responses_stream_error_after_content.sse": "coder/aibridge stream_error.txtar, flat error after content",
    "responses_error_insufficient_quota_nested.sse": "SwiftAgent nested insufficient_quota, elisions removed",
    "responses_overload_canonical.sse": "canonical overload sequence",
    "responses_overload_error_first.sse": "variant: the error frame alone, first",
    "responses_overload_failed_only.sse": "variant: sub2api overloadedStreamSSE, response.failed only",
    "responses_overload_no_event_lines.sse": "variant: canonical sequence with the event lines stripped",
    "responses_failed_slow_down.sse": "variant: slow_down, wrapped",
    "responses_incomplete.sse": "spec response.incomplete, wrapped, elisions removed",
}

K, L, O, T, F, E = (
    FrameKind.KEEPALIVE,
    FrameKind.LIFECYCLE,
    FrameKind.OUTPUT,
    FrameKind.TERMINAL,
    FrameKind.FAILURE,
    FrameKind.EMPTY_END,
)


@dataclass(frozen=True)
class Failure:
    decision: Decision
    code: str | None
    type: str | None = None


@dataclass(frozen=True)
class Case:
    fixture: str
    kinds: list[FrameKind]
    complete: bool
    failures: list[Failure] = field(default_factory=list)


OVERLOADED = Failure(Decision.RETRY, "server_is_overloaded")
OVERLOADED_EVENT = Failure(Decision.RETRY, "server_is_overloaded", "service_unavailable_error")
QUOTA = Failure(Decision.NEXT_UPSTREAM, "insufficient_quota")

CASES = [
    Case("responses_normal_text.sse", [L, L, L, L, O, O, O, O, T], True),
    Case("responses_reasoning_summary.sse", [L, L, O], False),
    Case("responses_reasoning_function_call.sse", [L, L, L, O], False),
    Case("responses_refusal_delta.sse", [O], False),
    Case("responses_reasoning_text_delta.sse", [O], False),
    Case("responses_queued.sse", [L], False),
    Case(
        "responses_failed_rate_limit_exceeded.sse",
        [F],
        True,
        [Failure(Decision.RETRY, "rate_limit_exceeded")],
    ),
    Case(
        "responses_failed_context_length_exceeded.sse",
        [F],
        True,
        [Failure(Decision.NEXT_UPSTREAM, "context_length_exceeded")],
    ),
    Case("responses_failed_insufficient_quota.sse", [F], True, [QUOTA]),
    Case(
        "responses_failed_invalid_prompt.sse",
        [F],
        True,
        [Failure(Decision.FATAL, "invalid_prompt")],
    ),
    Case("responses_failed_server_is_overloaded.sse", [F], True, [OVERLOADED]),
    Case(
        "responses_failed_server_error_processing.sse",
        [F],
        True,
        [Failure(Decision.RETRY, "server_error")],
    ),
    Case(
        "responses_failed_top_level_error.sse",
        [F],
        True,
        [Failure(Decision.RETRY, None, "invalid_request_error")],
    ),
    Case(
        "responses_stream_error_after_content.sse",
        [L, L, O, F],
        False,
        [Failure(Decision.FATAL, "ERR_SOMETHING")],
    ),
    Case(
        "responses_error_insufficient_quota_nested.sse",
        [L, L, F, F],
        True,
        [Failure(Decision.NEXT_UPSTREAM, "insufficient_quota", "insufficient_quota"), QUOTA],
    ),
    Case("responses_overload_canonical.sse", [L, L, F, F], True, [OVERLOADED_EVENT, OVERLOADED]),
    Case("responses_overload_error_first.sse", [F], False, [OVERLOADED_EVENT]),
    Case("responses_overload_failed_only.sse", [L, F], True, [OVERLOADED]),
    Case(
        "responses_overload_no_event_lines.sse",
        [L, L, F, F],
        True,
        [OVERLOADED_EVENT, OVERLOADED],
    ),
    Case("responses_failed_slow_down.sse", [F], True, [Failure(Decision.RETRY, "slow_down")]),
    Case("responses_incomplete.sse", [T], True),
]


def run(raw: bytes, chunk: int | None = None) -> tuple[list[Classification], bool]:
    """Split `raw` as the relay would and classify every frame with a fresh stream."""
    splitter = FrameSplitter()
    frames = []
    step = chunk or len(raw) or 1
    for start in range(0, len(raw), step):
        frames += splitter.feed(raw[start : start + step])
    frames += splitter.finish()
    stream = OpenAIResponses().stream_classifier()
    return [stream.classify(frame.event) for frame in frames], stream.complete


def one(data: dict[str, object] | str, event: str | None = None) -> Classification:
    line = data if isinstance(data, str) else json.dumps(data)
    raw = (f"event: {event}\n" if event else "") + f"data: {line}\n\n"
    results, _ = run(raw.encode())
    assert len(results) == 1
    return results[0]


def test_every_responses_fixture_has_a_source_and_a_case() -> None:
    on_disk = {path.name for path in FIXTURES.glob("responses_*.sse")}
    assert on_disk == set(SOURCES)
    assert {case.fixture for case in CASES} == set(SOURCES)


def test_registered_under_its_name() -> None:
    assert isinstance(APIS["openai-responses"], OpenAIResponses)


@pytest.mark.parametrize("mode", ["whole", "bytewise", "crlf"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.fixture.removesuffix(".sse"))
def test_fixture(case: Case, mode: str) -> None:
    raw = (FIXTURES / case.fixture).read_bytes()
    if mode == "crlf":
        raw = raw.replace(b"\n", b"\r\n")
    results, complete = run(raw, chunk=1 if mode == "bytewise" else None)
    assert [result.kind for result in results] == case.kinds
    assert complete is case.complete
    failures = [result for result in results if result.kind is F]
    assert len(failures) == len(case.failures)
    for result, expected in zip(failures, case.failures):
        info = result.error
        assert info is not None
        assert (ErrorPolicy().decide(info), info.code, info.type) == (
            expected.decision,
            expected.code,
            expected.type,
        )
        assert info.message
    for result in results:
        if result.kind is not K:
            assert result.event_type


def test_nested_error_reads_code_type_and_message() -> None:
    results, _ = run((FIXTURES / "responses_overload_canonical.sse").read_bytes())
    error = results[2].error
    assert error == ErrorInfo(
        code="server_is_overloaded",
        type="service_unavailable_error",
        message="Our servers are currently overloaded. Please try again later.",
        event_type="error",
    )
    assert results[3].event_type == "response.failed"


def test_top_level_error_envelope_keeps_message() -> None:
    results, _ = run((FIXTURES / "responses_failed_top_level_error.sse").read_bytes())
    error = results[0].error
    assert error is not None
    assert error.message == "Selected model is at capacity. Please try a different model."


@pytest.mark.parametrize(
    "data, kind",
    [
        ({"type": "response.metadata", "metadata": {"k": "v"}}, L),
        ({"type": "response.output_text.delta", "delta": ""}, L),
        ({"type": "response.function_call_arguments.delta", "delta": "{"}, O),
        ({"type": "response.custom_tool_call_input.delta", "delta": "x"}, O),
        ({"type": "response.reasoning_summary_text.delta", "delta": "**Plan"}, O),
        ({"type": "response.audio.delta", "delta": "UklGRg=="}, O),
        ({"type": "response.audio.transcript.delta", "delta": "hi"}, O),
        ({"type": "response.mcp_call_arguments.delta", "delta": "{}"}, O),
        ({"type": "response.code_interpreter_call_code.delta", "delta": "print(1)"}, O),
        ({"type": "response.web_search_call.in_progress", "item_id": "ws_1"}, L),
        ({"type": "response.web_search_call.searching", "item_id": "ws_1"}, L),
        ({"type": "response.web_search_call.completed", "item_id": "ws_1"}, L),
        ({"type": "response.file_search_call.searching", "item_id": "fs_1"}, L),
        ({"type": "response.mcp_list_tools.in_progress"}, L),
        ({"type": "response.mcp_list_tools.completed"}, L),
        ({"type": "response.image_generation_call.generating"}, L),
        ({"type": "response.code_interpreter_call.interpreting"}, L),
        ({"type": "response.output_text.annotation.added", "annotation": {"type": "url"}}, O),
        ({"type": "response.image_generation_call.partial_image", "partial_image_b64": "x"}, O),
        (
            {
                "type": "response.output_item.added",
                "item": {"type": "custom_tool_call", "id": "ct", "call_id": "c", "name": "n", "input": ""},
            },
            L,
        ),
        (
            {
                "type": "response.output_item.added",
                "item": {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"},
            },
            L,
        ),
        (
            {
                "type": "response.output_item.added",
                "item": {"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
            },
            O,
        ),
        (
            {
                "type": "response.output_item.added",
                "item": {"type": "function_call", "name": "f", "call_id": "c", "arguments": "{}"},
            },
            O,
        ),
        (
            {
                "type": "response.output_item.done",
                "item": {"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]},
            },
            O,
        ),
        ({"type": "response.output_item.added", "item": {"type": "web_search_call", "id": "ws", "status": "in_progress"}}, L),
        ({"type": "response.output_item.added", "item": {"type": "brand_new_call", "payload": "x"}}, O),
        ({"type": "response.reasoning_summary_part.added", "part": {"type": "summary_text", "text": ""}}, L),
        ({"type": "response.content_part.added", "part": {"type": "output_text", "text": "Hi"}}, O),
        ({"type": "response.content_part.added", "part": {"type": "refusal", "refusal": ""}}, L),
        ({"type": "response.output_text.done", "item_id": "m", "text": ""}, L),
        ({"type": "response.audio.done", "response_id": "r", "sequence_number": 3}, L),
        ({"type": "response.something_new", "sequence_number": 3}, O),
        ({"type": "response.completed", "response": {"status": "completed"}}, T),
    ],
    ids=lambda value: value["type"] if isinstance(value, dict) else str(value.value),
)
def test_event_kinds(data: dict[str, object], kind: FrameKind) -> None:
    assert one(data).kind is kind
    assert one(data, event=str(data["type"])).kind is kind


def test_unknown_event_fails_closed_with_its_type() -> None:
    result = one({"type": "response.something_new"})
    assert result == Classification(O, "response.something_new")
    assert one("not json", event="response.whatever") == Classification(O, "response.whatever")


def test_event_line_alone_names_the_type() -> None:
    assert one({"sequence_number": 0}, event="response.created").kind is L
    assert one({"code": "slow_down", "message": "Please slow down."}, event="error").kind is F


def test_comment_frames_are_keepalive() -> None:
    results, complete = run(b": keep-alive\n\n: ping\n\n")
    assert [result.kind for result in results] == [K, K]
    assert not complete


def test_done_sentinel() -> None:
    results, complete = run(b"data: [DONE]\n\n")
    assert [result.kind for result in results] == [E] and complete
    raw = (FIXTURES / "responses_normal_text.sse").read_bytes() + b"data: [DONE]\n\n"
    results, complete = run(raw)
    assert results[-1] == Classification(T, "[DONE]") and complete
    raw = (FIXTURES / "responses_reasoning_function_call.sse").read_bytes() + b"data: [DONE]\n\n"
    assert run(raw)[0][-1].kind is T


def test_truthy_top_level_error_in_any_frame_fails() -> None:
    result = one({"error": {"code": 503, "message": "provider overloaded"}})
    assert result.kind is F and result.error is not None
    assert result.error.status == 503
    assert ErrorPolicy().decide(result.error) is Decision.RETRY
    raw = b'{"error":{"message":"boom","type":"api_error"}}\n\n'
    results, _ = run(raw)
    assert results[0].kind is F and results[0].event_type == "bare_json"


def test_error_event_without_data_still_fails() -> None:
    assert run(b"event: error\n\n")[0][0].kind is F


def test_response_failed_without_error_object_hints_transient() -> None:
    result = one({"type": "response.failed", "response": {"status": "failed", "error": None}})
    assert result.kind is F and result.error is not None
    assert ErrorPolicy().decide(result.error) is Decision.RETRY
    message_only = one({"type": "response.failed", "message": "Our servers are currently overloaded."})
    assert message_only.error is not None
    assert message_only.error.message == "Our servers are currently overloaded."


OVERLOAD_DELTA = {
    "type": "response.output_text.delta",
    "item_id": "msg_1",
    "output_index": 0,
    "content_index": 0,
    "delta": OVERLOAD_OUTPUT_TEXT,
}


def test_overload_text_as_whole_first_delta_is_a_failure() -> None:
    assert len(OVERLOAD_OUTPUT_TEXT) == 61
    prefix = (FIXTURES / "responses_normal_text.sse").read_bytes().split(b"event: response.output_text.delta")[0]
    raw = prefix + b"event: response.output_text.delta\ndata: " + json.dumps(OVERLOAD_DELTA).encode() + b"\n\n"
    results, complete = run(raw)
    assert [result.kind for result in results] == [L, L, L, L, F]
    assert not complete
    info = results[-1].error
    assert info is not None and info.code == "server_is_overloaded"
    assert ErrorPolicy().decide(info) is Decision.RETRY
    padded = dict(OVERLOAD_DELTA, delta=f"  {OVERLOAD_OUTPUT_TEXT}\n")
    assert one(padded).kind is F


def test_overload_text_guard_is_exact() -> None:
    longer = dict(OVERLOAD_DELTA, delta=OVERLOAD_OUTPUT_TEXT + " Here is your answer")
    assert one(longer).kind is O
    assert one(dict(OVERLOAD_DELTA, delta="Our servers are currently overloaded.")).kind is O
    refusal = dict(OVERLOAD_DELTA, type="response.refusal.delta")
    assert one(refusal).kind is O
    stream = OpenAIResponses().stream_classifier()
    first = dict(OVERLOAD_DELTA, delta="Quote: ")
    assert stream.classify(SseEvent(data=json.dumps(first))).kind is O
    assert stream.classify(SseEvent(data=json.dumps(OVERLOAD_DELTA))).kind is O


def test_body_error() -> None:
    api = OpenAIResponses()
    http_503 = {
        "error": {
            "type": "service_unavailable_error",
            "code": "server_is_overloaded",
            "message": "Our servers are currently overloaded. Please try again later.",
            "param": None,
        }
    }
    info = api.body_error(http_503)
    assert info is not None and info.code == "server_is_overloaded"
    assert ErrorPolicy().decide(info) is Decision.RETRY
    failed = {
        "id": "resp_1",
        "object": "response",
        "status": "failed",
        "error": {"code": "context_length_exceeded", "message": "Your input exceeds the context window of this model."},
        "output": [],
    }
    info = api.body_error(failed)
    assert info is not None and ErrorPolicy().decide(info) is Decision.NEXT_UPSTREAM
    ok: dict[str, object] = {"id": "resp_2", "object": "response", "status": "completed", "error": None, "output": []}
    assert api.body_error(ok) is None
    assert api.body_error([1, 2]) is None


def test_error_event_parses_back_as_a_failure() -> None:
    api = OpenAIResponses()
    raw = api.error_event("upstream stream was cut", "server_error")
    assert raw.startswith(b"event: error\ndata: ") and raw.endswith(b"\n\n")
    results, complete = run(raw)
    assert [result.kind for result in results] == [F] and not complete
    info = results[0].error
    assert info is not None
    assert (info.code, info.type, info.message) == ("server_error", "server_error", "upstream stream was cut")
    assert ErrorPolicy().decide(info) is Decision.RETRY
    body = api.error_body("no upstream answered", "bad_gateway")
    assert api.body_error(json.loads(body)) == ErrorInfo(
        code="bad_gateway", type="server_error", message="no upstream answered", event_type="body"
    )


def test_error_event_satisfies_flat_and_nested_forms() -> None:
    raw = OpenAIResponses().error_event("Our servers are currently overloaded.", "server_is_overloaded")
    frame = FrameSplitter().feed(raw)[0]
    assert frame.event.event == "error"  # openai-node rejects any `event: error`
    payload = frame.event.json()
    flat = openai.types.responses.ResponseErrorEvent.model_validate(payload)
    assert (flat.type, flat.code, flat.message) == ("error", "server_is_overloaded", payload["message"])
    event = TypeAdapter(openai.types.responses.ResponseStreamEvent).validate_python(payload)
    assert isinstance(event, openai.types.responses.ResponseErrorEvent)
    assert payload["error"]["code"] == "server_is_overloaded" and payload["error"]["message"]


def _openai_client(status: int, body: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type}, content=body)

    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def test_openai_python_raises_on_error_event() -> None:
    api = OpenAIResponses()
    head = (FIXTURES / "responses_overload_canonical.sse").read_bytes().split(b"event: error")[0]
    body = head + api.error_event("upstream stream was cut", "server_error")
    client = _openai_client(200, body, "text/event-stream")
    seen: list[str] = []
    with pytest.raises(openai.APIError) as raised:
        for event in client.responses.create(model="gpt-test", input="hi", stream=True):
            seen.append(event.type)
    assert seen == ["response.created", "response.in_progress"]
    assert raised.value.message == "upstream stream was cut"
    assert raised.value.code == "server_error"


def test_openai_python_reads_error_body() -> None:
    body = OpenAIResponses().error_body("no upstream answered", "bad_gateway")
    client = _openai_client(502, body, "application/json")
    with pytest.raises(openai.InternalServerError) as raised:
        client.responses.create(model="gpt-test", input="hi")
    assert (raised.value.status_code, raised.value.code, raised.value.type) == (
        502,
        "bad_gateway",
        "server_error",
    )


@pytest.mark.parametrize("data", [
    {"type": "response.completed", "status": 500, "status_code": 503,
     "response": {"id": "r", "status": "completed", "error": None, "output": []}},
    {"type": "response.output_text.delta", "status": 429, "item_id": "m", "output_index": 0, "content_index": 0,
     "delta": "hi"},
    {"type": "response.output_item.done", "status_code": 500, "output_index": 0,
     "item": {"id": "m", "type": "message", "status": "completed", "content": []}},
    {"type": "response.in_progress", "status": 503, "error": None, "response": {"id": "r", "status": "in_progress"}},
])
def test_a_top_level_status_on_an_answer_event_is_no_failure(data: dict[str, object]) -> None:
    """Only an `error` message's status counts (the WebSocket's HTTP error): the same
    field on any other event, or a `status` inside it, says nothing of a failure."""
    seen = one(data)
    assert seen.kind is not FrameKind.FAILURE and seen.error is None
