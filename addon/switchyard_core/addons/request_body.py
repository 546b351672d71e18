"""A request's body as the Router reads it to route: at most once, bounded, decoded
if it came compressed, and the top-level fields of its JSON that routing reads
(a route's `model`, whether the client asked for a stream)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
from mitmproxy import http

from .. import observe
from ..apis.google_gemini import model_in_path
from ..upstreams.content_coding import MalformedBody, UnsupportedCoding, decode_within

# The most of a request body read to route it (decoded, if it came compressed): a body
# of 1 MB can inflate to gigabytes.  A larger one goes to its destination unrouted.
ROUTE_BODY_LIMIT = 32 * 1024 * 1024


class RequestBody(NamedTuple):
    """A request body as the Router read it to route."""

    raw: bytes  # what upstreams are sent
    json: Any  # its JSON's routing fields (`top_level`), None if it is no JSON
    decoded: bool = False  # `raw` is the body decoded: its Content-Encoding no longer applies
    too_large: bool = False  # past ROUTE_BODY_LIMIT: not read, not routed


def read_body(request: http.Request) -> RequestBody:
    raw = request.raw_content or b""
    coding = request.headers.get("content-encoding")
    decoded = False
    if coding is None:  # the common case, without a decode step (it is on the first token's path)
        if len(raw) > ROUTE_BODY_LIMIT:
            return RequestBody(raw, None, too_large=True)
    else:
        try:
            plain = decode_within(raw, coding, ROUTE_BODY_LIMIT)
        except (MalformedBody, UnsupportedCoding):
            return RequestBody(raw, None)  # passed on as the client sent it, for its destination to judge
        if plain is None:
            return RequestBody(raw, None, too_large=True)
        raw, decoded = plain, plain is not raw
    try:
        return RequestBody(raw, top_level(raw), decoded)
    except (ValueError, RecursionError):
        return RequestBody(raw, None, decoded)


class _RoutingFields(msgspec.Struct):
    model: Any = msgspec.UNSET
    stream: Any = msgspec.UNSET
    stream_options: Any = msgspec.UNSET


_ROUTING_FIELDS = msgspec.json.Decoder(_RoutingFields)
ROUTING_FIELDS = _RoutingFields.__struct_fields__


def top_level(raw: bytes) -> Any:
    """The body's JSON as routing reads it: of an object, only the fields in
    ROUTING_FIELDS that it has; any other JSON value whole.  An agent's request
    carries its whole conversation, and Python's `json` builds every object of it
    (about 3 ms a MiB) on the first token's path; msgspec checks the whole text is
    JSON but builds only these fields (docs/benchmarks.md, "Fourth pass").  Where
    msgspec reads more strictly than Python (`NaN`, UTF-16, a lone surrogate) or the
    body is no object, Python's reading decides, so both agree on every input."""
    try:
        found = _ROUTING_FIELDS.decode(raw)
    except msgspec.DecodeError:  # (a ValidationError too: not an object)
        value = json.loads(raw or b"")
        return {name: value[name] for name in ROUTING_FIELDS if name in value} if isinstance(value, dict) else value
    return {name: value for name in ROUTING_FIELDS if (value := getattr(found, name)) is not msgspec.UNSET}


def not_routed_too_large(route: str | None) -> None:
    observe.emit(logging.WARNING, "switchyard.not_routed", route=route,
                 reason=f"request body is over {ROUTE_BODY_LIMIT // (1024 * 1024)} MiB (decoded); "
                        "sent to its destination unrouted")


def requested_model(path: str, body: Callable[[], Any]) -> str | None:
    """The model a request names: in its path for Gemini, else the JSON body's `model`."""
    in_path = model_in_path(path)
    if in_path is not None:
        return in_path
    found = body()
    model = found.get("model") if isinstance(found, dict) else None
    return model if isinstance(model, str) else None
