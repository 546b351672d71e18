"""OpenAI Chat Completions stream classifier (DESIGN §3) on wire fixtures.

Fixtures live in tests/fixtures/chat_*.sse. FIXTURES below names, for each
file, the section of reference/provider-sse-shapes.md it comes from and how:
"verbatim" is a byte-exact copy of one wire example (lines the reference
elides with "…" are left out, nothing else changes); "composite" joins
verbatim frames from the named sections; "constructed" follows a shape the
section describes in words but does not quote byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard_core.apis.base import Classification, ErrorInfo, FrameKind
from switchyard_core.apis.errors import Decision, ErrorPolicy, http_error_info
from switchyard_core.apis.openai_chat import ChatStream, OpenAIChat
from switchyard_core.sse import FrameSplitter, parse_frame

FIXTURE_DIR = Path(__file__).parent / "fixtures"

K, L, O, T, F, E = (
    FrameKind.KEEPALIVE,
    FrameKind.LIFECYCLE,
    FrameKind.OUTPUT,
    FrameKind.TERMINAL,
    FrameKind.FAILURE,
    FrameKind.EMPTY_END,
)
RETRY, NEXT, FATAL = Decision.RETRY, Decision.NEXT_UPSTREAM, Decision.FATAL

# file -> (reference section, provenance)
FIXTURES: dict[str, tuple[str, str]] = {
    "chat_normal_stream.sse": ("§1.1", "verbatim (openai-python snapshot e2aad469), elided frames left out"),
    "chat_tool_calls_parallel.sse": ("§1.3", "verbatim (snapshot f82268f2), elided frames left out; no blank line after [DONE]"),
    "chat_refusal_stream.sse": ("§1.4", "verbatim (snapshot 173417d5), elided frames left out; no blank line at the end"),
    "chat_go_openai_error_data_prefix.sse": ("§1.5(b)", "verbatim (go-openai TestCreateChatCompletionStreamErrorWithDataPrefix)"),
    "chat_role_then_error.sse": ("§1.1 + §1.5(b)", "composite: §1.1 role chunk, then the coder/aibridge error line; §9 #2"),
    "chat_error_after_content.sse": ("§1.1 + §1.5(b)", "composite: aibridge role chunk (§1.1), a content chunk rebuilt from it "
                                     "(the reference elides its middle), then the aibridge error line"),
    "chat_openrouter_keepalive_content.sse": ("§5", "verbatim (OpenRouter normal chunk after a keepalive comment)"),
    "chat_openrouter_docs_midstream_error.sse": ("§5", "verbatim (OpenRouter docs mid-stream error, code \"server_error\")"),
    "chat_openrouter_keepalive_error_502.sse": ("§5", "composite: 3x `: OPENROUTER PROCESSING` + observed 502 variant + [DONE]; §9 #4"),
    "chat_openrouter_keepalive_error_429.sse": ("§5", "composite: 3x keepalive + observed 429 variant + [DONE]"),
    "chat_openrouter_keepalive_error_504.sse": ("§5", "composite: 3x keepalive + observed 504 variant + [DONE]"),
    "chat_empty_choices_error.sse": ("§5", "constructed: OmniRoute PR #8210 empty-choices chunk with a top-level error "
                                     "(text quoted; code 429 chosen); §9 #5"),
    "chat_azure_prompt_filter_role.sse": ("§6.1", "verbatim (quarkus-langchain4j recorded Azure stream)"),
    "chat_azure_prompt_filter_role_error_429.sse": ("§6.1", "composite: §6.1 frames + the §6.1 Azure 429 error body as a data line; §9 #3"),
    "chat_vllm_error_first.sse": ("§6.2", "verbatim (wire form constructed in the reference from vLLM source); §9 #1"),
    "chat_vllm_error_500_first.sse": ("§6.2", "constructed: the §6.2 form with the InternalServerError/500 values §6.2 lists"),
    "chat_ollama_bare_error.sse": ("§6.3", "verbatim (bare error line, no data: prefix); §9 #15"),
    "chat_go_openai_bare_multiline_error.sse": ("§0.6", "constructed from go-openai TestCreateChatCompletionStreamError "
                                                "(each line + \"\\n\", no blank line)"),
    "chat_deepseek_reasoning.sse": ("§6.4", "verbatim (deepseek-v4-pro curl capture)"),
    "chat_deepseek_keepalive_insufficient_resource.sse": ("§6.4", "constructed: 3x `: keep-alive` + the §6.4 first chunk with "
                                                          "finish_reason insufficient_system_resource and no content; §9 #17"),
    "chat_event_error_overloaded.sse": ("§8 #1, §1.6", "constructed: `event: error` with the nested error object, "
                                        "code server_is_overloaded / type service_unavailable_error as §8 #1 lists"),
    "chat_done_only.sse": ("§6.2 (vLLM PR #40986), §9 #16", "constructed: `data: [DONE]` alone"),
}

# file -> (frame kinds in order, complete at EOF or None, decision for the failure or None)
EXPECTED: dict[str, tuple[list[FrameKind], bool | None, Decision | None]] = {
    "chat_normal_stream.sse": ([L, O, O, O, O, L, T], True, None),
    "chat_tool_calls_parallel.sse": ([L, L, O, L, O, O, L, T], True, None),
    "chat_refusal_stream.sse": ([L, O, O], True, None),
    "chat_openrouter_keepalive_content.sse": ([K, O], False, None),
    "chat_azure_prompt_filter_role.sse": ([L, L], False, None),
    "chat_deepseek_reasoning.sse": ([L, O, O], False, None),
    "chat_go_openai_error_data_prefix.sse": ([F, E], None, RETRY),
    "chat_role_then_error.sse": ([L, F], None, RETRY),
    "chat_error_after_content.sse": ([L, O, F], None, RETRY),
    "chat_openrouter_docs_midstream_error.sse": ([F], None, RETRY),
    "chat_openrouter_keepalive_error_502.sse": ([K, K, K, F, E], None, RETRY),
    "chat_openrouter_keepalive_error_429.sse": ([K, K, K, F, E], None, RETRY),
    "chat_openrouter_keepalive_error_504.sse": ([K, K, K, F, E], None, RETRY),
    "chat_empty_choices_error.sse": ([F], None, RETRY),
    "chat_azure_prompt_filter_role_error_429.sse": ([L, L, F], None, RETRY),
    "chat_vllm_error_first.sse": ([F, E], None, FATAL),
    "chat_vllm_error_500_first.sse": ([F, E], None, RETRY),
    "chat_ollama_bare_error.sse": ([F], None, RETRY),
    "chat_go_openai_bare_multiline_error.sse": ([F], None, FATAL),
    "chat_deepseek_keepalive_insufficient_resource.sse": ([K, K, K, F], None, RETRY),
    "chat_event_error_overloaded.sse": ([F], None, RETRY),
    "chat_done_only.sse": ([E], None, None),
}


def read_fixture(name: str) -> bytes:
    return (FIXTURE_DIR / name).read_bytes()


def classify_chunks(chunks: list[bytes]) -> tuple[list[tuple[bytes, Classification]], ChatStream]:
    splitter = FrameSplitter()
    stream = OpenAIChat().stream_classifier()
    out: list[tuple[bytes, Classification]] = []
    frames = []
    for chunk in chunks:
        frames.extend(splitter.feed(chunk))
    frames.extend(splitter.finish())
    for frame in frames:
        out.append((frame.raw, stream.classify(frame.event)))
    return out, stream


def classify_bytes(data: bytes) -> tuple[list[tuple[bytes, Classification]], ChatStream]:
    return classify_chunks([data])


def classify_obj(obj: Any, stream: ChatStream | None = None) -> Classification:
    stream = stream or ChatStream()
    return stream.classify(parse_frame(b"data: " + json.dumps(obj).encode() + b"\n\n"))


def chunk(delta: Any, finish_reason: Any = None, **choice_extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    choice.update(choice_extra)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1727346168,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_5050236cbd",
        "choices": [choice],
    }


# ---------------------------------------------------------------------------
# fixtures


def test_every_fixture_is_listed() -> None:
    on_disk = {p.name for p in FIXTURE_DIR.glob("chat_*.sse")}
    assert on_disk == set(FIXTURES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_kinds(name: str) -> None:
    kinds, complete, decision = EXPECTED[name]
    data = read_fixture(name)
    result, stream = classify_bytes(data)
    assert b"".join(raw for raw, _ in result) == data
    assert [c.kind for _, c in result] == kinds
    if complete is not None:
        assert stream.complete is complete
    failures = [c for _, c in result if c.kind is F]
    if decision is None:
        assert not failures
    else:
        assert len(failures) == 1
        info = failures[0].error
        assert isinstance(info, ErrorInfo)
        assert ErrorPolicy().decide(info) is decision
    # commits exactly when DESIGN says: output and terminal only
    for _, c in result:
        assert c.commits is (c.kind in (O, T))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_same_result_byte_by_byte(name: str) -> None:
    data = read_fixture(name)
    whole, whole_stream = classify_bytes(data)
    bytewise, bytewise_stream = classify_chunks([data[i : i + 1] for i in range(len(data))])
    assert bytewise == whole
    assert bytewise_stream.complete == whole_stream.complete


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(EXPECTED)), st.lists(st.floats(0, 1), max_size=8))
def test_fixture_same_result_any_chunking(name: str, cuts: list[float]) -> None:
    data = read_fixture(name)
    points = sorted({int(c * len(data)) for c in cuts})
    chunks, last = [], 0
    for p in points:
        chunks.append(data[last:p])
        last = p
    chunks.append(data[last:])
    assert classify_chunks(chunks)[0] == classify_bytes(data)[0]


@pytest.mark.parametrize("name", ["chat_normal_stream.sse", "chat_tool_calls_parallel.sse"])
def test_fixture_crlf_and_cr_variants_classify_the_same(name: str) -> None:
    data = read_fixture(name)
    expected = [c for _, c in classify_bytes(data)[0]]
    for eol in (b"\r\n", b"\r"):
        variant = data.replace(b"\n", eol)
        assert [c for _, c in classify_bytes(variant)[0]] == expected


def test_normal_stream_shape() -> None:
    result, stream = classify_bytes(read_fixture("chat_normal_stream.sse"))
    kinds = [c.kind for _, c in result]
    assert kinds[0] is L  # role chunk
    assert kinds[-3] is O and result[-3][1].event_type == "finish"
    assert kinds[-2] is L  # usage chunk, choices []
    assert b'"usage"' in result[-2][0]
    assert kinds[-1] is T and result[-1][1].event_type == "[DONE]"
    assert stream.complete


@pytest.mark.parametrize("usage_expected, seen_complete", [
    # not complete before the finish chunk (index 4); complete from then on
    (False, [False, False, False, False, True, True, True]),
    # `stream_options.include_usage`: a stream cut between the finish chunk and the usage
    # chunk would lose the client's token count without a word: the usage chunk (5) ends it
    (True, [False, False, False, False, False, True, True]),
], ids=["finish-ends-it", "usage-asked-for"])
def test_complete_only_after_the_end_marker(usage_expected: bool, seen_complete: list[bool]) -> None:
    data = read_fixture("chat_normal_stream.sse")
    splitter, stream = FrameSplitter(), ChatStream(usage_expected)
    frames = splitter.feed(data) + splitter.finish()
    seen = []
    for frame in frames:
        stream.classify(frame.event)
        seen.append(stream.complete)
    assert seen == seen_complete


def test_with_usage_asked_for_the_frames_after_the_finish_get_a_look() -> None:
    data = read_fixture("chat_normal_stream.sse")
    frames = FrameSplitter().feed(data)
    usage = frames[5].raw
    assert b'"usage":{' in usage
    stream = ChatStream(usage_expected=True)
    for frame in frames[:5]:
        stream.classify(frame.event)
    assert stream.worth_a_look(usage)  # after the last finish: every frame until the usage came
    stream.classify(frames[5].event)
    assert stream.complete and not stream.worth_a_look(frames[2].raw)
    # without usage asked for, a usage chunk after the finish is not worth a parse
    plain = ChatStream()
    for frame in frames[:5]:
        plain.classify(frame.event)
    assert plain.complete and not plain.worth_a_look(usage)


def test_with_usage_asked_for_done_still_ends_the_stream() -> None:
    stream = ChatStream(usage_expected=True)
    classify_obj(chunk({"content": "a"}), stream)
    classify_obj(chunk({}, "stop"), stream)
    assert not stream.complete
    stream.classify(parse_frame(b"data: [DONE]\n\n"))
    assert stream.complete


def test_usage_beside_the_finish_reason_completes_at_once() -> None:
    """Some compatible servers put the usage in the finish chunk itself."""
    stream = ChatStream(usage_expected=True)
    classify_obj(chunk({"content": "a"}), stream)
    last = chunk({}, "stop")
    last["usage"] = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    classify_obj(last, stream)
    assert stream.complete


def test_complete_needs_every_choice_finished() -> None:
    stream = ChatStream()
    two = chunk({"role": "assistant", "content": ""})
    two["choices"].append({"index": 1, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    assert classify_obj(two, stream).kind is L
    assert classify_obj(chunk({"content": "a"}), stream).kind is O
    assert classify_obj(chunk({}, "stop"), stream).kind is O
    assert not stream.complete
    one = chunk({}, "stop")
    one["choices"][0]["index"] = 1
    classify_obj(one, stream)
    assert stream.complete


def test_done_only_is_empty_end() -> None:
    result, _ = classify_bytes(read_fixture("chat_done_only.sse"))
    assert [c.kind for _, c in result] == [E]
    assert not result[0][1].commits


def test_lifecycle_only_stream_is_not_complete() -> None:
    # EOF after lifecycle frames: the gate turns this into a retryable failure
    _, stream = classify_bytes(read_fixture("chat_azure_prompt_filter_role.sse"))
    assert not stream.complete


# ---------------------------------------------------------------------------
# §1.2 role-only first-chunk variants: all lifecycle

ROLE_ONLY_VARIANTS: dict[str, dict[str, Any]] = {
    "text": chunk({"role": "assistant", "content": "", "refusal": None}),
    "refusal coming": chunk({"role": "assistant", "content": None, "refusal": ""}),
    "immediate tool call": chunk(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_4XzlGBLtUe9dy3GVNV4jhq7h",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ],
            "refusal": None,
        }
    ),
    "role only, tool calls follow": chunk({"role": "assistant", "content": None}),
    "with logprobs": chunk(
        {"role": "assistant", "content": "", "refusal": None}, logprobs={"content": [], "refusal": None}
    ),
    "vLLM": chunk({"role": "assistant", "content": ""}),
    "DeepSeek reasoner": chunk({"role": "assistant", "content": None, "reasoning_content": ""}),
    "Azure role chunk": chunk({"content": "", "refusal": None, "role": "assistant"}, content_filter_results={}),
    "Azure prompt_filter_results": {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [
            {"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False, "severity": "safe"}}}
        ],
    },
    "usage null on every chunk (§1.1 newer traffic)": {
        **chunk({"role": "assistant", "content": "", "refusal": None}),
        "service_tier": "default",
        "usage": None,
        "obfuscation": "zRj",
    },
    "empty delta": chunk({}),
    "usage-only chunk, choices []": {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 14, "completion_tokens": 30, "total_tokens": 44},
    },
    "usage-only chunk, no choices": {"id": "chatcmpl-test", "usage": {"prompt_tokens": 14}},
    "tool-call header, arguments empty (§1.3)": chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_DNYTawLBoN8fj3KN6qU9N1Ou",
                    "type": "function",
                    "function": {"name": "get_stock_price", "arguments": ""},
                }
            ]
        }
    ),
    "empty tool_calls list": chunk({"role": "assistant", "tool_calls": []}),
}


@pytest.mark.parametrize("obj", list(ROLE_ONLY_VARIANTS.values()), ids=list(ROLE_ONLY_VARIANTS))
def test_role_only_variants_are_lifecycle(obj: dict[str, Any]) -> None:
    stream = ChatStream()
    result = classify_obj(obj, stream)
    assert result.kind is L
    assert not result.commits
    assert not stream.complete


def test_role_only_fixture_frames_are_lifecycle() -> None:
    for name, index in [
        ("chat_normal_stream.sse", 0),
        ("chat_tool_calls_parallel.sse", 0),
        ("chat_refusal_stream.sse", 0),
        ("chat_deepseek_reasoning.sse", 0),
        ("chat_azure_prompt_filter_role.sse", 0),
        ("chat_azure_prompt_filter_role.sse", 1),
    ]:
        result, _ = classify_bytes(read_fixture(name))
        assert result[index][1].kind is L, (name, index)


# ---------------------------------------------------------------------------
# output

OUTPUT_DELTAS: dict[str, dict[str, Any]] = {
    "content": chunk({"content": "I'm"}),
    "content with role (OpenRouter §5)": chunk({"content": "Hello", "role": "assistant"}, native_finish_reason=None),
    "tool-call arguments (§1.3)": chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
    "tool-call header with arguments": chunk(
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    ),
    "legacy function_call": chunk({"role": "assistant", "function_call": {"name": "f", "arguments": ""}}),
    "refusal (§1.4)": chunk({"refusal": "I'm"}),
    "reasoning_content (DeepSeek §6.4)": chunk({"content": None, "reasoning_content": "我们需要"}),
    "reasoning (Ollama §6.3)": {
        **chunk({"role": "assistant", "content": "", "reasoning": "Let me think"}),
        "system_fingerprint": "fp_ollama",
    },
    "unknown new delta field fails closed": chunk({"role": "assistant", "audio": {"id": "a1", "data": "UklG"}}),
    "finish_reason stop": chunk({}, "stop"),
    "finish_reason length": chunk({}, "length"),
    "finish_reason tool_calls": chunk({}, "tool_calls"),
    "finish_reason content_filter (Azure §6.1)": chunk({}, "content_filter"),
}


@pytest.mark.parametrize("obj", list(OUTPUT_DELTAS.values()), ids=list(OUTPUT_DELTAS))
def test_output_deltas(obj: dict[str, Any]) -> None:
    result = classify_obj(obj)
    assert result.kind is O
    assert result.commits


def test_tool_call_arguments_in_fixture_are_output() -> None:
    result, _ = classify_bytes(read_fixture("chat_tool_calls_parallel.sse"))
    for raw, c in result:
        if b'"arguments":"{' in raw or b'"arguments":"}"' in raw:
            assert c.kind is O, raw
        elif b'"arguments":""' in raw:
            assert c.kind is L, raw


def test_refusal_delta_in_fixture_is_output() -> None:
    result, _ = classify_bytes(read_fixture("chat_refusal_stream.sse"))
    assert b'"refusal":"I\'m"' in result[1][0]
    assert result[1][1].kind is O


@pytest.mark.parametrize("data", [b"data: not json\n\n", b"data: [1,2]\n\n", b'data: {"choices": "x"}\n\n',
                                  b'data: {"choices": [1]}\n\n', b'data: {"id": "x"}\n\n', b"data: 42\n\n"])
def test_unknown_data_fails_closed_as_output(data: bytes) -> None:
    assert ChatStream().classify(parse_frame(data)).kind is O


def test_comment_frames_are_keepalive() -> None:
    stream = ChatStream()
    for raw in (b": OPENROUTER PROCESSING\n\n", b": keep-alive\n\n", b": ping\r\n\r\n", b"\n"):
        result = stream.classify(parse_frame(raw))
        assert result.kind is K
        assert not result.commits


# ---------------------------------------------------------------------------
# failures


def first_failure(name: str) -> ErrorInfo:
    result, _ = classify_bytes(read_fixture(name))
    failures = [c for _, c in result if c.kind is F]
    assert failures, name
    info = failures[0].error
    assert info is not None
    return info


def test_vllm_integer_code_first_frame() -> None:
    info = first_failure("chat_vllm_error_first.sse")
    assert (info.status, info.type, info.message) == (400, "BadRequestError", "…")
    info = first_failure("chat_vllm_error_500_first.sse")
    assert (info.status, info.type) == (500, "InternalServerError")


@pytest.mark.parametrize(
    "name,status,message",
    [
        ("chat_openrouter_keepalive_error_502.sse", 502, "Provider disconnected unexpectedly"),
        ("chat_openrouter_keepalive_error_429.sse", 429, "Provider returned error"),
        ("chat_openrouter_keepalive_error_504.sse", 504, "Upstream idle timeout exceeded"),
    ],
)
def test_openrouter_finish_reason_error_variants(name: str, status: int, message: str) -> None:
    info = first_failure(name)
    assert info.status == status
    assert info.message == message
    assert ErrorPolicy().decide(info) is RETRY


def test_openrouter_docs_string_code() -> None:
    info = first_failure("chat_openrouter_docs_midstream_error.sse")
    assert info.code == "server_error"
    assert info.message == "Provider disconnected unexpectedly"


def test_empty_choices_top_level_error() -> None:
    info = first_failure("chat_empty_choices_error.sse")
    assert info.status == 429
    assert "Worker local total request limit" in info.message


def test_azure_numeric_string_code() -> None:
    info = first_failure("chat_azure_prompt_filter_role_error_429.sse")
    assert info.status == 429
    assert info.message.startswith("Requests to the Creates a completion")


def test_event_error_framing() -> None:
    result, _ = classify_bytes(read_fixture("chat_event_error_overloaded.sse"))
    c = result[0][1]
    assert c.kind is F and c.event_type == "error"
    assert c.error is not None
    assert c.error.code == "server_is_overloaded"
    assert c.error.event_type == "error"


@pytest.mark.parametrize(
    "raw,decision",
    [
        (b"event: error\ndata: upstream went away\n\n", FATAL),
        (b"event: error\ndata: Our servers are currently overloaded. Please try again later.\n\n", RETRY),
        (b'event: error\ndata: {"type":"error","code":"server_is_overloaded","message":"m"}\n\n', RETRY),
        (b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n', RETRY),
        (b'event: error\ndata: {"message": "nope"}\n\n', FATAL),
    ],
    ids=["text", "overload-text", "flat", "nested-anthropic", "no-error-object"],
)
def test_event_error_any_payload_is_failure(raw: bytes, decision: Decision) -> None:
    c = ChatStream().classify(parse_frame(raw))
    assert c.kind is F
    assert c.error is not None
    assert ErrorPolicy().decide(c.error) is decision


def test_ollama_bare_json_error() -> None:
    data = read_fixture("chat_ollama_bare_error.sse")
    splitter = FrameSplitter()
    assert splitter.feed(data) == []  # only EOF completes it
    frames = splitter.finish()
    assert frames[0].event.bare_json
    c = ChatStream().classify(frames[0].event)
    assert c.kind is F
    assert c.error is not None and c.error.type == "api_error" and c.error.event_type == "bare_json"


def test_go_openai_bare_multiline_error() -> None:
    info = first_failure("chat_go_openai_bare_multiline_error.sse")
    assert (info.code, info.type) == ("invalid_api_key", "invalid_request_error")
    assert info.event_type == "bare_json"


def test_deepseek_insufficient_system_resource_before_content() -> None:
    info = first_failure("chat_deepseek_keepalive_insufficient_resource.sse")
    assert info.code == "insufficient_system_resource"
    assert ErrorPolicy().decide(info) is RETRY


def test_deepseek_insufficient_system_resource_after_content_is_a_finish() -> None:
    # DESIGN §3 makes it a failure only "with no content"; after content it ends the answer
    stream = ChatStream()
    assert classify_obj(chunk({"content": "10"}), stream).kind is O
    c = classify_obj(chunk({"content": ""}, "insufficient_system_resource"), stream)
    assert c.kind is O
    assert stream.complete


def test_error_after_content_is_still_failure() -> None:
    result, _ = classify_bytes(read_fixture("chat_error_after_content.sse"))
    assert [c.kind for _, c in result] == [L, O, F]
    info = result[2][1].error
    assert info is not None and info.type == "server_error"
    # the gate, not the classifier, decides what a failure after output means
    stream = ChatStream()
    classify_obj(chunk({"content": "partial"}), stream)
    assert classify_obj({"error": {"code": 502, "message": "x"}, "choices": [{"delta": {"content": ""}, "finish_reason": "error"}]}, stream).kind is F


def test_finish_reason_error_without_error_object_is_retryable() -> None:
    c = classify_obj({"choices": [{"index": 0, "delta": {}, "finish_reason": "error"}]})
    assert c.kind is F
    assert c.error is not None
    assert ErrorPolicy().decide(c.error) is RETRY


def test_finish_reason_error_with_a_fatal_status_is_fatal() -> None:
    # DESIGN §3: nothing retryable (no overload text, no retryable code, 400 not in
    # retry_on) -> fatal; "finish_reason: error" must not turn a 400 into a retry
    c = classify_obj(
        {
            "error": {"code": 400, "message": "Invalid model specified"},
            "choices": [{"delta": {"content": ""}, "finish_reason": "error"}],
        }
    )
    assert c.kind is F
    assert c.error is not None and c.error.status == 400
    assert ErrorPolicy().decide(c.error) is FATAL


def test_choice_level_error_object() -> None:
    # §5: a detector must check choices[*].error too
    c = classify_obj(
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "error",
                      "error": {"code": 502, "message": "This model is currently experiencing high demand."}}]}
    )
    assert c.kind is F
    assert c.error is not None and c.error.status == 502
    assert ErrorPolicy().decide(c.error) is RETRY


def test_error_null_is_not_an_error() -> None:
    obj = chunk({"role": "assistant", "content": ""})
    obj["error"] = None
    assert classify_obj(obj).kind is L


# ---------------------------------------------------------------------------
# body_error (non-streaming)

NORMAL_COMPLETION = {
    "id": "chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL",
    "object": "chat.completion",
    "created": 1727346168,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 14, "completion_tokens": 2, "total_tokens": 16},
    "system_fingerprint": "fp_5050236cbd",
}


def test_body_error_normal_completion_is_none() -> None:
    api = OpenAIChat()
    assert api.body_error(NORMAL_COMPLETION) is None
    tool = json.loads(json.dumps(NORMAL_COMPLETION))
    tool["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    tool["choices"][0]["finish_reason"] = "tool_calls"
    assert api.body_error(tool) is None
    for body in (None, [], "text", 3, {}):
        assert api.body_error(body) is None


def test_body_error_error_object() -> None:
    body = {"error": {"message": "The server had an error while processing your request. Sorry about that!",
                      "type": "server_error", "param": None, "code": None}}
    info = OpenAIChat().body_error(body)
    assert info is not None
    assert info.type == "server_error"
    assert info.message.startswith("The server had an error")
    assert ErrorPolicy().decide(info) is RETRY


def test_body_error_openrouter_in_band_choice_error() -> None:
    # reference §5, verbatim
    body = json.loads(
        '{"choices":[{"message":{"content":""},"finish_reason":"error","error":{"code":502,"message":"This model is '
        'currently experiencing high demand.","metadata":{"error_type":"provider_unavailable"}}}],'
        '"usage":{"cost":0,"is_byok":true}}'
    )
    info = OpenAIChat().body_error(body)
    assert info is not None
    assert info.status == 502
    assert info.message == "This model is currently experiencing high demand."
    assert ErrorPolicy().decide(info) is RETRY


def test_body_error_deepseek_insufficient_system_resource() -> None:
    body = json.loads(json.dumps(NORMAL_COMPLETION))
    body["choices"][0]["message"]["content"] = ""
    body["choices"][0]["finish_reason"] = "insufficient_system_resource"
    info = OpenAIChat().body_error(body)
    assert info is not None and info.code == "insufficient_system_resource"
    assert ErrorPolicy().decide(info) is RETRY


# ---------------------------------------------------------------------------
# error_event / error_body round-trip


@pytest.mark.parametrize(
    "message,code",
    [
        ("upstream stream cut", "server_error"),
        ("Our servers are currently overloaded.", "server_is_overloaded"),
        ('multi\nline "quoted" message \u00e9\u6211\r\n\n', "server_error"),
    ],
)
def test_error_event_round_trips_as_failure(message: str, code: str) -> None:
    api = OpenAIChat()
    event = api.error_event(message, code)
    for chunks in ([event], [event[i : i + 1] for i in range(len(event))]):
        splitter = FrameSplitter()
        frames = [f for c in chunks for f in splitter.feed(c)]
        assert splitter.finish() == []
        assert [f.raw for f in frames] == [event]  # one complete frame
        for stream in (ChatStream(), _after_output()):
            c = stream.classify(frames[0].event)
            assert c.kind is F
            assert c.error is not None
            assert c.error.code == code
            assert c.error.message == message
            assert ErrorPolicy().decide(c.error) is RETRY
    data = frames[0].event.json()
    assert isinstance(data, dict) and isinstance(data["error"], dict) and data["error"]
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]


def _after_output() -> ChatStream:
    stream = ChatStream()
    classify_obj(chunk({"content": "partial"}), stream)
    return stream


def test_error_body_round_trips() -> None:
    api = OpenAIChat()
    body = json.loads(api.error_body("no upstream answered", "server_error"))
    assert isinstance(body["error"], dict) and body["error"]  # truthy mapping: SDKs raise on it
    assert body["error"]["message"] == "no upstream answered"
    info = api.body_error(body)
    assert info is not None and info.code == "server_error" and info.message == "no upstream answered"
    assert ErrorPolicy().decide(info) is RETRY
    as_http = http_error_info(502, api.error_body("no upstream answered", "server_error"))
    assert (as_http.status, as_http.code) == (502, "server_error")
    assert ErrorPolicy().decide(as_http) is RETRY


def _sdk_client(status: int, content: bytes, content_type: str) -> Any:
    def handler(request: Any) -> Any:
        return httpx2.Response(status, headers={"content-type": content_type}, content=content)

    return openai, openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def test_openai_sdk_raises_on_error_event() -> None:
    event = OpenAIChat().error_event("upstream stream cut", "server_error")
    ok = read_fixture("chat_normal_stream.sse").split(b"\n\n")[0] + b"\n\n"
    openai, client = _sdk_client(200, ok + event, "text/event-stream")
    received = []
    with pytest.raises(openai.APIError) as caught:
        for part in client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            received.append(part)
    assert len(received) == 1  # the role chunk, then the error
    assert caught.value.message == "upstream stream cut"
    assert caught.value.code == "server_error"


def test_openai_sdk_raises_on_error_body() -> None:
    body = OpenAIChat().error_body("no upstream answered", "server_error")
    openai, client = _sdk_client(502, body, "application/json")
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502
    assert caught.value.code == "server_error"
    assert "no upstream answered" in caught.value.message


# ---------------------------------------------------------------------------
# robustness

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["choices", "delta", "error", "finish_reason", "content", "tool_calls", "function",
                         "arguments", "index", "code", "message", "status", "type", "usage", "role", "object"])
        | st.text(max_size=5),
        inner,
        max_size=5,
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_JSON, min_size=1, max_size=4), st.sampled_from([None, "error", "message", "ping"]))
def test_classify_never_raises_on_any_json(objs: list[Any], event_name: str | None) -> None:
    stream = ChatStream()
    for obj in objs:
        raw = (f"event: {event_name}\n".encode() if event_name else b"") + b"data: " + json.dumps(obj).encode() + b"\n\n"
        c = stream.classify(parse_frame(raw))
        assert isinstance(c.kind, FrameKind)
        if c.kind is F:
            assert c.error is not None
            ErrorPolicy().decide(c.error)
        stream.complete
    OpenAIChat().body_error(objs[0])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_classify_never_raises_on_random_bytes(data: bytes) -> None:
    stream = ChatStream()
    splitter = FrameSplitter()
    for frame in splitter.feed(data) + splitter.finish():
        assert isinstance(stream.classify(frame.event).kind, FrameKind)


def _looks_by_search(raw: bytes) -> bool:
    """The after-output check's meaning, written the slow, plain way."""
    import re

    return (b"error" in raw or b"[DONE]" in raw or re.search(rb'"finish_reason"\s*:\s*"', raw) is not None
            or re.search(rb'"index"\s*:\s*[1-9]', raw) is not None)


@settings(max_examples=300, deadline=None)
@given(
    choices=st.lists(
        st.tuples(st.integers(min_value=0, max_value=12), st.sampled_from([None, "stop", "length", "error"]),
                  st.text(max_size=12), st.sampled_from([":", ": ", " : "])),
        min_size=1, max_size=3),
    tool_index=st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
)
def test_the_cheap_after_output_check_looks_wherever_a_search_would(
        choices: list[tuple[int, str | None, str, str]], tool_index: int | None) -> None:
    """The hot path counts instead of searching: it must never skip a frame the
    plain search would look at (a finish reason, another choice, spaced JSON)."""
    parts = []
    for index, finish, text, colon in choices:
        delta: dict[str, Any] = {"content": text}
        if tool_index is not None:
            delta["tool_calls"] = [{"index": tool_index, "function": {"arguments": "{}"}}]
        choice = json.dumps({"index": index, "delta": delta, "finish_reason": finish}, separators=(",", ":"))
        parts.append(choice.replace('":', '"' + colon))
    raw = b'data: {"object":"chat.completion.chunk","choices":[%b]}\n\n' % ",".join(parts).encode()
    assert ChatStream().worth_a_look(raw) is _looks_by_search(raw)
