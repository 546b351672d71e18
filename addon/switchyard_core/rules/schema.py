"""The `rules.yaml` version 1 contract, as pydantic models.

These models describe the file exactly as users write it: every key is
checked, unknown keys are errors, and nothing is resolved yet.  `loader`
turns a validated file into the runtime `Route`s.

Each key's meaning is its `description`, and the value a key has when it is
left out is written here and nowhere else (`setting`, `default_of`): the
loader's `AttemptSettings` and the generated reference (docs/rules.md, from
`reference.py`) both read it from here.  A type alias names itself for the
reference with `Shown`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, NonNegativeFloat, NonNegativeInt

from ..apis.errors import DEFAULT_RETRY_ON


@dataclass(frozen=True)
class Shown:
    """How the rules reference names a type (metadata of an `Annotated` alias; pydantic ignores it)."""

    text: str


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


Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0), Shown("size: bytes, or e.g. `8MiB`, `512KB`")]


def not_a_flag(value: object) -> object:
    """YAML's `true`/`yes` are numbers to pydantic (1): a timeout written as `true`
    would silently become one second."""
    if isinstance(value, bool):
        raise ValueError(f"a number is needed here, not {str(value).lower()}")
    return value


Count = Annotated[NonNegativeInt, BeforeValidator(not_a_flag), Shown("integer ≥ 0")]
Seconds = Annotated[NonNegativeFloat, BeforeValidator(not_a_flag), Shown("seconds ≥ 0")]
Status = Annotated[int, BeforeValidator(not_a_flag), Field(ge=100, le=599), Shown("HTTP status (100–599)")]


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


def setting(default: JsonValue, description: str) -> Any:
    """A key that may be left out (it reads as None, so that a route's can be told from the
    defaults'), and what it then is, written as in `rules.yaml`: the one place it is written."""
    return Field(default=None, description=description, json_schema_extra={"default": default})


def default_of(model: type[BaseModel], name: str) -> Any:
    """What key `name` of `model` is when it is left out, as written in `rules.yaml`
    (None: nothing; the key's description says what that means)."""
    info = model.model_fields[name]
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "default" in extra:
        return extra["default"]
    return info.get_default(call_default_factory=True)


class Settings(_Strict):
    """How attempts go: each setting may be set in `defaults` (for every route) or on a route (for its own
    requests, over `defaults`)."""

    retries: Count | None = setting(
        1, "Extra tries on the same upstream after a retryable failure before output; then the next upstream is "
           "asked. An upstream's own `retries` wins for that upstream.")
    backoff_ms: Count | None = setting(
        250, "The wait before a same-upstream retry, doubled for each further one, with jitter. A wait the provider "
             "states (`Retry-After`, `retry-after-ms`, Gemini's `RetryInfo`) is used instead.")
    max_backoff_ms: Count | None = setting(
        4000, "The longest wait before a same-upstream retry: a stated wait longer than this moves on to the next "
              "upstream at once instead.")
    connect_timeout_s: Seconds | None = setting(
        10, "Bound on opening a connection to an upstream (TCP, TLS, an upstream proxy's CONNECT). 0: no bound.")
    headers_timeout_s: Seconds | None = setting(
        30, "A stream's response headers must come this long after the attempt began, else the attempt fails "
            "with a timeout. 0: no bound.")
    first_output_timeout_s: Seconds | None = setting(
        0, "A stream's first output must come this long after the attempt began, else the attempt fails with a "
           "timeout. 0: off.")
    request_timeout_s: Seconds | None = setting(
        600, "A whole (non-streaming) answer must be done this long after its attempt began, head and body; a "
             "stream's first output must come within it (comments and lifecycle frames do not extend it). "
             "0: no bound.")
    idle_timeout_s: Seconds | None = setting(
        60, "Silence allowed after output has begun; past it the stream ends with an in-band `stream_stalled` "
            "error (or is finished by `continue_after_cut`). 0: no bound.")
    pre_answer_keepalive_s: Seconds | None = setting(
        15, "When a stream has no output yet after this long, the client gets headers (`200`, "
            "`text/event-stream`) and then a keepalive (an SSE comment; on Gemini routes a blank line) every "
            "interval, so that it does not time out; a later failure then arrives as an in-band error. 0: off.")
    staging_limit: Size | None = setting(
        "8MiB", "How much is held back before the first output; past it the attempt commits and passes through "
                "(a replay would no longer be safe). Also bounds what is kept of an answer to continue it.")
    rewrite_capacity_codes: bool | None = setting(
        True, "After output, a failure coded `server_is_overloaded` or `slow_down` reaches the client as "
              "`server_error`, so that the client does not take a half-streamed answer for a capacity failure "
              "to retry.")
    retry_on: list[Status] | None = setting(
        list[JsonValue](sorted(DEFAULT_RETRY_ON)), "Statuses (of an answer or an in-stream error) that make a failure retryable "
                                  "when neither a header nor a code has decided it. Transport failures and "
                                  "timeouts are retryable whatever this says.")
    continue_after_cut: Strategies | None = setting(
        [], "How to finish an answer cut or stalled after output, tried in order: `prefill` (an upstream with "
            "`prefill: true` goes on from the text the client has), `regenerate` (the request again; only what "
            "follows that text is sent). `[]`: the cut ends with an in-band error.")
    max_skip_s: Seconds | None = setting(
        300, "The longest later requests skip an upstream because its failure stated a delay (`Retry-After`, "
             "`retry-after-ms`, Gemini's `RetryInfo`): a longer delay is cut to this. 0: a stated delay is honoured "
             "only within the request that got it.")
    unreachable_skip_s: Seconds | None = setting(
        10, "How long later requests skip an upstream that could not be reached or did not answer (connection "
            "refused, a name that does not resolve, a TLS failure, a connect timeout, no response headers within "
            "`headers_timeout_s`); after that, one request tries it while the others keep skipping it. 0: off.")
    hedge_after_s: Seconds | None = setting(
        0, "When an attempt has produced no output after this long, the next upstream is asked too, without "
           "stopping the first; the first to produce output wins and the other is stopped before any of its "
           "bytes reach the client (its prompt may still be billed). 0: off.")


class Match(_Strict):
    """Which requests a route takes (a route's `match`): every key given must match; a key left out matches
    anything."""

    host: str | None = Field(
        default=None, description="The request's host, exact or a glob (`*.openai.azure.com`), in any case. Behind a "
                          "transparent, local, WireGuard or TUN listener: the name the client meant (its `Host` "
                          "header, else its TLS SNI).")
    path: str | None = Field(
        default=None, description="The request's path without its query, exact or a glob (`/v1*/models/*`).")
    model: str | None = Field(
        default=None, description="A glob on the model asked for: the JSON body's `model`; on Gemini, the model in the "
                          "path.")


class Auth(_Strict):
    """The credential an upstream gets instead of the client's (an upstream's `auth`)."""

    header: str = Field(min_length=1, description="The header's name (`Authorization`, `x-api-key`, ...).")
    value: str = Field(description="Its value; `${VAR}` is expanded from the environment, and the value is never "
                                   "shown.")


class UpstreamSpec(_Strict):
    """One place a route's requests may go (`upstreams: [...]` of a route), tried in order."""

    name: str = Field(min_length=1, description="Unique within its route; named in log lines, "
                                                "`x-switchyard-upstream` and mitmweb.")
    url: str = Field(
        min_length=1, description="`original`: the request's own destination, with the client's own credentials. "
                                  "Else an http(s) URL (the request's query is appended when it has none; on "
                                  "Gemini a base URL or a model call). `${VAR}` is expanded.")
    model: str | None = Field(
        default=None, description="The model to ask this upstream for instead of the client's: written into the body's "
                          "`model` (on Gemini, into the path).")
    retries: Count | None = Field(default=None, description="This upstream's own `retries`; left out: the route's.")
    auth: Auth | None = Field(
        default=None, description="A header with this upstream's credential, e.g. `{header: Authorization, value: "
                          "\"Bearer ${BACKUP_API_KEY}\"}`.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Headers added to every request to this upstream; `${VAR}` is expanded "
                                          "(such values are shown as `[redacted]`).")
    forward_headers: list[str] = Field(
        default_factory=list, description="The client's headers that look like credentials and that this upstream, "
                                          "on another origin, should get all the same (names, any case).")
    forward_query: list[str] = Field(
        default_factory=list, description="Likewise for the client's query parameters.")
    prefill: bool = Field(
        default=False, description="It goes on from a conversation that ends in an assistant message: "
                           "`continue_after_cut`'s `prefill` asks it.")
    prefill_body: Annotated[dict[str, Any] | None, AfterValidator(none_of("messages", "stream"))] = Field(
        default=None, description="Merged into a prefill request's top level, e.g. vLLM's `{continue_final_message: true, "
                          "add_generation_prompt: false}`; not `messages` or `stream`. Only with `prefill: true`.")
    prefill_message: Annotated[dict[str, Any] | None, AfterValidator(none_of("role", "content"))] = Field(
        default=None, description="Merged into a prefill request's final assistant message, e.g. DeepSeek's "
                          "`{prefix: true}`; not `role` or `content`. Only with `prefill: true`.")
    websocket: Literal["auto"] | Annotated[bool, Field(strict=True)] = Field(
        default="auto", description="Responses turns over WebSocket: `auto` tries the upgrade and takes HTTP SSE when the "
                            "upstream refuses it; `true` WebSocket only (a refusal is a failed attempt); `false` "
                            "HTTP SSE only.")
    api: ApiName | None = Field(
        default=None, description="The API this upstream speaks, when it is not its route's: the request is translated "
                                  "into it and its answer back into the route's (docs/translation.md). `model` is "
                                  "then required. Left out: the route's API.")


class RouteSpec(Settings):
    """A kind of request and where it may go (`routes: [...]`); every setting may be set on a route too."""

    name: str = Field(min_length=1, description="Unique; named in log lines and mitmweb.")
    match: Match = Field(default_factory=Match,
                         description="Which requests the route takes; the first route that matches a request "
                                     "takes it.")
    api: ApiName | None = Field(
        default=None, description="The API the route speaks; left out, it is inferred from `match.path` (set it for an "
                          "unusual path).")
    upstreams: list[UpstreamSpec] = Field(
        min_length=1, description="Where its requests go, in order: a failure before output moves on to the next; "
                                  "the first to produce output wins.")


class FaultSpec(_Strict):
    """A failure on purpose (`faults: [...]`): the real request is sent, and its answer is replaced or cut."""

    route: str = Field(description="The route whose attempts fail, by name.")
    upstream: str | None = Field(default=None, description="Only this upstream's attempts; left out: any of the route's.")
    kind: FaultKind = Field(
        description="`sse_error` an in-stream error frame; `http_error` an HTTP error answer; `response_failed` a "
                    "`response.failed` event (other APIs: their in-stream error); `overload_message` an error "
                    "that says only \"Our servers are currently overloaded.\"; `reset` the connection dropped; "
                    "`stall` silence (before output a failure only once a timeout says so: set "
                    "`first_output_timeout_s`).")
    status: Status | None = setting(503, "The error's status.")
    message: str | None = setting(
        "provider overloaded (switchyard fault)", "The error's message (`overload_message` says the provider's "
                                                  "overload text unless this is set).")
    after_frames: Count = Field(default=0, description="Real frames (lifecycle ones included) passed first; 0: fail at once.")
    rate: Annotated[float, BeforeValidator(not_a_flag), Field(ge=0.0, le=1.0), Shown("number from 0 to 1")] = Field(
        default=1.0, description="The chance that an attempt gets the fault.")
    count: Annotated[int, BeforeValidator(not_a_flag), Field(gt=0), Shown("integer ≥ 1")] | None = Field(
        default=None, description="At most this many attempts get it (counted again when the rules reload); left out: "
                          "every one, until the fault is removed.")


class RulesFile(_Strict):
    """The keys at the top of a `rules.yaml` file."""

    version: Literal[1] = Field(description="The file's format; 1.")
    defaults: Settings = Field(default_factory=Settings, description="Settings for every route (each may be set "
                                                                     "on a route instead).")
    routes: list[RouteSpec] = Field(default_factory=list, description="The kinds of request Switchyard takes; the "
                                                                      "first that matches a request takes it. A "
                                                                      "request no route takes passes untouched.")
    faults: list[FaultSpec] = Field(default_factory=list, description="Failures on purpose.")
