"""HTTP plumbing towards upstreams: building each attempt's request, opening it.

Kept apart from the attempt loop so that the loop reads as policy.  The
upstream client never reads proxy settings from the environment: the user's
HTTPS_PROXY usually points at mitmproxy itself.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit, parse_qsl, urlencode

import aiohttp
import certifi

from ..protocols.base import ErrorInfo
from ..rules import Upstream
from .exchange import OriginalRequest

# Never forwarded: connection-level, recomputed, or ours.
_HOP_BY_HOP = frozenset(
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

# The client's credentials: never sent to an upstream on another origin.
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "openai-organization",
        "openai-project",
        "anthropic-admin-api-key",
    }
)
_CREDENTIAL_QUERY = frozenset({"key", "api_key", "api-key", "apikey"})

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


def target_url(original_url: str, upstream_url: str | None) -> str:
    """Where an upstream's attempt goes: its URL plus the original query if it has
    none; the client's credential query parameters never cross origins."""
    if upstream_url is None:
        return original_url
    target = urlsplit(upstream_url)
    query = target.query or urlsplit(original_url).query
    url = urlunsplit((target.scheme, target.netloc, target.path, query, ""))
    if query and is_cross_origin(url, original_url):
        kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() not in _CREDENTIAL_QUERY]
        url = urlunsplit((target.scheme, target.netloc, target.path, urlencode(kept), ""))
    return url


def is_cross_origin(url: str, other: str) -> bool:
    return _origin(url) != _origin(other)


def display_url(original: OriginalRequest, upstream: Upstream) -> str:
    """The attempt's URL as it may be shown: `${VAR}` values left unexpanded, except
    in the host and port, which must parse (mitmweb shows them as the destination)."""
    shown = urlsplit(target_url(original.url, upstream.display_url))
    if "${" in shown.netloc:
        real = urlsplit(target_url(original.url, upstream.url))
        shown = shown._replace(netloc=real.netloc)
    return urlunsplit(shown)


def secret_header_names(upstream: Upstream | None) -> frozenset[str]:
    """Header names whose values must never be shown: the client's credentials and
    whatever the upstream's rules filled in from the environment."""
    return CREDENTIAL_HEADERS | (upstream.secret_headers if upstream else frozenset())


def build_request(original: OriginalRequest, upstream: Upstream) -> UpstreamRequest:
    """The request one upstream receives: the client's, re-aimed and re-credentialed."""
    url = target_url(original.url, upstream.url)
    cross_origin = is_cross_origin(url, original.url)
    replaced = {name.lower() for name, _ in upstream.headers}
    if upstream.auth is not None:
        replaced.add(upstream.auth[0].lower())
    headers: list[tuple[str, str]] = []
    for name, value in original.headers:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP or lowered in replaced or lowered.startswith("x-switchyard-"):
            continue
        if cross_origin and lowered in CREDENTIAL_HEADERS:
            continue
        if lowered == "accept-encoding":
            # only what the relay can decode: it hands clients decoded bytes
            value = ACCEPT_ENCODING
        headers.append((name, value))
    headers.extend(upstream.headers)
    if upstream.auth is not None:
        headers.append(upstream.auth)
    body = original.body
    if upstream.model is not None:
        body = _with_model(body, upstream.model)
    return UpstreamRequest(original.method, url, tuple(headers), body)


def _with_model(body: bytes, model: str) -> bytes:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(data, dict):
        return body
    data["model"] = model
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def request_id(headers: Mapping[str, str]) -> str | None:
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name)
        if value:
            return str(value)[:100]
    return None


def client_headers(upstream_headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The upstream's response headers as the client should get them."""
    return [
        (name, value)
        for name, value in upstream_headers.items()
        if name.lower() not in RESPONSE_DROP and not name.lower().startswith("x-switchyard-")
    ]


async def read_some(stream: aiohttp.StreamReader) -> tuple[bytes, BaseException | None]:
    """Next bytes of a body, and the error that ended it, if any.

    aiohttp's `readany()` raises a pending connection error before returning
    bytes it already received; output followed at once by a reset would then
    look like a reset before output and be replayed.  So on error, salvage
    what was buffered first.
    """
    try:
        return await stream.readany(), None
    except (aiohttp.ClientError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
        buffered = getattr(stream, "_buffer", None)
        if not buffered:
            return b"", exc
        offset = getattr(stream, "_buffer_offset", 0)
        chunks = [bytes(chunk) for chunk in buffered]
        buffered.clear()
        if chunks and offset:
            chunks[0] = chunks[0][offset:]
        return b"".join(chunks), exc


class Answer(Protocol):
    """An upstream's answer as the attempt loop reads it: status, headers, bytes.

    The seam where faults are injected (`faults.FaultyAnswer` wraps an
    `UpstreamAnswer`), so the loop never knows whether a failure was real.
    """

    status: int
    headers: Mapping[str, str]

    async def read_some(self) -> tuple[bytes, BaseException | None]: ...

    def close(self) -> None: ...


async def read_all(answer: Answer, limit: int) -> tuple[bytes, BaseException | None]:
    """A whole body, refused past `limit` bytes (ValueError): it is held in memory."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk, error = await answer.read_some()
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise ValueError(f"answer larger than {limit} bytes")
        if not chunk or error is not None:
            return b"".join(chunks), error


async def read_bounded(answer: Answer, limit: int, timeout_s: float | None) -> bytes:
    """As much of a body as arrives within `limit` bytes and `timeout_s`: for error
    bodies, which should follow their headers promptly and are only read to classify."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s or None):
            while size < limit:
                chunk, error = await answer.read_some()
                chunks.append(chunk)
                size += len(chunk)
                if not chunk or error is not None:
                    break
    except TimeoutError:
        pass
    return b"".join(chunks)[:limit]


class UpstreamAnswer:
    """A real upstream response (aiohttp) as an `Answer`."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status: int = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read_some(self) -> tuple[bytes, BaseException | None]:
        return await read_some(self._response.content)

    def close(self) -> None:
        self._response.close()


class UpstreamClient:
    """One aiohttp session for all upstream attempts of the relay."""

    def __init__(
        self,
        *,
        verify: bool = True,
        ca_file: str | None = None,
        ca_dir: str | None = None,
        proxy: str | None = None,
        proxy_auth: str | None = None,
    ) -> None:
        self._verify = verify
        self._ca_file = ca_file
        self._ca_dir = ca_dir
        self._proxy = proxy
        self._proxy_auth = aiohttp.BasicAuth(*proxy_auth.split(":", 1)) if proxy_auth and ":" in proxy_auth else None
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        """Verify upstreams as mitmproxy does: its trusted CA options, else certifi's bundle."""
        if not self._verify:
            return False
        if self._ca_file or self._ca_dir:
            return ssl.create_default_context(cafile=self._ca_file, capath=self._ca_dir)
        return ssl.create_default_context(cafile=certifi.where())

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=0, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                auto_decompress=True,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float) -> UpstreamAnswer:
        """Send the request; returns once response headers arrived."""
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None,
            sock_connect=connect_timeout_s or None,
            sock_read=None,
        )
        response = await self.session().request(
            request.method,
            request.url,
            headers=list(request.headers),
            data=request.body if request.body else None,
            timeout=timeout,
            allow_redirects=False,
            proxy=self._proxy,
            proxy_auth=self._proxy_auth,
        )
        return UpstreamAnswer(response)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def transport_failure(exc: BaseException) -> ErrorInfo:
    """A transport failure, described without anything from the request.

    Retryable in its own right (DESIGN §3), whatever the route's `retry_on` says."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        what = "name does not resolve"
    elif isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        what = "TLS handshake failed"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        what = "connection refused or unreachable"
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | ConnectionResetError):
        what = "connection reset"
    else:
        what = type(exc).__name__
    return ErrorInfo(status=502, message=what, event_type="transport", retryable_hint=True)
