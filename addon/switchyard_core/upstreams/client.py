"""The relay's HTTP/1.1 client towards upstreams: connections opened, pooled per
origin and reused.

TLS is verified as mitmproxy verifies it (its trusted-CA options, else
certifi); an upstream proxy (mitmproxy's upstream mode) gets absolute-form
requests for http, with mitmproxy's `upstream_auth` as Basic credentials, and a
CONNECT for https, built as mitmproxy builds its own and passed through
mitmproxy's `http_connect_upstream` hook (where its UpstreamAuth addon, or any
other, sets the credentials).  It never follows redirects: the relay forwards
answers as they are.  It never reads proxy settings from the environment: the
user's HTTPS_PROXY usually points at mitmproxy itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import cast
from urllib.parse import SplitResult, urlsplit

import certifi
from mitmproxy import connection, http
from mitmproxy.addons.upstream_auth import parse_upstream_auth
from mitmproxy.net.http import http1
from mitmproxy.proxy.mode_specs import ProxyMode

from .. import observe
from .answer_head import answer_headers, shown_names
from .connection import Key, UpstreamAnswer, UpstreamConnection
from .messages import URL_CACHE, ConnectionBroke, ConnectTimeout, UpstreamRequest, origin_of, unresolvable
from .pool import ConnectionPool

ConnectHook = Callable[[http.HTTPFlow], Awaitable[None]]
"""Runs mitmproxy's `http_connect_upstream` hook on a CONNECT about to be sent."""


class UpstreamClient:
    """All upstream attempts of the relay: connections, pooled per origin."""

    def __init__(
        self,
        *,
        verify: bool = True,
        ca_file: str | None = None,
        ca_dir: str | None = None,
        proxy: str | None = None,
        proxy_auth: str | None = None,
        connect_hook: ConnectHook | None = None,
        connect_host_header: bool = True,
    ) -> None:
        """`proxy_auth`: `user:password`, as mitmproxy's `upstream_auth` (a malformed one
        raises mitmproxy's OptionsError).  `connect_hook`: mitmproxy's hook for a
        CONNECT; without one, a CONNECT carries `proxy_auth` itself."""
        self._verify = verify
        self._ca_file = ca_file
        self._ca_dir = ca_dir
        self._proxy: SplitResult | None = urlsplit(proxy) if proxy else None
        self._proxy_url = proxy
        self._proxy_credentials = proxy_auth
        self._proxy_auth = parse_upstream_auth(proxy_auth).decode() if proxy_auth else None
        self._connect_hook = connect_hook
        self._connect_host_header = connect_host_header
        self._tls_context: ssl.SSLContext | None = None
        self._pool = ConnectionPool()

    def via(self, proxy: str) -> "UpstreamClient":
        """A client with the same settings that goes through `proxy` (an upstream-mode proxy)."""
        return UpstreamClient(verify=self._verify, ca_file=self._ca_file, ca_dir=self._ca_dir, proxy=proxy,
                              proxy_auth=self._proxy_credentials, connect_hook=self._connect_hook,
                              connect_host_header=self._connect_host_header)

    def _tls(self) -> ssl.SSLContext:
        """Verify upstreams as mitmproxy does: its trusted CA options, else certifi's bundle."""
        if self._tls_context is None:
            if not self._verify:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            elif self._ca_file or self._ca_dir:
                context = ssl.create_default_context(cafile=self._ca_file, capath=self._ca_dir)
            else:
                context = ssl.create_default_context(cafile=certifi.where())
            context.set_alpn_protocols(["http/1.1"])
            self._tls_context = context
        return self._tls_context

    def tls_context(self) -> ssl.SSLContext:
        """The TLS settings upstream connections use (a WebSocket's too)."""
        return self._tls()

    @property
    def proxied(self) -> bool:
        """Whether this client goes through an upstream proxy."""
        return self._proxy is not None

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float | None,
                   sent: Callable[[bool], None] | None = None,
                   headed: Callable[[UpstreamAnswer], None] | None = None) -> UpstreamAnswer:
        """Send the request; returns once the response headers arrived.

        `sent(True)` is called once the request is on a connection, `sent(False)` when
        a stale pooled connection sends it to a new one: a failure after that point is
        not a connect failure, and the log says which it was.  `headed(answer)` is
        called from the read that completes the head, a loop pass before this returns
        the same answer: under a burst that pass is every other flow's work
        (docs/architecture.md, "Speed")."""
        scheme, host, port, authority, target = _aimed(request.url)
        # the socket goes to the address where one is known, TLS asks for the name (and the
        # pool keeps both: an address may serve several names)
        key = (scheme, request.address or host, port, host)
        headers = list(request.headers)
        if self._proxy is not None and scheme == "http":
            target = f"http://{authority}{target}"  # absolute-form, for the proxy
            if self._proxy_auth:
                headers.append(("Proxy-Authorization", self._proxy_auth))
        head = _request_head(request.method, target, authority, headers, len(request.body))
        while True:
            connection = self._pool.take(key)
            if connection is None:
                connection = await self._connect(key, connect_timeout_s)
            told: list[UpstreamAnswer] = []

            def on_head(read: UpstreamAnswer) -> None:
                told.append(_as_kept(read, request))
                if headed is not None:
                    headed(read)

            try:
                answer = connection.send(head, request.body, request.method, on_head if headed is not None else None)
                if sent is not None:
                    sent(True)
                read = await answer
                return read if told else _as_kept(read, request)
            except ConnectionBroke:
                if connection.reused and not connection.received_any:
                    if sent is not None:
                        sent(False)
                    continue  # a pooled connection the upstream had just closed: it never saw the request
                raise
            except BaseException:
                if not told:
                    connection.abort()  # (a head told is the caller's answer: `UpstreamAnswer.close` ends it)
                raise

    async def _connect(self, key: Key, timeout_s: float | None) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        scheme, host, port, name = key  # host: where to connect; name: what TLS asks for
        connection: UpstreamConnection | None = None

        def made() -> UpstreamConnection:
            nonlocal connection
            connection = UpstreamConnection(self._pool, key)
            return connection

        tls = self._tls() if scheme == "https" else None
        try:
            async with asyncio.timeout(timeout_s or None):
                if self._proxy is None:
                    await loop.create_connection(made, host, port, ssl=tls, server_hostname=name if tls else None)
                else:
                    proxy_tls = self._tls() if self._proxy.scheme == "https" else None
                    await loop.create_connection(made, self._proxy.hostname or "", self._proxy.port or 8080, ssl=proxy_tls,
                                                 server_hostname=self._proxy.hostname if proxy_tls else None)
                    assert connection is not None
                    if tls is not None:
                        await connection.tunnel(await self._connect_request(host, port))
                        assert connection.transport is not None
                        transport = await loop.start_tls(connection.transport, connection, tls, server_hostname=name)
                        connection.transport = cast(asyncio.Transport, transport)
        except TimeoutError:
            if connection is not None:
                connection.close()
            raise ConnectTimeout(f"no connection within {timeout_s or 0:g}s") from None
        except UnicodeError as exc:
            if connection is not None:
                connection.close()
            raise unresolvable(exc) from None
        except BaseException:
            if connection is not None:
                connection.close()
            raise
        assert connection is not None
        return connection

    async def _connect_request(self, host: str, port: int) -> bytes:
        """The CONNECT for `host:port`, as mitmproxy would send it, after its hook."""
        assert self._proxy is not None and self._proxy_url is not None
        try:
            bracketed = isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
        except ValueError:
            bracketed = False
        authority = (f"[{host}]".encode() if bracketed else host.encode("idna")) + f":{port}".encode()
        headers = http.Headers()
        if self._connect_host_header:
            headers.insert(0, b"Host", authority)
        now = time.time()
        request = http.Request(host, port, b"CONNECT", b"", authority, b"", b"HTTP/1.1", headers, b"", None, now, now)
        if self._connect_hook is None:
            if self._proxy_auth:
                request.headers["Proxy-Authorization"] = self._proxy_auth
            return http1.assemble_request(request)
        proxy_address = (self._proxy.hostname or "", self._proxy.port or 8080)
        flow = http.HTTPFlow(
            connection.Client(peername=("127.0.0.1", 0), sockname=("127.0.0.1", 0),
                              proxy_mode=ProxyMode.parse(f"upstream:{self._proxy_url}")),
            connection.Server(address=(host, port), via=("http", proxy_address)),
        )
        flow.request = request
        await self._connect_hook(flow)
        return http1.assemble_request(flow.request)

    @property
    def idle_connections(self) -> int:
        return len(self._pool)

    def close(self) -> None:
        self._pool.close()


def _as_kept(answer: UpstreamAnswer, request: UpstreamRequest) -> UpstreamAnswer:
    """The answer with its head as Switchyard may use it (`answer_head`); a cookie
    withheld is said once."""
    answer.headers, withheld = answer_headers(answer.headers, secrets=request.secrets,
                                              other_origin=request.other_origin)
    if withheld:
        observe.emit(logging.INFO, "switchyard.cookie_not_forwarded", origin=origin_of(request.url),
                     cookies=shown_names(withheld), why="set by another origin than the client's destination")
    return answer


@lru_cache(maxsize=URL_CACHE)
def _aimed(url: str) -> tuple[str, str, int, str, str]:
    """Where a request for `url` goes: scheme, host, port, authority and request target."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname or "", port, parts.netloc.rpartition("@")[2], target


def _request_head(method: str, target: str, authority: str, headers: list[tuple[str, str]], length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} holds a line break or colon; not sent")
        lines.append(f"{name}: {value}")
    if length or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {length}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")

