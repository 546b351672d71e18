"""error_info / http_error_info / ErrorPolicy.decide (DESIGN §3 precedence).

Bodies come from reference/provider-sse-shapes.md: §1.5 (OpenAI), §3.5-3.6
(Anthropic), §4.2 (Gemini), §5 (OpenRouter), §6.1-6.3 (Azure, vLLM, Ollama),
§8 (message-only overload texts).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from switchyard_core.apis.base import ErrorInfo
from switchyard_core.apis.errors import (
    CAPACITY_CODES,
    DEFAULT_RETRY_ON,
    MESSAGE_LIMIT,
    Decision,
    ErrorPolicy,
    error_info,
    has_overload_text,
    http_error_info,
)

RETRY, NEXT, FATAL = Decision.RETRY, Decision.NEXT_UPSTREAM, Decision.FATAL

# §8 texts 1, 2, 3, 4, 6, 7, 8 (exact, including the variable parts as quoted)
OVERLOAD_TEXTS = {
    "8.1": "Our servers are currently overloaded. Please try again later.",
    "8.2": "Selected model is at capacity. Please try a different model.",
    "8.3": (
        "An error occurred while processing your request. You can retry your request, or contact us "
        "through our help center at help.openai.com if the error persists. Please include the request "
        "ID 5b0e3b2c-2f7a-4c1e-9d1e-6f0c8a2b7e11 in your message."
    ),
    "8.4": "The server had an error while processing your request. Sorry about that!",
    "8.6": (
        "That model is currently overloaded with other requests. You can retry your request, or contact "
        "us through our help center at help.openai.com if the error persists. (Please include the request "
        "ID 169bee8d  in your message.)"
    ),
    "8.7": (
        "The server is currently overloaded with other requests. Sorry about that! You can retry your "
        "request, or contact us through our help center at help.openai.com if the error persists."
    ),
    "8.8": "The engine is currently overloaded, please try again later",
}


# ---------------------------------------------------------------------------
# error_info: reading the carrier

ERROR_INFO_CASES: list[tuple[str, Any, dict[str, Any]]] = [
    (
        "numeric code (vLLM §6.2)",
        {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}},
        {"status": 500, "code": None, "type": "InternalServerError", "message": "boom"},
    ),
    (
        "numeric code 503 (OpenRouter §5)",
        {"error": {"code": 503, "message": "No provider"}},
        {"status": 503, "code": None, "message": "No provider"},
    ),
    (
        "numeric string code (Azure §6.1)",
        {"error": {"code": "429", "message": "Requests to the ... Please retry after 20 seconds."}},
        {"status": 429, "code": None, "type": None},
    ),
    (
        "string code (OpenAI)",
        {"error": {"message": "m", "type": "server_error", "param": None, "code": "server_is_overloaded"}},
        {"status": None, "code": "server_is_overloaded", "type": "server_error"},
    ),
    (
        "null code (OpenAI §1.5)",
        {"error": {"message": "m", "type": "server_error", "param": None, "code": None}},
        {"status": None, "code": None, "type": "server_error"},
    ),
    (
        "Gemini code + status (§4.2)",
        {"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}},
        {"status": 503, "code": "UNAVAILABLE", "message": "The model is overloaded. Please try again later."},
    ),
    (
        "Azure content_filter with numeric status (§6.1)",
        {"error": {"message": "filtered", "type": None, "param": "prompt", "code": "content_filter", "status": 400}},
        {"status": 400, "code": "content_filter", "type": None},
    ),
    (
        "vLLM old top-level object:error (§6.2)",
        {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400},
        {"status": 400, "type": "BadRequestError", "message": "bad"},
    ),
    (
        "vLLM old nested object:error (§6.2)",
        {"error": {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}},
        {"status": 400, "type": "BadRequestError", "message": "bad"},
    ),
    (
        '{"error": "text"}',
        {"error": "upstream exploded"},
        {"status": None, "code": None, "type": None, "message": "upstream exploded"},
    ),
    (
        "Anthropic nested type:error (§3.5)",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        {"status": None, "code": None, "type": "overloaded_error", "message": "Overloaded"},
    ),
    (
        "Responses flat error event (§2.5)",
        {"type": "error", "code": "server_is_overloaded", "message": "m", "param": None, "sequence_number": 2},
        {"code": "server_is_overloaded", "type": None, "message": "m"},
    ),
    (
        "Gemini 429 RESOURCE_EXHAUSTED (§4.2)",
        {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Quota exceeded"}},
        {"status": 429, "code": "RESOURCE_EXHAUSTED"},
    ),
    (
        "out-of-range integer code kept as text",
        {"error": {"code": 1234, "message": "m"}},
        {"status": None, "code": "1234"},
    ),
    (
        "boolean code is not a status",
        {"error": {"code": True, "message": "m"}},
        {"status": None},
    ),
]


@pytest.mark.parametrize("obj,expected", [c[1:] for c in ERROR_INFO_CASES], ids=[c[0] for c in ERROR_INFO_CASES])
def test_error_info_reads_the_carrier(obj: Any, expected: dict[str, Any]) -> None:
    info = error_info(obj)
    assert info is not None
    for name, value in expected.items():
        assert getattr(info, name) == value, name


@pytest.mark.parametrize(
    "obj",
    [
        None,
        "error",
        [{"error": {"code": 503}}],
        {},
        {"choices": []},
        {"error": None},
        {"error": {}},
        {"error": ""},
        {"type": "message_stop"},
        {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}]},
    ],
    ids=repr,
)
def test_error_info_none_when_no_error(obj: Any) -> None:
    assert error_info(obj) is None


def test_error_info_keeps_a_given_non_2xx_status_and_event_type() -> None:
    info = error_info({"error": {"code": 503, "message": "m"}}, status=400, event_type="error")
    assert info is not None
    assert info.status == 400
    assert info.event_type == "error"
    # inside a 2xx answer the body's own status counts
    info = error_info({"error": {"code": 503, "message": "m"}}, status=200)
    assert info is not None and info.status == 503


def test_error_info_truncates_messages() -> None:
    info = error_info({"error": {"message": "x" * 5000, "type": "server_error"}})
    assert info is not None
    assert len(info.message) == MESSAGE_LIMIT


# ---------------------------------------------------------------------------
# http_error_info: non-2xx answers, whatever the body


NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


def test_http_error_info_non_json_body() -> None:
    info = http_error_info(502, NGINX_502)
    assert info.status == 502
    assert info.code is None and info.type is None
    assert "502 Bad Gateway" in info.message
    assert info.event_type == "http"
    assert ErrorPolicy().decide(info) is RETRY


def test_http_error_info_pretty_printed_json() -> None:
    # reference §1.5(a), pretty-printed 400
    body = (
        b'{\n  "error": {\n    "message": "Mutually exclusive parameters: \'\'. Ensure you are only providing one of: '
        b'\'pre..._id\' or \'conversation\'.",\n    "type": "invalid_request_error",\n    "param": null,\n'
        b'    "code": "mutually_exclusive_parameters"\n  }\n}'
    )
    info = http_error_info(400, body)
    assert (info.status, info.code, info.type) == (400, "mutually_exclusive_parameters", "invalid_request_error")
    assert info.message.startswith("Mutually exclusive parameters")
    assert ErrorPolicy().decide(info) is FATAL


def test_http_status_beats_the_body_code() -> None:
    info = http_error_info(400, b'{"error": {"code": 503, "message": "Invalid model specified"}}')
    assert info.status == 400


@pytest.mark.parametrize(
    "body",
    [b"", b"   ", b"\xff\xfe\x00", b"[1,2]", b'"just a string"', b"null", b'{"no":"error"}', b"[" * 50_000],
    ids=["empty", "blank", "binary", "array", "string", "null", "no-error", "deep"],
)
def test_http_error_info_never_raises(body: bytes) -> None:
    info = http_error_info(503, body)
    assert info.status == 503
    assert len(info.message) <= MESSAGE_LIMIT
    assert ErrorPolicy().decide(info) is RETRY


def test_http_error_info_truncates() -> None:
    assert len(http_error_info(500, b"e" * 10_000).message) == MESSAGE_LIMIT
    body = json.dumps({"error": {"message": "m" * 10_000, "type": "api_error"}}).encode()
    assert len(http_error_info(500, body).message) == MESSAGE_LIMIT


# ---------------------------------------------------------------------------
# ErrorPolicy.decide: table of (status, body) -> decision


def _body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


HTTP_CASES: list[tuple[str, int, bytes, Decision]] = [
    # retryable statuses
    *[(f"status {s}", s, b"", RETRY) for s in (408, 429, 500, 502, 503, 504, 529)],
    ("nginx 502 page", 502, NGINX_502, RETRY),
    (
        "Anthropic 529 overloaded_error (§3.5)",
        529,
        b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
        RETRY,
    ),
    (
        "Anthropic 429 rate_limit_error (§3.5)",
        429,
        _body({"type": "error", "error": {"type": "rate_limit_error", "message": "This request would exceed ..."}}),
        RETRY,
    ),
    (
        "Gemini 503 UNAVAILABLE (§4.2)",
        503,
        b'{\n  "error": {\n    "code": 503,\n    "message": "The model is overloaded. Please try again later.",\n'
        b'    "status": "UNAVAILABLE"\n  }\n}\n',
        RETRY,
    ),
    (
        "Azure 429 numeric-string code (§6.1)",
        429,
        _body({"error": {"code": "429", "message": "Requests to the ... Please retry after 20 seconds."}}),
        RETRY,
    ),
    (
        "OpenAI 503 overloaded text (§1.5a)",
        503,
        _body({"error": {"message": OVERLOAD_TEXTS["8.6"], "type": "server_error", "param": None, "code": None}}),
        RETRY,
    ),
    # next upstream only
    (
        "context_length_exceeded 400",
        400,
        _body({"error": {"message": "Your input exceeds the context window of this model.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        NEXT,
    ),
    (
        "insufficient_quota 429",
        429,
        _body({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}),
        NEXT,
    ),
    (
        "Anthropic prompt is too long 400",
        400,
        _body({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"}}),
        NEXT,
    ),
    # fatal
    *[(f"status {s}", s, b"", FATAL) for s in (400, 401, 403, 404, 413, 418, 422)],
    (
        "Azure content_filter 400 (§6.1)",
        400,
        _body({"error": {"message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.", "type": None, "param": "prompt", "code": "content_filter", "status": 400}}),
        FATAL,
    ),
    (
        "OpenRouter invalid model 400 (§5)",
        400,
        b'{"error": {"code": 400, "message": "Invalid model specified"}}',
        FATAL,
    ),
    (
        "Anthropic authentication_error 401",
        401,
        _body({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
        FATAL,
    ),
    (
        "Anthropic permission_error 403",
        403,
        _body({"type": "error", "error": {"type": "permission_error", "message": "no"}}),
        FATAL,
    ),
    (
        "Anthropic request_too_large 413",
        413,
        _body({"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}}),
        FATAL,
    ),
    (
        "OpenAI invalid_api_key 401",
        401,
        _body({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}),
        FATAL,
    ),
]


@pytest.mark.parametrize(
    "status,body,expected", [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES]
)
def test_decide_http(status: int, body: bytes, expected: Decision) -> None:
    assert ErrorPolicy().decide(http_error_info(status, body)) is expected


INFO_CASES: list[tuple[str, ErrorInfo, Decision]] = [
    # retryable codes and types, with no status at all (in-stream)
    *[(f"code {c}", ErrorInfo(code=c), RETRY) for c in sorted(
        {"server_error", "server_is_overloaded", "slow_down", "rate_limit_exceeded", "overloaded_error", "api_error", "rate_limit_error"}
    )],
    *[(f"type {t}", ErrorInfo(type=t), RETRY) for t in ("server_error", "overloaded_error", "api_error", "rate_limit_error", "rate_limit_exceeded")],
    ("retryable code beats status 400", ErrorInfo(status=400, code="server_error"), RETRY),
    ("type service_unavailable_error", ErrorInfo(type="service_unavailable_error", code="server_is_overloaded"), RETRY),
    ("status only 503", ErrorInfo(status=503), RETRY),
    ("status only 529", ErrorInfo(status=529), RETRY),
    # next-upstream-only
    ("code context_length_exceeded", ErrorInfo(status=400, code="context_length_exceeded", type="invalid_request_error"), NEXT),
    ("code insufficient_quota", ErrorInfo(status=429, code="insufficient_quota"), NEXT),
    ("type insufficient_quota", ErrorInfo(type="insufficient_quota"), NEXT),
    (
        "Anthropic prompt is too long",
        ErrorInfo(status=400, type="invalid_request_error", message="prompt is too long: 208310 tokens > 200000 maximum"),
        NEXT,
    ),
    (
        "next-upstream code beats overload text and 503",
        ErrorInfo(status=503, code="context_length_exceeded", message=OVERLOAD_TEXTS["8.1"]),
        NEXT,
    ),
    ("next-upstream code beats retryable type", ErrorInfo(code="insufficient_quota", type="server_error"), NEXT),
    # fatal
    *[(f"status {s}", ErrorInfo(status=s, message="nope"), FATAL) for s in (400, 401, 403, 404, 413, 418, 422)],
    ("invalid_request_error", ErrorInfo(type="invalid_request_error", message="bad param"), FATAL),
    ("invalid_request_error 400", ErrorInfo(status=400, type="invalid_request_error", message="bad param"), FATAL),
    ("authentication_error", ErrorInfo(status=401, type="authentication_error"), FATAL),
    ("permission_error", ErrorInfo(status=403, type="permission_error"), FATAL),
    ("content_filter", ErrorInfo(status=400, code="content_filter", message="filtered"), FATAL),
    ("content_filter no status", ErrorInfo(code="content_filter"), FATAL),
    ("unknown code teapot", ErrorInfo(code="teapot", message="I'm a teapot"), FATAL),
    ("unknown code teapot 200", ErrorInfo(status=200, code="teapot"), FATAL),
    ("vLLM BadRequestError 400", ErrorInfo(status=400, type="BadRequestError", message="…"), FATAL),
    ("nothing at all", ErrorInfo(), FATAL),
    ("message only, not an overload text", ErrorInfo(message="something broke"), FATAL),
    ("retryable_hint loses to a code", ErrorInfo(code="teapot", retryable_hint=True), FATAL),
    # the carrier says transient and nothing else is known (finish_reason "error")
    ("retryable_hint alone", ErrorInfo(message="finish_reason error", retryable_hint=True), RETRY),
]


@pytest.mark.parametrize("info,expected", [c[1:] for c in INFO_CASES], ids=[c[0] for c in INFO_CASES])
def test_decide_info(info: ErrorInfo, expected: Decision) -> None:
    assert ErrorPolicy().decide(info) is expected


@pytest.mark.parametrize("key", sorted(OVERLOAD_TEXTS))
@pytest.mark.parametrize(
    "status,err_type",
    [(None, None), (400, None), (400, "invalid_request_error"), (None, "invalid_request_error"), (200, None)],
)
def test_overload_text_is_retryable_whatever_else_says(key: str, status: int | None, err_type: str | None) -> None:
    text = OVERLOAD_TEXTS[key]
    assert has_overload_text(text)
    assert has_overload_text(text.upper())
    info = ErrorInfo(status=status, type=err_type, message=text)
    assert ErrorPolicy().decide(info) is RETRY


@pytest.mark.parametrize("key", sorted(OVERLOAD_TEXTS))
def test_overload_text_in_a_400_http_body(key: str) -> None:
    # §8.1 "also HTTP 400 with message only"; §8.2 under invalid_request_error
    body = _body({"error": {"message": OVERLOAD_TEXTS[key], "type": "invalid_request_error", "param": None, "code": None}})
    info = http_error_info(400, body)
    assert info.status == 400 and info.type == "invalid_request_error"
    assert ErrorPolicy().decide(info) is RETRY


@pytest.mark.parametrize(
    "info",
    [
        ErrorInfo(status=400, code="context_length_exceeded"),
        ErrorInfo(status=401, type="authentication_error"),
        ErrorInfo(code="teapot"),
        ErrorInfo(code="insufficient_quota"),
        ErrorInfo(),
    ],
    ids=["context", "auth", "teapot", "quota", "empty"],
)
@pytest.mark.parametrize("header", ["true", "True", " TRUE "])
def test_x_should_retry_true_wins_over_everything(info: ErrorInfo, header: str) -> None:
    assert ErrorPolicy().decide(info, should_retry=header) is RETRY


@pytest.mark.parametrize(
    "info",
    [
        ErrorInfo(status=529, type="overloaded_error", message="Overloaded"),
        ErrorInfo(status=503, message=OVERLOAD_TEXTS["8.1"]),
        ErrorInfo(code="server_error"),
        ErrorInfo(status=400, code="context_length_exceeded"),
        ErrorInfo(retryable_hint=True),
    ],
    ids=["529", "overload-text", "server_error", "context", "hint"],
)
@pytest.mark.parametrize("header", ["false", "False"])
def test_x_should_retry_false_wins_over_everything(info: ErrorInfo, header: str) -> None:
    assert ErrorPolicy().decide(info, should_retry=header) is FATAL


def test_x_should_retry_other_values_are_ignored() -> None:
    assert ErrorPolicy().decide(ErrorInfo(status=503), should_retry="maybe") is RETRY
    assert ErrorPolicy().decide(ErrorInfo(status=400), should_retry="") is FATAL


def test_default_retry_on() -> None:
    assert DEFAULT_RETRY_ON == {408, 429, 500, 502, 503, 504, 529}
    assert ErrorPolicy().retry_on == DEFAULT_RETRY_ON


def test_custom_retry_on() -> None:
    policy = ErrorPolicy(retry_on=frozenset({409, 503}))
    assert policy.decide(ErrorInfo(status=409)) is RETRY
    assert policy.decide(ErrorInfo(status=503)) is RETRY
    assert policy.decide(ErrorInfo(status=502)) is FATAL
    assert policy.decide(ErrorInfo(status=529)) is FATAL
    # codes and texts do not depend on retry_on
    assert policy.decide(ErrorInfo(status=502, code="server_error")) is RETRY
    assert policy.decide(ErrorInfo(status=400, message=OVERLOAD_TEXTS["8.4"])) is RETRY
    assert ErrorPolicy(retry_on=frozenset()).decide(ErrorInfo(status=503)) is FATAL


def test_precedence_retry_on_status_beats_a_fatal_type() -> None:
    # DESIGN §3: "... a retryable code or type; a retry_on status; else fatal"
    info = ErrorInfo(status=503, type="invalid_request_error", message="bad")
    assert ErrorPolicy().decide(info) is RETRY


def test_capacity_codes() -> None:
    assert CAPACITY_CODES == {"server_is_overloaded", "slow_down"}


# end to end through error_info: in-stream carriers (no HTTP status)
STREAM_BODY_CASES: list[tuple[str, Any, Decision]] = [
    ("vLLM 400 first frame (§6.2)", {"error": {"message": "…", "type": "BadRequestError", "param": None, "code": 400}}, FATAL),
    ("vLLM 500", {"error": {"message": "…", "type": "InternalServerError", "param": None, "code": 500}}, RETRY),
    ("OpenRouter 502 (§5)", {"error": {"code": 502, "message": "Provider disconnected unexpectedly", "metadata": {"error_type": "provider_unavailable"}}}, RETRY),
    ("OpenRouter 429 (§5)", {"error": {"code": 429, "message": "Provider returned error", "metadata": {"error_type": "rate_limit_exceeded", "retry_after_seconds": 0}}}, RETRY),
    ("OpenRouter 504 (§5)", {"error": {"code": 504, "message": "Upstream idle timeout exceeded", "metadata": {"provider_name": "fixture"}}}, RETRY),
    ("OpenRouter docs server_error (§5)", {"error": {"code": "server_error", "message": "Provider disconnected unexpectedly"}}, RETRY),
    ("Ollama api_error (§6.3)", {"error": {"message": "…", "type": "api_error", "param": None, "code": None}}, RETRY),
    ("Ollama invalid_request_error (§6.3)", {"error": {"message": "…", "type": "invalid_request_error", "param": None, "code": None}}, FATAL),
    ("Ollama not_found_error (§6.3)", {"error": {"message": "…", "type": "not_found_error", "param": None, "code": None}}, FATAL),
    ("go-openai typo type + text 4 (§1.5b)", {"error": {"message": OVERLOAD_TEXTS["8.4"], "type": "server_ error", "param": None, "code": None}}, RETRY),
    ("Anthropic overloaded_error (§3.5)", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, RETRY),
    ("Anthropic api_error Overloaded (§3.5)", {"type": "error", "error": {"type": "api_error", "message": "Overloaded"}}, RETRY),
    ("Gemini 503 in stream (§4.2)", {"error": {"code": 503, "message": "This model is currently experiencing high demand.", "status": "UNAVAILABLE"}}, RETRY),
    ("Gemini 429 in stream (§4.2)", {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Quota exceeded"}}, RETRY),
    ("Azure 429 string (§6.1)", {"error": {"code": "429", "message": "Please retry after 20 seconds."}}, RETRY),
    ("{'error': 'text'}", {"error": "something went wrong"}, FATAL),
    ("{'error': overload text}", {"error": OVERLOAD_TEXTS["8.1"]}, RETRY),
    ("vLLM old top-level 500", {"object": "error", "message": "engine dead", "type": "InternalServerError", "param": None, "code": 500}, RETRY),
    ("vLLM old top-level 400", {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}, FATAL),
]


@pytest.mark.parametrize("obj,expected", [c[1:] for c in STREAM_BODY_CASES], ids=[c[0] for c in STREAM_BODY_CASES])
def test_decide_stream_bodies(obj: Any, expected: Decision) -> None:
    info = error_info(obj)
    assert info is not None
    assert ErrorPolicy().decide(info) is expected
