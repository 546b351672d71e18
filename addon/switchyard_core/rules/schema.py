"""The `rules.yaml` version 1 contract (the README's "Rules" section), as pydantic models.

These models describe the file exactly as users write it: every key is
checked, unknown keys are errors, and nothing is resolved yet.  `loader`
turns a validated file into the runtime `Route`s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

ApiName = Literal["openai-chat", "openai-responses", "anthropic-messages", "google-gemini"]
Strategy = Literal["prefill", "regenerate"]
FaultKind = Literal["sse_error", "http_error", "response_failed", "overload_message", "reset", "stall"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 1000**2,
    "mib": 1024**2,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(value: object) -> object:
    """`8MiB`, `512KB`, `1048576` -> bytes; anything else is left for pydantic to reject."""
    not_a_flag(value)
    if isinstance(value, str):
        found = _SIZE.match(value)
        if not found:
            raise ValueError(f"not a size: {value!r} (use a number of bytes or e.g. 8MiB, 512KB)")
        number, unit = found.groups()
        return int(float(number) * _UNITS[(unit or "b").lower()])
    return value


Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]


def not_a_flag(value: object) -> object:
    """YAML's `true`/`yes` are numbers to pydantic (1): a timeout written as `true`
    would silently become one second."""
    if isinstance(value, bool):
        raise ValueError(f"a number is needed here, not {str(value).lower()}")
    return value


Count = Annotated[NonNegativeInt, BeforeValidator(not_a_flag)]
Seconds = Annotated[NonNegativeFloat, BeforeValidator(not_a_flag)]
Status = Annotated[int, BeforeValidator(not_a_flag), Field(ge=100, le=599)]


def each_once(strategies: list[str]) -> list[str]:
    """A strategy named twice would be tried twice, which is never what was meant."""
    twice = sorted({s for s in strategies if strategies.count(s) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)} is listed more than once")
    return strategies


Strategies = Annotated[list[Strategy], AfterValidator(each_once)]

def none_of(*keys: str) -> Callable[[dict[str, Any] | None], dict[str, Any] | None]:
    """A mapping merged into a prefill request may not replace what makes it one: the
    request's `messages` and `stream`, the final message's `role` and `content` (the
    text the client has: replaced, the continuation would repeat or skip some)."""

    def check(merged: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = [key for key in keys if merged and key in merged]
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set here: the continuation request's own")
        return merged

    return check


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Settings(_Strict):
    """Attempt settings; every field may be set in `defaults` or on a route."""

    retries: Count | None = None
    backoff_ms: Count | None = None
    max_backoff_ms: Count | None = None
    connect_timeout_s: Seconds | None = None
    headers_timeout_s: Seconds | None = None
    first_output_timeout_s: Seconds | None = None
    request_timeout_s: Seconds | None = None
    idle_timeout_s: Seconds | None = None
    pre_answer_keepalive_s: Seconds | None = None
    staging_limit: Size | None = None
    rewrite_capacity_codes: bool | None = None
    retry_on: list[Status] | None = None
    continue_after_cut: Strategies | None = None  # after a cut or stall: how to finish the answer
    max_skip_s: Seconds | None = Field(default=None, description=(
        "The longest later requests skip an upstream because its failure stated a delay (Retry-After, "
        "retry-after-ms, Gemini's RetryInfo): a longer delay is cut to this. 0: a stated delay is honoured "
        "only within the request that got it. Default 300."))
    unreachable_skip_s: Seconds | None = Field(default=None, description=(
        "How long later requests skip an upstream that could not be reached or did not answer (connection "
        "refused, a name that does not resolve, a TLS failure, a connect timeout, no response headers within "
        "headers_timeout_s); after that, one request tries it while the others keep skipping it. "
        "0 turns this off. Default 10."))
    hedge_after_s: Seconds | None = Field(default=None, description=(
        "When an attempt has produced no output after this many seconds, also start the next upstream without "
        "stopping the first; the first to produce output wins and the other is cancelled (its prompt may "
        "still be billed). 0 turns hedging off. Default 0."))


class Match(_Strict):
    host: str | None = None
    path: str | None = None
    model: str | None = None


class Auth(_Strict):
    header: str = Field(min_length=1)
    value: str


class UpstreamSpec(_Strict):
    name: str = Field(min_length=1)
    url: str = Field(min_length=1)
    model: str | None = None
    retries: Count | None = None
    auth: Auth | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    # the client's headers and query parameters that look like credentials but that this
    # upstream, on another origin, should still get (by name; the rest never go there)
    forward_headers: list[str] = Field(default_factory=list)
    forward_query: list[str] = Field(default_factory=list)
    prefill: bool = False  # it continues a conversation that ends in an assistant message
    prefill_body: Annotated[dict[str, Any] | None, AfterValidator(none_of("messages", "stream"))] = None
    prefill_message: Annotated[dict[str, Any] | None, AfterValidator(none_of("role", "content"))] = None
    # Responses turns over WebSocket: auto tries the upgrade and takes HTTP SSE when refused
    websocket: Literal["auto"] | Annotated[bool, Field(strict=True)] = "auto"
    api: ApiName | None = Field(default=None, description=(
        "The API this upstream speaks, when it is not the route's: the request is translated into it and its "
        "answer back into the route's (docs/translation.md). `model` is then required. Default: the route's API."))


class RouteSpec(Settings):
    name: str = Field(min_length=1)
    match: Match = Field(default_factory=Match)
    api: ApiName | None = None
    upstreams: list[UpstreamSpec] = Field(min_length=1)


class FaultSpec(_Strict):
    route: str
    upstream: str | None = None
    kind: FaultKind
    status: Status | None = None
    message: str | None = None
    after_frames: Count = 0
    rate: Annotated[float, BeforeValidator(not_a_flag), Field(ge=0.0, le=1.0)] = 1.0
    count: Annotated[int, BeforeValidator(not_a_flag), Field(gt=0)] | None = None


class RulesFile(_Strict):
    version: Literal[1]
    defaults: Settings = Field(default_factory=Settings)
    routes: list[RouteSpec] = Field(default_factory=list)
    faults: list[FaultSpec] = Field(default_factory=list)
