"""Reading provider errors and deciding what they are worth.

Providers put the same transient overload in many places: a status, a code
(string, number or numeric string), a type, or only a message.  `error_info`
reads all of them out of any JSON error carrier; `ErrorPolicy.decide` takes the
first rule that applies (docs/architecture.md, "What counts as output"):
`x-should-retry`; a next-upstream-only code, type or text (a context overflow
is no better on a retry); an overload text, whatever status or code stands
beside it; a retryable code or type; a carrier that says "transient" and names
no code (a transport failure, a timeout, an empty stream); a `retry_on`
status; else fatal.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

from . import google_rpc
from .base import ErrorInfo


class Decision(enum.Enum):
    RETRY = "retry"  # same upstream within budget, then the next
    NEXT_UPSTREAM = "next_upstream"  # skip the rest of this upstream's budget
    FATAL = "fatal"  # return as sent, try nothing else


DEFAULT_RETRY_ON: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504, 529})

RETRYABLE_CODES: frozenset[str] = frozenset(
    {
        "server_error",
        "server_is_overloaded",
        "slow_down",
        "rate_limit_exceeded",
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "service_unavailable_error",
        "timeout_error",  # Anthropic's 504
        "insufficient_system_resource",  # DeepSeek: capacity, disguised as a finish reason
        # Gemini's canonical statuses for overload, rate limits, server errors and timeouts
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "INTERNAL",
        "DEADLINE_EXCEEDED",
    }
)

UNTRANSLATABLE = "untranslatable"  # Switchyard's own: the request cannot be carried into that upstream's API
NEXT_UPSTREAM_CODES: frozenset[str] = frozenset(
    {"context_length_exceeded", "insufficient_quota", "model_context_window_exceeded", google_rpc.DAILY_QUOTA,
     UNTRANSLATABLE}
)

# Anthropic reports an over-long prompt as invalid_request_error with only this text, Gemini
# as INVALID_ARGUMENT "The input token count (N) exceeds the maximum number of tokens allowed (M)."
NEXT_UPSTREAM_TEXTS: tuple[str, ...] = ("prompt is too long", "exceeds the context window",
                                        "exceeds the maximum number of tokens allowed")

# Message-only capacity texts, seen from OpenAI and OpenAI-compatible servers even under
# a 400 or with no status at all; matched case-insensitively as
# substrings, whatever the status or code beside them says.
OVERLOAD_TEXTS: tuple[str, ...] = (
    "servers are currently overloaded",
    "servers are overloaded",
    "server is overloaded",
    "selected model is at capacity",
    "the server had an error while processing your request",
    "an error occurred while processing your request",
    "currently overloaded with other requests",
    "engine is currently overloaded",
    "model is overloaded",
    "experiencing high demand",
)

# Whole messages that mean overload only when they stand alone ("Overloaded" is
# Anthropic's; as a substring it would catch too much).
OVERLOAD_MESSAGES: frozenset[str] = frozenset({"overloaded"})

# Codes rewritten to `server_error` after output, so clients retry them.
CAPACITY_CODES: frozenset[str] = frozenset({"server_is_overloaded", "slow_down"})

MESSAGE_LIMIT = 300


def _as_status(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 100 <= value <= 599:
        return value
    text = value.strip() if isinstance(value, str) else ""
    if len(text) == 3 and text.isascii() and text.isdigit():  # not "²", nor 5,000 digits: int() raises on both
        number = int(text)
        return number if 100 <= number <= 599 else None
    return None


def _as_text(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    return None


def error_info(
    obj: Any, *, status: int | None = None, event_type: str | None = None
) -> ErrorInfo | None:
    """Read an error out of a decoded JSON value, or None if it holds none.

    Accepts `{"error": {...}}` (OpenAI, Anthropic, Gemini, vLLM), `{"error":
    "text"}`, an error object itself (`{"type": "error", "code": ..,
    "message": ..}`), vLLM's old top-level `{"object": "error", ...}`, and a
    Responses WebSocket's HTTP error, `{"type": "error", "status": 429, "error": {...}}`.
    """
    if not isinstance(obj, dict):
        return None
    inner = obj.get("error")
    if isinstance(inner, dict) and inner:
        source: Mapping[str, Any] = inner
    elif isinstance(inner, str) and inner:
        source = {"message": inner}
    elif obj.get("type") == "error" or obj.get("object") == "error":
        source = obj
    else:
        return None
    raw_code = source.get("code")
    code_status = _as_status(raw_code)
    code = None if code_status is not None else _as_text(raw_code)
    if isinstance(raw_code, int) and not isinstance(raw_code, bool) and code_status is None:
        code = str(raw_code)
    # Gemini: {"code": 503, "status": "UNAVAILABLE"}; Azure adds a numeric "status".
    found_status = code_status or _as_status(source.get("status"))
    if found_status is None and source is not obj and obj.get("type") == "error":
        # the WebSocket's HTTP error carries its status beside the error (Codex reads `status_code` too)
        found_status = _as_status(obj.get("status")) or _as_status(obj.get("status_code"))
    if status is None or 200 <= status < 300:
        status = found_status  # inside a 2xx answer, the body's own status counts
    grpc = google_rpc.grpc_status(source.get("status"))  # Gemini's canonical name, its most telling code
    code = code or grpc
    err_type = _as_text(source.get("type"))
    if err_type == "error":
        err_type = None
    message = _as_text(source.get("message")) or _as_text(obj.get("message")) or ""
    details = source.get("details")  # Google's typed details (google_rpc.py)
    if err_type is None and google_rpc.daily_quota(details):
        err_type = google_rpc.DAILY_QUOTA
    return ErrorInfo(
        status=status,
        code=code,
        type=err_type,
        message=message[:MESSAGE_LIMIT],
        event_type=event_type,
        retry_after_s=google_rpc.retry_delay_s(details, message) if grpc or details is not None else None,
    )


def http_error_info(status: int, body: bytes) -> ErrorInfo:
    """The facts of a non-2xx answer, whatever its body looks like."""
    info = None
    try:
        decoded = json.loads(body)
        if isinstance(decoded, list) and len(decoded) == 1:
            decoded = decoded[0]  # Gemini's streamGenerateContent without alt=sse: an array, even for errors
        info = error_info(decoded, status=status)
    except (ValueError, RecursionError):
        pass
    if info is not None:
        return replace(info, status=status, event_type="http")
    text = body.decode("utf-8", errors="replace").strip()
    return ErrorInfo(status=status, message=text[:MESSAGE_LIMIT], event_type="http")


def openai_error_body(message: str, code: str, error_type: str | None = None) -> bytes:
    """An error body as OpenAI's APIs (Chat and Responses alike) send one."""
    error = {"message": message, "type": error_type or "server_error", "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def has_overload_text(message: str) -> bool:
    lowered = message.lower()
    if lowered.strip().rstrip(".") in OVERLOAD_MESSAGES:
        return True
    return any(text in lowered for text in OVERLOAD_TEXTS)


@dataclass(frozen=True, slots=True)
class ErrorPolicy:
    retry_on: frozenset[int] = DEFAULT_RETRY_ON

    def decide(self, info: ErrorInfo, should_retry: str | None = None) -> Decision:
        if should_retry is not None:
            flag = should_retry.strip().lower()
            if flag == "true":
                return Decision.RETRY
            if flag == "false":
                return Decision.FATAL
        lowered = info.message.lower()
        if info.code in NEXT_UPSTREAM_CODES or info.type in NEXT_UPSTREAM_CODES:
            return Decision.NEXT_UPSTREAM
        if any(text in lowered for text in NEXT_UPSTREAM_TEXTS):
            return Decision.NEXT_UPSTREAM
        if has_overload_text(lowered):
            return Decision.RETRY
        if info.code in RETRYABLE_CODES or info.type in RETRYABLE_CODES:
            return Decision.RETRY
        if info.retryable_hint and info.code is None and info.type is None:
            return Decision.RETRY
        if info.status is not None and info.status in self.retry_on:
            return Decision.RETRY
        return Decision.FATAL


def rewrite_capacity_codes(raw: bytes) -> bytes:
    """After output, `server_is_overloaded`/`slow_down` become `server_error` so
    clients treat the error as a retryable server error (their own retry, not ours)."""
    for code in CAPACITY_CODES:
        raw = raw.replace(b'"' + code.encode() + b'"', b'"server_error"')
    return raw


# --- what a provider calls an error of a given status ---------------------------------


def _openai_code(status: int) -> str:
    if status == 429:
        return "rate_limit_exceeded"
    if status in (503, 529):
        return "server_is_overloaded"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _anthropic_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "overloaded_error",
        529: "overloaded_error",
    }.get(status, "api_error" if status >= 500 else "invalid_request_error")


def code_and_type_for_status(api: str, status: int) -> tuple[str, str]:
    """What a provider of `api` calls an error of `status` (Anthropic's carry a type
    only): for failures Switchyard tells in the API's shape, a fault made on purpose
    or a provider's error that named no type of its own.  Without one, a 401 told in
    band would read as a server error, which clients' retry policies retry."""
    if api == "anthropic-messages":
        error_type = _anthropic_type(status)
        return error_type, error_type
    if api == "google-gemini":
        name = google_rpc.status_for_http(status)
        return name, name
    return _openai_code(status), "server_error" if status >= 500 else "invalid_request_error"
