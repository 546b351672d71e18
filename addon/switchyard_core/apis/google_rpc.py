"""Google's error model (`google.rpc.Status`), as the Gemini API sends it.

`{"error": {"code": 429, "message": ..., "status": "RESOURCE_EXHAUSTED",
"details": [...]}}`: `code` is the HTTP status, `status` the canonical gRPC
name, and `details` typed messages told apart by their `@type`.  Two of them
change what a failure is worth: `RetryInfo.retryDelay` says how long to wait
(honoured like `Retry-After`), and a `QuotaFailure` naming a per-day quota
says that waiting minutes will not help (the next upstream might).  Shapes as
Gemini CLI reads them (`googleQuotaErrors.ts`) and as Google's servers send
them, where a 429 may carry its delay only in its message ("Please retry in
38.9s.") and no `RetryInfo` (the recorded bodies in tests/fixtures/gemini_*).
"""

from __future__ import annotations

import re
from typing import Any

from ..delays import delay_in_text, duration_seconds

_TYPE_PREFIX = "type.googleapis.com/google.rpc."

# the canonical codes and the HTTP status each stands for (google/rpc/code.proto)
GRPC_HTTP: dict[str, int] = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}

_HTTP_GRPC = {http: name for name, http in reversed(GRPC_HTTP.items())}  # the first name of each status


def status_for_http(status: int) -> str:
    """The canonical name Google gives an HTTP status (`503` -> `UNAVAILABLE`)."""
    if status == 500:
        return "INTERNAL"  # not UNKNOWN, which also stands for 500
    found = _HTTP_GRPC.get(status)
    if found is not None:
        return found
    if 500 <= status < 600:
        return "UNAVAILABLE" if status in (502, 529) else "INTERNAL"
    return "FAILED_PRECONDITION" if 400 <= status < 500 else "UNKNOWN"


# the error type Switchyard gives a 429 whose quota is a daily one: next upstream only
DAILY_QUOTA = "daily_quota_exhausted"

# "Please retry in 25.465784708s." in the message, where no RetryInfo says it
_RETRY_IN = re.compile(r"Please retry in ([0-9]+(?:\.[0-9]+)?)(ms|s)\b")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)(ms|s)\s*$")


def grpc_status(value: Any) -> str | None:
    """A canonical status name (`UNAVAILABLE`), or None."""
    return value if isinstance(value, str) and value in GRPC_HTTP else None


def _details_of(kind: str, details: Any) -> list[dict[str, Any]]:
    if not isinstance(details, list):
        return []
    return [d for d in details if isinstance(d, dict) and d.get("@type") == _TYPE_PREFIX + kind]


def duration_s(value: Any) -> float | None:
    """A protobuf Duration as JSON (`"38s"`, `"34.074824224s"`; `"900ms"` as some
    gateways write it; `{"seconds": 38, "nanos": 0}` as a decoded message), read as
    any delay an upstream states is (delays.py: huge cut, negative or NaN ignored)."""
    if isinstance(value, str):
        found = _DURATION.match(value)
        if found is None:
            return None
        return delay_in_text(found.group(1), 0.001 if found.group(2) == "ms" else 1.0)
    if isinstance(value, dict):
        return duration_seconds(value.get("seconds", 0), value.get("nanos", 0))
    return None


def retry_delay_s(details: Any, message: str) -> float | None:
    """How long the provider asks to wait: `RetryInfo.retryDelay`, else the
    "Please retry in …" its message ends with."""
    for info in _details_of("RetryInfo", details):
        delay = duration_s(info.get("retryDelay"))
        if delay is not None:
            return delay
    found = _RETRY_IN.search(message) if isinstance(message, str) else None
    if found is None:
        return None
    return delay_in_text(found.group(1), 0.001 if found.group(2) == "ms" else 1.0)


def _daily(name: Any) -> bool:
    return isinstance(name, str) and ("PerDay" in name or "Daily" in name)


def daily_quota(details: Any) -> bool:
    """A `QuotaFailure` violation (or an `ErrorInfo`'s `quota_limit`) that names a
    per-day quota: it resets in hours, not within any backoff."""
    for failure in _details_of("QuotaFailure", details):
        violations = failure.get("violations")
        for violation in violations if isinstance(violations, list) else ():
            if isinstance(violation, dict) and _daily(violation.get("quotaId")):
                return True
    for info in _details_of("ErrorInfo", details):
        metadata = info.get("metadata")
        if isinstance(metadata, dict) and _daily(metadata.get("quota_limit")):
            return True
    return False
