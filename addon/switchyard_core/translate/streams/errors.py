"""An upstream's error told in the client's API.

The client reads the failure in its own API's shape (`Api.error_event`,
`Api.error_body`), with as much of the upstream's facts as that shape holds:
the message as sent; the code as sent (OpenAI's and Gemini's shapes have a slot
for it); the type as sent where the client's API has a slot for a free one
(OpenAI's), else the client API's own word for the same failure, so that its
clients' retry policies judge it as they would their own provider's
(Anthropic's `overloaded_error` for any overload, Gemini's `UNAVAILABLE`).  A
status that the client's shape carries (Gemini's numeric `code`) is kept where
that API has the status, and otherwise the nearest it has (an overloaded 529 is
Google's 503).
"""

from __future__ import annotations

from ...apis import APIS
from ...apis.base import ErrorInfo
from ...apis.errors import Decision, ErrorPolicy, code_and_type_for_status
from ...apis.google_gemini import PROMPT_BLOCKED
from ...apis.google_rpc import DAILY_QUOTA, GRPC_HTTP, status_for_http

_OVERLOAD = frozenset({"overloaded_error", "server_is_overloaded", "slow_down", "service_unavailable_error",
                       "UNAVAILABLE", "insufficient_system_resource"})
_RATE_LIMIT = frozenset({"rate_limit_error", "rate_limit_exceeded", "RESOURCE_EXHAUSTED", "requests", "tokens"})
_QUOTA = frozenset({"insufficient_quota", DAILY_QUOTA, "billing_error"})  # no retry helps before it resets
_TIMEOUT = frozenset({"timeout_error", "DEADLINE_EXCEEDED"})
_INVALID = frozenset({"invalid_request_error", "context_length_exceeded", "model_context_window_exceeded",
                      "INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "invalid_prompt",
                      "content_filter", PROMPT_BLOCKED})
_AUTH = frozenset({"authentication_error", "invalid_api_key", "UNAUTHENTICATED"})
_PERMISSION = frozenset({"permission_error", "PERMISSION_DENIED"})
_NOT_FOUND = frozenset({"not_found_error", "model_not_found", "NOT_FOUND"})

# Anthropic's error types (`anthropic.types.shared.ErrorType`, plus Cloudflare's 413)
_ANTHROPIC_TYPES = frozenset({"invalid_request_error", "authentication_error", "permission_error",
                              "not_found_error", "rate_limit_error", "timeout_error", "overloaded_error",
                              "api_error", "billing_error", "request_too_large"})


_POLICY = ErrorPolicy()


def _status(info: ErrorInfo) -> int:
    """The HTTP status the error stands for: its own, else the one its code or type
    names, else what Switchyard's error policy makes of it (a transient failure is a
    500, anything else a 400): the client's retry policy then judges it as ours did."""
    if info.status is not None:
        return info.status
    names = {info.code, info.type}
    for group, status in ((_OVERLOAD, 503), (_RATE_LIMIT, 429), (_QUOTA, 429), (_TIMEOUT, 504), (_INVALID, 400),
                          (_AUTH, 401), (_PERMISSION, 403), (_NOT_FOUND, 404)):
        if names & group:
            return status
    for name in names:
        if name in GRPC_HTTP:
            return GRPC_HTTP[name]
    return 500 if _POLICY.decide(info) is Decision.RETRY else 400


def _anthropic_type(info: ErrorInfo, status: int) -> str:
    if info.type in _ANTHROPIC_TYPES:
        return info.type
    if {info.code, info.type} & _OVERLOAD:
        return "overloaded_error"  # what Claude Code retries on its own
    if {info.code, info.type} & _QUOTA:
        return "billing_error"  # a 429 to Anthropic's clients would be a rate limit, which they retry
    return code_and_type_for_status("anthropic-messages", status)[1]


def _words(client_api: str, info: ErrorInfo) -> tuple[str, str, str]:
    """message, code, type: what the client's `error_event`/`error_body` take."""
    status = _status(info)
    if client_api == "anthropic-messages":
        kind = _anthropic_type(info, status)
        return info.message or kind, info.code or kind, kind
    if client_api == "google-gemini":
        grpc = next((name for name in (info.code, info.type) if name in GRPC_HTTP), None) or status_for_http(status)
        return info.message or grpc, info.code or info.type or grpc, grpc
    default_code, default_type = code_and_type_for_status(client_api, status)
    # a status of its own says more than a type (vLLM's `InternalServerError` with code 500)
    code = info.code or (default_code if info.status is not None else info.type or default_code)
    return info.message or default_code, code, info.type or default_type


def error_frame(client_api: str, info: ErrorInfo) -> bytes:
    """The in-band error frame the client's API sends for `info`."""
    message, code, kind = _words(client_api, info)
    return APIS[client_api].error_event(message, code, kind)


def error_body(client_api: str, info: ErrorInfo) -> bytes:
    """The JSON error body the client's API answers with for `info` (a whole answer's
    error, or an HTTP error of the upstream's told to the client)."""
    message, code, kind = _words(client_api, info)
    return APIS[client_api].error_body(message, code, kind)


def error_status(client_api: str, info: ErrorInfo) -> int:
    """The HTTP status to answer with for `info` when it is told as a whole answer (the
    nearest the client's API has: Google answers an overload with 503, never 529)."""
    if client_api == "google-gemini":
        return GRPC_HTTP[_words(client_api, info)[2]]
    return _status(info)
