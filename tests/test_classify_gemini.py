"""Google Gemini classifier against wire fixtures from the reference and from the wild.

Stream fixtures hold the reference's frames (provider-sse-shapes.md §4) byte
for byte, each as `data: …` ended by CRLF CRLF as Gemini frames them; a lone
`, …` elision was dropped.  HTTP error bodies are the bodies issue threads
quoted.  SOURCES says where each came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from switchyard_core.faults import error_body, error_frame
from switchyard_core.frame_report import render
from switchyard_core.apis import APIS, api_for_path
from switchyard_core.apis.base import Classification, FrameKind
from switchyard_core.apis.errors import Decision, ErrorPolicy, http_error_info
from switchyard_core.apis.google_gemini import GoogleGemini
from switchyard_core.apis.google_rpc import DAILY_QUOTA, duration_s
from switchyard_core.retry import plan_after_failure
from switchyard_core.sse import FrameSplitter

FIXTURES = Path(__file__).parent / "fixtures"

SOURCES = {
    "gemini_normal_text.sse": "§4.1 discourse-ai spec fixture (gemini-1.5-pro-002), `, …` in safetyRatings dropped",
    "gemini_vertex_one_frame.sse": "§4.1 Vertex frame (new-api source comment)",
    "gemini_prompt_blocked.sse": "§4.1 non-error terminal: promptFeedback.blockReason, no candidates",
    "gemini_finish_safety.sse": "§4.1 non-error terminal: finishReason SAFETY",
    "gemini_malformed_function_call.sse": "§4.1 discourse-ai fixture, MALFORMED_FUNCTION_CALL (`, …` dropped)",
    "gemini_error_after_text.sse": "§4.2 python-genai tests/client/test_async_stream.py, with the data: prefix",
    "gemini_unavailable_first.sse": "§4.2 OmniRoute #4177 in-stream 503, message in full as continuedev/continue #10639",
    "gemini_resource_exhausted_in_stream.sse": "§4.2 ankit373/hydra #869, 429 on a 200 partway through",
    "gemini_http_503_overloaded.json": "§4.2 BerriAI/litellm #8632 pre-stream 503, pretty-printed",
    "gemini_http_500_internal.json": "§4.2 500 INTERNAL text",
    "gemini_http_429_per_minute.json": "diegosouzapw/OmniRoute #9504 free-tier 429, PerMinute + RetryInfo 38s",
    "gemini_http_429_per_day.json": "googleapis/python-genai #2044 details (PerDay first, RetryInfo 47s), "
                                    "message as in google-gemini/gemini-cli-action #36",
    "gemini_http_400_token_limit.json": "google-gemini/gemini-cli #4118, prompt over the token limit",
    "gemini_http_400_token_limit_array.json": "google-gemini/gemini-cli #6678, the same as a JSON array (no alt=sse)",
    "gemini_http_403_permission_denied.json": "iBUHub/AIStudioToAPI #109, 403 PERMISSION_DENIED",
    "gemini_http_400_api_key_invalid.json": "continuedev/continue #8516, API_KEY_INVALID",
}

K, L, O, T, F = (FrameKind.KEEPALIVE, FrameKind.LIFECYCLE, FrameKind.OUTPUT, FrameKind.TERMINAL,
                 FrameKind.FAILURE)


@dataclass(frozen=True)
class Failure:
    decision: Decision
    status: int | None
    code: str | None


@dataclass(frozen=True)
class Case:
    fixture: str
    kinds: list[FrameKind]
    complete: bool
    failures: list[Failure] = field(default_factory=list)


STREAM_CASES = [
    Case("gemini_normal_text.sse", [O, T], True),
    Case("gemini_vertex_one_frame.sse", [O], True),
    Case("gemini_prompt_blocked.sse", [F], True, [Failure(Decision.FATAL, None, "SAFETY")]),
    Case("gemini_finish_safety.sse", [T], True),
    Case("gemini_malformed_function_call.sse", [T], True),
    Case("gemini_error_after_text.sse", [O, F], False, [Failure(Decision.RETRY, 500, "INTERNAL")]),
    Case("gemini_unavailable_first.sse", [F], False, [Failure(Decision.RETRY, 503, "UNAVAILABLE")]),
    Case("gemini_resource_exhausted_in_stream.sse", [F], False, [Failure(Decision.RETRY, 429, "RESOURCE_EXHAUSTED")]),
]


@dataclass(frozen=True)
class HttpCase:
    fixture: str
    status: int
    decision: Decision
    code: str | None
    retry_after_s: float | None = None


HTTP_CASES = [
    HttpCase("gemini_http_503_overloaded.json", 503, Decision.RETRY, "UNAVAILABLE"),
    HttpCase("gemini_http_500_internal.json", 500, Decision.RETRY, "INTERNAL"),
    HttpCase("gemini_http_429_per_minute.json", 429, Decision.RETRY, "RESOURCE_EXHAUSTED", 38.0),
    HttpCase("gemini_http_429_per_day.json", 429, Decision.NEXT_UPSTREAM, "RESOURCE_EXHAUSTED", 47.0),
    HttpCase("gemini_http_400_token_limit.json", 400, Decision.NEXT_UPSTREAM, "INVALID_ARGUMENT"),
    HttpCase("gemini_http_400_token_limit_array.json", 400, Decision.NEXT_UPSTREAM, "INVALID_ARGUMENT"),
    HttpCase("gemini_http_403_permission_denied.json", 403, Decision.FATAL, "PERMISSION_DENIED"),
    HttpCase("gemini_http_400_api_key_invalid.json", 400, Decision.FATAL, "INVALID_ARGUMENT"),
]


def run(raw: bytes, chunk: int | None = None) -> tuple[list[Classification], bool]:
    """Split `raw` as the relay would and classify every frame with a fresh stream."""
    splitter = FrameSplitter()
    frames = []
    step = chunk or len(raw) or 1
    for start in range(0, len(raw), step):
        frames += splitter.feed(raw[start : start + step])
    frames += splitter.finish()
    stream = GoogleGemini().stream_classifier()
    return [stream.classify(frame.event) for frame in frames], stream.complete


def one(obj: object) -> Classification:
    results, _ = run(b"data: " + json.dumps(obj).encode() + b"\r\n\r\n")
    assert len(results) == 1
    return results[0]


def test_every_gemini_fixture_has_a_source_and_a_case() -> None:
    on_disk = {path.name for path in FIXTURES.glob("gemini_*")}
    assert on_disk == set(SOURCES)
    assert {case.fixture for case in STREAM_CASES} | {case.fixture for case in HTTP_CASES} == set(SOURCES)


def test_registered_under_its_name_and_inferred_from_gemini_paths() -> None:
    assert isinstance(APIS["google-gemini"], GoogleGemini)
    for path in ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
                 "/v1/models/gemini-2.5-pro:generateContent",
                 "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent",
                 "/v1beta/models/*", "/v1*/models/*:streamGenerateContent"):
        assert api_for_path(path) == "google-gemini", path
    assert api_for_path("/v1beta/models/gemini-2.5-flash:countTokens") is None
    assert api_for_path("/v1/chat/completions") == "openai-chat"


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda case: case.fixture)
@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_stream_fixture(case: Case, chunk: int | None) -> None:
    raw = (FIXTURES / case.fixture).read_bytes()
    assert raw.endswith(b"\r\n\r\n")
    results, complete = run(raw, chunk)
    assert [result.kind for result in results] == case.kinds
    assert complete is case.complete
    policy = ErrorPolicy()
    found = [Failure(policy.decide(r.error), r.error.status, r.error.code) for r in results if r.error is not None]
    assert found == case.failures


@pytest.mark.parametrize("case", HTTP_CASES, ids=lambda case: case.fixture)
def test_http_error_fixture(case: HttpCase) -> None:
    info = http_error_info(case.status, (FIXTURES / case.fixture).read_bytes())
    assert ErrorPolicy().decide(info) is case.decision
    assert (info.status, info.code, info.retry_after_s) == (case.status, case.code, case.retry_after_s)


def test_a_daily_quota_is_said_so() -> None:
    info = http_error_info(429, (FIXTURES / "gemini_http_429_per_day.json").read_bytes())
    assert info.type == DAILY_QUOTA
    per_minute = http_error_info(429, (FIXTURES / "gemini_http_429_per_minute.json").read_bytes())
    assert per_minute.type is None


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        ({"candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}}]}, L),
        ({"candidates": [{"content": {"parts": [{"thoughtSignature": "Cp8BAdHtim"}], "role": "model"}}]}, L),
        ({"candidates": [{"content": {"parts": [{"text": "", "thoughtSignature": "Cp8B"}], "role": "model"}}]}, L),
        ({"candidates": [{"content": {"role": "model"}}]}, L),
        ({"candidates": []}, L),
        ({"usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}, "modelVersion": "gemini-2.5-flash"}, L),
        ({"modelVersion": "gemini-2.5-flash", "responseId": "AS47abf"}, L),
        ({"promptFeedback": {"safetyRatings": []}, "usageMetadata": {}}, L),
        ({"candidates": [{"content": {"parts": [{"text": "Hi"}], "role": "model"}}]}, O),
        ({"candidates": [{"content": {"parts": [{"text": "**Planning**", "thought": True}], "role": "model"}}]}, O),
        ({"candidates": [{"content": {"parts": [{"functionCall": {"name": "list_dir", "args": {}}}]}}]}, O),
        ({"candidates": [{"content": {"parts": [{"inlineData": {"mimeType": "image/png", "data": "iVBO"}}]}}]}, O),
        ({"candidates": [{"content": {"parts": [{"executableCode": {"language": "PYTHON", "code": "1"}}]}}]}, O),
        ({"candidates": [{"content": {"parts": [{"somethingNew": {"x": 1}}]}}]}, O),  # fail closed
        ({"somethingElse": 1}, O),  # fail closed
        ({"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}]}, T),
        ({"candidates": [{"finishReason": "RECITATION"}]}, T),
    ],
)
def test_frame(frame: dict[str, object], kind: FrameKind) -> None:
    assert one(frame).kind is kind


def test_complete_only_once_every_candidate_finished() -> None:
    first = b'data: {"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}, ' \
            b'{"content": {"parts": [{"text": "b"}]}, "index": 1}]}\r\n\r\n'
    one_done = b'data: {"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP", "index": 0}]}\r\n\r\n'
    both_done = b'data: {"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP", "index": 1}]}\r\n\r\n'
    assert run(first + one_done)[1] is False
    assert run(first + one_done + both_done)[1] is True


def test_after_output_only_errors_and_finish_reasons_get_a_look() -> None:
    stream = GoogleGemini().stream_classifier()
    text = b'data: {"candidates": [{"content": {"parts": [{"text": "more words"}],"role": "model"}}]}\r\n\r\n'
    assert not stream.worth_a_look(text)
    assert stream.worth_a_look((FIXTURES / "gemini_normal_text.sse").read_bytes())
    assert stream.worth_a_look((FIXTURES / "gemini_unavailable_first.sse").read_bytes())


def test_whole_answers_errors_blocked_prompts_and_arrays() -> None:
    api = GoogleGemini()
    assert api.body_error({"candidates": [{"content": {"parts": [{"text": "Hi"}]}, "finishReason": "STOP"}]}) is None
    blocked = api.body_error({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}})
    assert blocked is not None and ErrorPolicy().decide(blocked) is Decision.FATAL
    array = [{"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]},
             {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}]
    found = api.body_error(array)
    assert found is not None and ErrorPolicy().decide(found) is Decision.RETRY


@pytest.mark.parametrize(
    ("code", "error_type", "status", "name"),
    [
        ("stream_cut", None, 503, "UNAVAILABLE"),
        ("stream_stalled", None, 503, "UNAVAILABLE"),
        ("upstream_timeout", None, 504, "DEADLINE_EXCEEDED"),
        ("upstream_unavailable", None, 502, "UNAVAILABLE"),
        ("switchyard_internal_error", None, 502, "INTERNAL"),
        ("INVALID_ARGUMENT", "INVALID_ARGUMENT", 400, "INVALID_ARGUMENT"),
        ("API_KEY_INVALID", "INVALID_ARGUMENT", 400, "INVALID_ARGUMENT"),
        ("SAFETY", "prompt_blocked", 400, "INVALID_ARGUMENT"),  # a blocked prompt forwarded in band
        ("RESOURCE_EXHAUSTED", "daily_quota_exhausted", 429, "RESOURCE_EXHAUSTED"),
    ],
)
def test_switchyards_own_errors_in_geminis_shape(code: str, error_type: str | None, status: int, name: str) -> None:
    """What python-genai reads: `code` (4xx -> ClientError, 5xx -> ServerError) and `status`."""
    frame = GoogleGemini().error_event("switchyard: it broke", code, error_type)
    assert frame.startswith(b'data: {"error": ') and frame.endswith(b"\r\n\r\n")
    error = json.loads(frame[len(b"data: "):])["error"]
    assert (error["code"], error["status"], error["message"]) == (status, name, "switchyard: it broke")
    # Switchyard's own reason survives where Google's model keeps reasons
    reasons = [d["reason"] for d in error.get("details", [])]
    assert reasons == ([] if code == name else [code])
    body = GoogleGemini().error_body("m", code, error_type)
    assert body.startswith(b'{\n  "error": {\n') and json.loads(body)["error"]["code"] == status


def test_faults_speak_gemini() -> None:
    frame = error_frame("google-gemini", "sse_error", 503, "provider overloaded")
    assert frame == (b'data: {"error": {"code": 503, "message": "provider overloaded", "status": "UNAVAILABLE"}}'
                     b"\r\n\r\n")
    assert one(json.loads(frame[6:])).kind is F
    overload = json.loads(error_frame("google-gemini", "overload_message", 503, "Our servers are currently overloaded.")[6:])
    assert overload["error"]["code"] == 400  # python-genai raises on a code; the text says retry
    assert ErrorPolicy().decide(one(overload).error) is Decision.RETRY  # type: ignore[arg-type]
    body = json.loads(error_body("google-gemini", 429, "slow down"))
    assert body == {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}}


def test_retry_delay_is_honoured_like_retry_after() -> None:
    info = http_error_info(429, (FIXTURES / "gemini_http_429_per_minute.json").read_bytes())
    kwargs = dict(tries_used=1, budget=2, timed_out=False, backoff_ms=250)
    assert plan_after_failure(Decision.RETRY, has_next=True, retry_after=info.retry_after_s, max_backoff_ms=60_000,
                              **kwargs).delay_s == 38.0
    # longer than max_backoff_ms: move on instead of waiting (as with Retry-After)
    assert plan_after_failure(Decision.RETRY, has_next=True, retry_after=info.retry_after_s, max_backoff_ms=4000,
                              **kwargs).action == "next"


@pytest.mark.parametrize(("value", "seconds"), [("38s", 38.0), ("34.074824224s", 34.074824224), ("900ms", 0.9),
                                                ({"seconds": 2, "nanos": 500_000_000}, 2.5), ("soon", None), (5, None)])
def test_durations(value: object, seconds: float | None) -> None:
    assert duration_s(value) == seconds


def test_the_message_says_it_where_no_retry_info_does() -> None:
    body = json.dumps({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
                                 "message": "Quota exceeded for metric: x, limit: 0\nPlease retry in 5.237548564s."}})
    assert http_error_info(429, body.encode()).retry_after_s == pytest.approx(5.237548564)


def test_content_view_shows_where_a_gemini_stream_commits() -> None:
    raw = (FIXTURES / "gemini_unavailable_first.sse").read_bytes() + (FIXTURES / "gemini_normal_text.sse").read_bytes()
    text = render(raw, "google-gemini")
    assert text.splitlines()[0] == "switchyard: google-gemini stream, 3 frames, first output at frame 2"
    assert "failure retryable" in text and "status=503 code=UNAVAILABLE" in text
