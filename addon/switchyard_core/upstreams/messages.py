"""Each attempt's request and answer, as data: which URL and headers an upstream
gets, which answer headers the client gets, and how transport failures read.

Kept apart from the attempt loop so that the loop reads as policy, and from
the client (`client.py`) so that these rules can be tested without a network.  Nothing
here reads proxy settings from the environment: the user's HTTPS_PROXY usually
points at mitmproxy itself.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit


from ..apis.base import ErrorInfo
from ..apis.google_gemini import NAME as GEMINI
from ..apis.google_gemini import upstream_path
from ..exchange import OriginalRequest
from ..redaction import env_secrets, looks_like_credential, query_name
from ..rules import Upstream
from ..sse import compact_json
from .body import Body

# Never forwarded: connection-level, recomputed, or ours.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def _query_key(piece: str) -> str:
    return query_name(piece).lower()

# Response headers that describe the upstream's framing, not the content we relay.
RESPONSE_DROP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "trailer",
        "upgrade",
    }
)

ACCEPT_ENCODING = "gzip, deflate"

REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-generation-id", "apim-request-id", "cf-ray")


# The URL functions below are pure, and every request of a route asks them about the
# same few URLs (the client's, each upstream's): remembered, they leave urllib's parsing
# off the way to the upstream's first byte.  Bounded: a client may vary its query.
URL_CACHE = 512


@lru_cache(maxsize=URL_CACHE)
def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    # where to connect, if not to the URL's host: the address a transparent or local listener
    # knew (the URL holds the name, for `Host` and TLS)
    address: str | None = None
    # what the upstream's `${VAR}`s hold (`redaction.env_secrets`): redacted from its answer's head,
    # a WebSocket's close reason and refusal, as from what it streams
    secrets: tuple[bytes, ...] = ()
    # on another origin than the client's destination: a cookie it sets is not the client's
    other_origin: bool = False


@lru_cache(maxsize=URL_CACHE)
def target_url(original_url: str, upstream_url: str | None, model: str | None = None, api: str | None = None,
               forward_query: frozenset[str] = frozenset(), own_auth: bool = False) -> str:
    """Where an upstream's attempt goes: its URL plus the original query if it has
    none; the client's query parameters that look like credentials never cross
    origins, unless the upstream names them (`forward_query`, lowercased).  On a
    Gemini route the model and method are in the path (`gemini_target_url`)."""
    if api == GEMINI:
        path = upstream_path(urlsplit(original_url).path, urlsplit(upstream_url).path if upstream_url else None, model)
        if path is not None:
            return gemini_target_url(original_url, upstream_url, path, forward_query, own_auth)
    if upstream_url is None:
        return original_url
    target = urlsplit(upstream_url)
    if target.query:  # the upstream's own, from the rules (its `?key=${VAR}` included)
        return upstream_url
    query = urlsplit(original_url).query
    url = urlunsplit((target.scheme, target.netloc, target.path, query, ""))
    if query and is_cross_origin(url, original_url):
        # the rest as the client wrote it (a bare flag stays bare, its encoding stays)
        kept = "&".join(piece for piece in query.split("&")
                        if not looks_like_credential(_query_key(piece)) or _query_key(piece) in forward_query)
        url = urlunsplit((target.scheme, target.netloc, target.path, kept, ""))
    return url


def gemini_target_url(original_url: str, upstream_url: str | None, path: str,
                      forward_query: frozenset[str] = frozenset(), own_auth: bool = False) -> str:
    """A Gemini call re-aimed: `path` (google_gemini.upstream_path), the upstream's own
    query (its `key=${VAR}`), and the client's parameters it does not set itself:
    `alt=sse`, which makes the answer a stream, must reach every upstream.  The
    client's parameters that look like credentials (`key`) never cross origins,
    unless the upstream names them (`forward_query`), nor go to an upstream that brings
    its own (`own_auth`, or a credential in its query): Google refuses a call that
    carries two."""
    original = urlsplit(original_url)
    if upstream_url is None:
        return urlunsplit(original._replace(path=path))
    target = urlsplit(upstream_url)
    own = [piece for piece in target.query.split("&") if piece]
    named = {_query_key(piece) for piece in own}
    withhold = is_cross_origin(upstream_url, original_url) or own_auth or has_query_credential(upstream_url)
    theirs = [piece for piece in original.query.split("&")
              if piece and _query_key(piece) not in named
              and not (withhold and looks_like_credential(_query_key(piece)) and _query_key(piece) not in forward_query)]
    return urlunsplit((target.scheme, target.netloc, path, "&".join(own + theirs), ""))


def redact_query(url: str) -> str:
    """The URL as it may be shown beside redacted headers: credential query
    parameters (`?key=`, Gemini's) keep their names, not their values."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    pieces = parts.query.split("&")
    secret = [bool(piece) and looks_like_credential(_query_key(piece)) for piece in pieces]
    if not any(secret):
        return url
    shown = [piece.partition("=")[0] + "=[redacted]" if hidden else piece for piece, hidden in zip(pieces, secret)]
    return urlunsplit(parts._replace(query="&".join(shown)))


def has_query_credential(url: str | None) -> bool:
    """Whether a URL carries a credential of its own in its query (`?key=${VAR}`)."""
    return url is not None and any(looks_like_credential(_query_key(piece))
                                   for piece in urlsplit(url).query.split("&") if piece)


def origin_of(url: str) -> str:
    """`scheme://host:port`, as a log line names an origin (never a path or query)."""
    scheme, host, port = _origin(url)
    return f"{scheme}://{host}:{port}"


def is_cross_origin(url: str, other: str) -> bool:
    return _origin(url) != _origin(other)


def display_url(original: OriginalRequest, upstream: Upstream, api: str | None = None) -> str:
    """The attempt's URL as it may be shown: `${VAR}` values left unexpanded, except
    in the host and port, which must parse (mitmweb shows them as the destination)."""
    own_auth = upstream.auth is not None
    shown = target_url(original.url, upstream.display_url, upstream.model, api, upstream.forward_query, own_auth)
    real = target_url(original.url, upstream.url, upstream.model, api, upstream.forward_query, own_auth) \
        if "${" in shown else None
    return _shown_url(shown, real)


@lru_cache(maxsize=URL_CACHE)
def _shown_url(shown: str, real: str | None) -> str:
    parts = urlsplit(shown)
    if real is not None and "${" in parts.netloc:
        parts = parts._replace(netloc=urlsplit(real).netloc)
    return urlunsplit(parts)


def secret_header_names(upstream: Upstream | None) -> frozenset[str]:
    """Header names whose values must never be shown besides those that look like
    credentials: whatever the upstream's rules filled in from the environment."""
    return upstream.secret_headers if upstream else frozenset()


def build_request(original: OriginalRequest, upstream: Upstream, api: str | None = None) -> UpstreamRequest:
    """The request one upstream receives: the client's, re-aimed and re-credentialed
    (`api`: the route's, which says where its model is)."""
    own_auth = upstream.auth is not None
    url = target_url(original.url, upstream.url, upstream.model, api, upstream.forward_query, own_auth)
    # a Gemini upstream with a credential of its own gets none of the client's, on any
    # origin: Google refuses a call carrying two
    withhold = is_cross_origin(url, original.url) or (
        api == GEMINI and (own_auth or has_query_credential(upstream.url)))
    replaced = {name.lower() for name, _ in upstream.headers}
    if upstream.auth is not None:
        replaced.add(upstream.auth[0].lower())
    # headers the client's `Connection` names are for its hop only (an h2c offer's HTTP2-Settings)
    listed = {token.strip().lower() for name, value in original.headers if name.lower() == "connection"
              for token in value.split(",")}
    headers: list[tuple[str, str]] = []
    for name, value in original.headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in listed or lowered in replaced or lowered.startswith("x-switchyard-"):
            continue
        if withhold and looks_like_credential(lowered) and lowered not in upstream.forward_headers:
            continue  # the client's credentials stay with their origin
        if lowered == "accept-encoding":
            # only what the relay can decode: it hands clients decoded bytes
            value = ACCEPT_ENCODING
        headers.append((name, value))
    headers.extend(upstream.headers)
    if upstream.auth is not None:
        headers.append(upstream.auth)
    body = original.body
    if upstream.model is not None and api != GEMINI:
        body = _with_model(body, upstream.model)  # (Gemini's is in the path)
    return UpstreamRequest(original.method, url, tuple(headers), body,
                           original.address if upstream.url is None else None,
                           secrets=env_secrets(upstream), other_origin=is_cross_origin(url, original.url))


def _with_model(body: bytes, model: str) -> bytes:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(data, dict):
        return body
    data["model"] = model
    return compact_json(data)



def request_id(headers: Mapping[str, str]) -> str | None:
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name)
        if value:
            return str(value)[:100]
    return None


def forwarded_response_headers(upstream_headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The upstream's response headers as the client should get them."""
    return [
        (name, value)
        for name, value in upstream_headers.items()
        if name.lower() not in RESPONSE_DROP and not name.lower().startswith("x-switchyard-")
    ]


class ConnectTimeout(Exception):
    """No connection within the route's connect_timeout_s."""


class ConnectionBroke(ConnectionError):
    """The upstream closed or reset the connection, or sent something that is not HTTP.

    `what` says which, without anything from the request: it is logged and shown."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Answer(Protocol):
    """An upstream's answer as the attempt loop reads it: status, headers, body.

    The seam where faults are injected (`faulty_answer.FaultyAnswer` wraps a real
    answer), so the loop never knows whether a failure was real.
    """

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def body(self) -> Body: ...

    def close(self) -> None: ...


class Upstreams(Protocol):
    """Where attempts go: the relay's `UpstreamClient`, or a test's scripted stand-in.

    `sent(True)` once the request is on a connection, `sent(False)` when it moves
    to a fresh one (see `UpstreamClient.open`).  `headed`, where given, may be
    called with the answer as soon as its head is read, before `open` returns it
    (the same answer): one loop pass sooner."""

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float | None,
                   sent: Callable[[bool], None] | None = None,
                   headed: Callable[[Answer], None] | None = None) -> Answer: ...


async def read_bounded(answer: Answer, limit: int, timeout_s: float | None) -> tuple[bytes, bool]:
    """As much of a body as arrives within `limit` bytes and `timeout_s`, and whether
    that is all of it: for error bodies, which should follow their headers
    promptly and are read to classify (and to forward, if they are the last)."""
    chunks: list[bytes] = []
    size = 0
    complete = False
    try:
        async with asyncio.timeout(timeout_s or None):
            while size <= limit:
                chunk, error = await answer.body.read_some()
                chunks.append(chunk)
                size += len(chunk)
                if error is not None:
                    break
                if not chunk:
                    complete = size <= limit
                    break
    except TimeoutError:
        pass
    return b"".join(chunks)[:limit], complete


def unresolvable(exc: UnicodeError) -> socket.gaierror:
    """A host name that cannot be encoded for DNS (an empty label, one over 63 characters)
    is a name that does not resolve: the resolver raises a UnicodeError, no OSError, for it."""
    return socket.gaierror(socket.EAI_NONAME, f"name does not resolve ({exc})")


def unreachable(exc: BaseException) -> bool:
    """Whether a transport failure says the upstream cannot be reached at all (refused, a
    name that does not resolve, unreachable, TLS), rather than that it broke off an answer."""
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionBroke):
        return False
    return isinstance(exc, OSError)


def transport_failure(exc: BaseException) -> ErrorInfo:
    """A transport failure, described without anything from the request.

    Retryable in its own right, whatever the route's `retry_on` says: the upstream never
    answered, so asking it (or the next one) again is safe."""
    if isinstance(exc, socket.gaierror):
        what = "name does not resolve"
    elif isinstance(exc, ssl.SSLCertVerificationError):
        what = f"TLS handshake failed: certificate not trusted ({exc.verify_message or 'verify failed'})"
    elif isinstance(exc, ssl.SSLError | ssl.CertificateError):
        reason = getattr(exc, "reason", None)  # OpenSSL's own words (WRONG_VERSION_NUMBER: not TLS at all)
        what = f"TLS handshake failed ({reason})" if reason else "TLS handshake failed"
    elif isinstance(exc, ConnectionResetError | BrokenPipeError):
        what = "connection reset"
    elif isinstance(exc, ConnectionBroke):
        what = exc.what
    elif isinstance(exc, OSError):
        what = "connection refused or unreachable"
    else:
        what = type(exc).__name__
    return ErrorInfo(status=502, message=what, event_type="transport", retryable_hint=True)
