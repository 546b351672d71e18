"""Anthropic Messages classifier against wire fixtures from the reference.

Each fixture holds the reference's lines byte for byte (whitespace padding
included), every event ended by its blank line; lone `…` lines were dropped,
and a bare JSON object is wrapped in `event:`/`data:` lines.  SOURCES says
which section each came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx2
import pytest

from switchyard_core.apis import APIS
from switchyard_core.apis.anthropic_messages import AnthropicMessages
from switchyard_core.apis.base import Classification, ErrorInfo, FrameKind
from switchyard_core.apis.errors import Decision, ErrorPolicy
from switchyard_core.sse import FrameSplitter

FIXTURES = Path(__file__).parent / "fixtures"

SOURCES = {
    "anthropic_normal_text.sse": "§3.1 normal text stream [REC]",
    "anthropic_tool_use.sse": "§3.2 tool_use + input_json_delta [REC], elision line dropped",
    "anthropic_thinking_signature.sse": "§3.3 thinking / signature, elision line dropped",
    "anthropic_server_tool_use.sse": "§3.3 server_tool_use",
    "anthropic_redacted_thinking_citations.sse": "§3.3 redacted_thinking and citations_delta [CONSTRUCTED]",
    "anthropic_refusal_no_content.sse": "§3.4 refusal with no content",
    "anthropic_overloaded_error_first.sse": "§3.5 in-stream overloaded_error as the first event",
    "anthropic_error_after_ping.sse": "§3.5 case 2, coder/aibridge error after message_start, content_block_start, ping",
    "anthropic_overloaded_error_request_id.sse": "§3.5 compact error with request_id, wrapped",
    "anthropic_error_after_partial_text.sse": "§3.5 case 3: §3.1 frames through the first text_delta, then §3.5's error",
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
    type: str | None
    message: str


@dataclass(frozen=True)
class Case:
    fixture: str
    kinds: list[FrameKind]
    complete: bool
    failures: list[Failure] = field(default_factory=list)


OVERLOADED = Failure(Decision.RETRY, "overloaded_error", "Overloaded")

CASES = [
    Case("anthropic_normal_text.sse", [L, L, K, O, O, O, O, L, O, T], True),
    Case("anthropic_tool_use.sse", [O, K, O, O, L, O], False),
    Case("anthropic_thinking_signature.sse", [L, K, O, O, O, L], False),
    Case("anthropic_server_tool_use.sse", [O, O, O], False),
    Case("anthropic_redacted_thinking_citations.sse", [O, O], False),
    Case("anthropic_refusal_no_content.sse", [L, L, L, O, T], True),
    Case("anthropic_overloaded_error_first.sse", [F], False, [OVERLOADED]),
    Case(
        "anthropic_error_after_ping.sse",
        [L, L, K, F],
        False,
        [Failure(Decision.RETRY, "api_error", "Overloaded")],
    ),
    Case("anthropic_overloaded_error_request_id.sse", [F], False, [OVERLOADED]),
    Case("anthropic_error_after_partial_text.sse", [L, L, K, O, F], False, [OVERLOADED]),
]


def run(raw: bytes, chunk: int | None = None) -> tuple[list[Classification], bool]:
    """Split `raw` as the relay would and classify every frame with a fresh stream."""
    splitter = FrameSplitter()
    frames = []
    step = chunk or len(raw) or 1
    for start in range(0, len(raw), step):
        frames += splitter.feed(raw[start : start + step])
    frames += splitter.finish()
    stream = AnthropicMessages().stream_classifier()
    return [stream.classify(frame.event) for frame in frames], stream.complete


def one(data: dict[str, object] | str, event: str | None = None) -> Classification:
    line = data if isinstance(data, str) else json.dumps(data)
    raw = (f"event: {event}\n" if event else "") + f"data: {line}\n\n"
    results, _ = run(raw.encode())
    assert len(results) == 1
    return results[0]


def test_every_anthropic_fixture_has_a_source_and_a_case() -> None:
    on_disk = {path.name for path in FIXTURES.glob("anthropic_*.sse")}
    assert on_disk == set(SOURCES)
    assert {case.fixture for case in CASES} == set(SOURCES)


def test_registered_under_its_name() -> None:
    assert isinstance(APIS["anthropic-messages"], AnthropicMessages)


def test_fixtures_keep_anthropics_whitespace_padding() -> None:
    raw = (FIXTURES / "anthropic_normal_text.sse").read_bytes()
    assert b'data: {"type":"message_stop"              }\n\n' in raw


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
        assert (ErrorPolicy().decide(info), info.type, info.message) == (
            expected.decision,
            expected.type,
            expected.message,
        )
        assert info.event_type == "error"
    for result in results:
        if result.kind is not K:
            assert result.event_type


def test_refusal_without_content_commits_and_completes() -> None:
    results, complete = run((FIXTURES / "anthropic_refusal_no_content.sse").read_bytes())
    assert not any(result.kind in (F, E) for result in results)
    assert results[3] == Classification(O, "message_delta")
    assert results[4] == Classification(T, "message_stop")
    assert complete


@pytest.mark.parametrize(
    "data, kind",
    [
        ({"type": "ping"}, K),
        ({"type": "message_start", "message": {"id": "m", "content": []}}, L),
        ({"type": "message_start", "message": {"id": "m", "content": [{"type": "text", "text": "Hi"}]}}, O),
        ({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, L),
        (
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": "", "citations": []},
            },
            L,
        ),
        ({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "Hi"}}, O),
        (
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
            L,
        ),
        (
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            },
            O,
        ),
        ({"type": "content_block_start", "index": 0, "content_block": {"type": "container_upload"}}, O),
        ({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}, O),
        ({"type": "content_block_delta", "index": 0, "delta": {"type": "brand_new_delta"}}, O),
        ({"type": "content_block_stop", "index": 0}, L),
        ({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 0}}, O),
        ({"type": "message_stop"}, T),
        ({"type": "brand_new_event"}, O),
    ],
    ids=lambda value: value["type"] if isinstance(value, dict) else str(value.value),
)
def test_event_kinds(data: dict[str, object], kind: FrameKind) -> None:
    assert one(data).kind is kind
    assert one(data, event=str(data["type"])).kind is kind


def test_unknown_event_fails_closed_with_its_type() -> None:
    assert one({"type": "brand_new_event"}) == Classification(O, "brand_new_event")
    assert one("not json", event="brand_new_event") == Classification(O, "brand_new_event")


def test_comments_and_ping_without_data_are_keepalive() -> None:
    results, complete = run(b": keep-alive\n\nevent: ping\n\n")
    assert [result.kind for result in results] == [K, K] and not complete


def test_error_without_event_line_or_data() -> None:
    data_only = one({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert data_only.kind is F and data_only.error is not None
    assert data_only.error.type == "overloaded_error"
    assert run(b"event: error\n\n")[0][0].kind is F
    not_json = one("Overloaded", event="error")
    assert not_json.kind is F and not_json.error is not None
    assert not_json.error.message == "Overloaded"
    bare, _ = run(b'{"type":"error","error":{"type":"api_error","message":"Internal server error"}}\n\n')
    assert bare[0].kind is F and bare[0].event_type == "error"


@pytest.mark.parametrize(
    "error_type, message, decision",
    [
        ("overloaded_error", "Overloaded", Decision.RETRY),
        ("api_error", "Internal server error", Decision.RETRY),
        ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit", Decision.RETRY),
        ("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum", Decision.NEXT_UPSTREAM),
        ("invalid_request_error", "messages: roles must alternate", Decision.FATAL),
        ("authentication_error", "invalid x-api-key", Decision.FATAL),
        ("permission_error", "Your API key does not have permission", Decision.FATAL),
    ],
)
def test_in_stream_error_types(error_type: str, message: str, decision: Decision) -> None:
    data = '{"type": "error", "error": {"type": "%s", "message": "%s"}      }' % (error_type, message)
    result = one(data, event="error")
    assert result.kind is F and result.error is not None
    assert result.error.type == error_type
    assert ErrorPolicy().decide(result.error) is decision


def test_done_sentinel_from_a_gateway() -> None:
    results, complete = run(b"data: [DONE]\n\n")
    assert [result.kind for result in results] == [E] and complete
    raw = (FIXTURES / "anthropic_tool_use.sse").read_bytes() + b"data: [DONE]\n\n"
    assert run(raw)[0][-1] == Classification(T, "[DONE]")


def test_body_error() -> None:
    api = AnthropicMessages()
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    info = api.body_error(overloaded)
    assert info is not None and info.type == "overloaded_error"
    assert ErrorPolicy().decide(info) is Decision.RETRY
    with_id = dict(overloaded, request_id="req_011CZAau32QzxDkriovTaFCB")
    assert api.body_error(with_id) == info
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "stop_reason": "refusal"}
    assert api.body_error(message) is None
    assert api.body_error("Overloaded") is None


def test_error_event_parses_back_as_a_failure() -> None:
    api = AnthropicMessages()
    raw = api.error_event("upstream stream was cut", "server_error")
    assert raw.startswith(b"event: error\ndata: ") and raw.endswith(b"\n\n")
    results, complete = run(raw)
    assert [result.kind for result in results] == [F] and not complete
    info = results[0].error
    assert info is not None
    assert (info.type, info.message) == ("api_error", "upstream stream was cut")
    assert ErrorPolicy().decide(info) is Decision.RETRY
    body = api.error_body("no upstream answered", "bad_gateway")
    assert json.loads(body) == {"type": "error", "error": {"type": "api_error", "message": "no upstream answered"}}
    assert api.body_error(json.loads(body)) == ErrorInfo(
        type="api_error", message="no upstream answered", event_type="body"
    )


def test_a_forwarded_error_event_keeps_the_providers_type() -> None:
    """After the pre-answer keepalive, a provider's fatal error reaches the client in
    band: with its own type, or a client's retry policy would retry a bad key."""
    raw = AnthropicMessages().error_event("invalid x-api-key", "authentication_error", "authentication_error")
    results, _ = run(raw)
    info = results[0].error
    assert info is not None
    assert (info.type, info.message) == ("authentication_error", "invalid x-api-key")
    assert ErrorPolicy().decide(info) is Decision.FATAL


def _anthropic_client(status: int, body: bytes, content_type: str) -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type}, content=body)

    return anthropic.Anthropic(
        api_key="sk-ant-test",
        base_url="http://upstream.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def test_anthropic_sdk_raises_on_error_event() -> None:
    api = AnthropicMessages()
    head = (FIXTURES / "anthropic_error_after_ping.sse").read_bytes().split(b"event: error")[0]
    body = head + api.error_event("upstream stream was cut", "server_error")
    client = _anthropic_client(200, body, "text/event-stream; charset=utf-8")
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as raised:
        stream = client.messages.create(
            model="claude-test",
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        for event in stream:
            seen.append(event.type)
    assert seen == ["message_start", "content_block_start"]
    assert raised.value.type == "api_error"
    assert raised.value.api_message == "upstream stream was cut"


def test_anthropic_sdk_reads_error_body() -> None:
    body = AnthropicMessages().error_body("no upstream answered", "bad_gateway")
    client = _anthropic_client(502, body, "application/json")
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(
            model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    assert raised.value.status_code == 502
    assert (raised.value.type, raised.value.api_message) == ("api_error", "no upstream answered")


def test_anthropic_sdk_accepts_the_refusal_fixture() -> None:
    body = (FIXTURES / "anthropic_refusal_no_content.sse").read_bytes()
    client = _anthropic_client(200, body, "text/event-stream; charset=utf-8")
    stream = client.messages.create(
        model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert [event.type for event in stream] == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
