"""The relay's HTTP/1.1 client towards upstreams, on asyncio transports.

Why not aiohttp's client: its body reader wakes the reading task once per
read, and for a stream of small frames that wake-up cost more CPU than all the
rest of the relay's work (issue 6; an aiohttp relay forwarding raw bytes ran at
~1.35x plain mitmdump's CPU).  Here the connection's `data_received` feeds
httptools' parser (llhttp in C, the parser uvicorn uses) and the body goes to a
`Body`, which after commit hands each read to the gate synchronously.

What it does: HTTP/1.1 with keep-alive connections pooled per origin; TLS
verified as mitmproxy verifies it; an upstream proxy (mitmproxy's upstream
mode: absolute-form requests for http, CONNECT for https) with Basic proxy
credentials; gzip and deflate bodies decoded (the only codings it asks for).
It never follows redirects: the relay forwards answers as they are.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import zlib
from urllib.parse import SplitResult, urlsplit

import certifi
import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from ..body import Body
from .upstream import ConnectionBroke, ConnectTimeout, UpstreamRequest

IDLE_KEEP_S = 15.0  # a pooled connection unused this long is closed
CONNECT_REPLY_LIMIT = 64 * 1024
_Key = tuple[str, str, int]


class _Decoder:
    """A gzip or deflate body, decoded as it arrives.  HTTP's "deflate" is
    zlib-wrapped by the spec and raw in some servers: both are taken, told apart
    by the zlib header once two bytes are in.  `complete` says whether the
    compressed stream reached its end: a cut one must not look like a clean end."""

    __slots__ = ("_inner", "_head", "_fed")

    def __init__(self, coding: str) -> None:
        self._inner = zlib.decompressobj(16 + zlib.MAX_WBITS) if coding == "gzip" else None
        self._head = b""
        self._fed = False

    @classmethod
    def of(cls, content_encoding: str) -> "_Decoder | None":
        coding = content_encoding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            return cls("gzip")
        if coding == "deflate":
            return cls("deflate")
        return None

    def decompress(self, data: bytes) -> bytes:
        if data:
            self._fed = True
        if self._inner is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            cmf, flg = self._head[0], self._head[1]
            wrapped = cmf & 0x0F == 8 and (cmf * 256 + flg) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            data, self._head = self._head, b""
        return self._inner.decompress(data)

    def flush(self) -> bytes:
        return self._inner.flush() if self._inner is not None else b""

    @property
    def complete(self) -> bool:
        return not self._fed or (self._inner is not None and self._inner.eof)


class UpstreamAnswer:
    """A real upstream response as an `Answer`: status, headers, and its `Body`."""

    __slots__ = ("_connection", "status", "headers", "body")

    def __init__(self, connection: "_Connection", status: int, headers: CIMultiDictProxy[str]) -> None:
        self._connection = connection
        self.status = status
        self.headers = headers
        self.body = Body(producer=connection)

    def close(self) -> None:
        """Done with it: a connection still mid-answer is closed, never reused."""
        self._connection.abandon(self)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream (or through a proxy to one)."""

    def __init__(self, client: "UpstreamClient", key: _Key) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.received_any = False
        self.closed = False
        self._parser: httptools.HttpResponseParser | None = None
        self._head: asyncio.Future[UpstreamAnswer] | None = None
        self._tunnel: asyncio.Future[int] | None = None  # a CONNECT in progress
        self._tunnel_reply = b""
        self._method = ""
        self._headers: list[tuple[str, str]] = []
        self._answer: UpstreamAnswer | None = None
        self._decoder: _Decoder | None = None
        self._complete = False
        self._until_close = False  # a body with neither length nor chunks: it ends when the connection does
        self._idle_timer: asyncio.TimerHandle | None = None

    # --- asyncio's side ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        if self._tunnel is not None:
            self._tunnel_data(data)
            return
        parser = self._parser
        if parser is None:  # nothing asked: a server talking out of turn
            self.abort()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broke("upstream switched protocols")
        except httptools.HttpParserError:
            self._broke("malformed HTTP response")

    def eof_received(self) -> bool:
        self.closed = True
        self._peer_closed(clean=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.client.discard(self)
        self._peer_closed(clean=exc is None)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # --- httptools' callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        if self._complete or self._head is None:  # a second answer to one request
            self._broke("upstream sent more than one answer")
            return
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: interim, the real answer follows
            self._headers = []
            return
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        self._until_close = ("chunked" not in headers.get("transfer-encoding", "").lower()
                             and "content-length" not in headers and status not in (204, 304))
        self._decoder = _Decoder.of(headers.get("content-encoding", ""))
        answer = self._answer = UpstreamAnswer(self, status, headers)
        if not self._head.done():
            self._head.set_result(answer)
        if self._method == "HEAD":
            self._until_close = False
            self.on_message_complete()
            self._parser = None  # llhttp cannot know a HEAD answer has no body; stop reading it

    def on_body(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or self._complete:
            return
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error:
                self._broke("malformed compressed body")
                return
        answer.body.feed(data)

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is None:  # the end of a 1xx
            self._headers = []
            return
        if self._complete:
            return
        if self._decoder is not None:
            try:
                answer.body.feed(self._decoder.flush())
            except zlib.error:
                self._broke("malformed compressed body")
                return
            if not self._decoder.complete:
                self._broke("malformed compressed body")
                return
        self._complete = True
        reusable = (self._parser is not None and self._parser.should_keep_alive() and not self._until_close
                    and self._method != "HEAD")
        answer.body.end()
        if reusable:
            self.client.release(self)
        else:
            self.close()

    # --- the client's side -----------------------------------------------------------

    def send(self, head: bytes, body: bytes, method: str) -> asyncio.Future[UpstreamAnswer]:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._method = method
        self._headers = []
        self._answer = None
        self._complete = False
        self._until_close = False
        self._decoder = None
        self.received_any = False
        self._head = asyncio.get_running_loop().create_future()
        if self.transport.is_reading() is False:
            self.transport.resume_reading()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return self._head

    async def tunnel(self, authority: str, proxy_auth: str | None) -> None:
        """CONNECT through the upstream proxy; TLS to the upstream starts after it."""
        assert self.transport is not None
        self._tunnel = asyncio.get_running_loop().create_future()
        auth = f"Proxy-Authorization: {proxy_auth}\r\n" if proxy_auth else ""
        self.transport.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n".encode())
        try:
            status = await self._tunnel
        finally:
            self._tunnel = None
        if status != 200:
            raise ConnectionRefusedError(f"upstream proxy refused CONNECT (status {status})")

    def _tunnel_data(self, data: bytes) -> None:
        assert self._tunnel is not None
        self._tunnel_reply += data
        head, sep, rest = self._tunnel_reply.partition(b"\r\n\r\n")
        if not sep:
            if len(self._tunnel_reply) > CONNECT_REPLY_LIMIT:
                self._tunnel.set_exception(ConnectionBroke("malformed reply from the upstream proxy"))
            return
        if rest:  # the upstream's TLS cannot start before we speak: this is not a proxy
            self._tunnel.set_exception(ConnectionBroke("malformed reply from the upstream proxy"))
            return
        parts = head.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            self._tunnel.set_exception(ConnectionBroke("malformed reply from the upstream proxy"))
            return
        if not self._tunnel.done():
            self._tunnel.set_result(int(parts[1]))

    def abandon(self, answer: UpstreamAnswer) -> None:
        if self._answer is answer and not self._complete:
            self._answer = None
            self.abort()

    def idle(self, timer: asyncio.TimerHandle) -> None:
        self._parser = None
        self._idle_timer = timer

    def reuse(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.reused = True

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- inside ----------------------------------------------------------------------

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _broke(self, what: str) -> None:
        error = ConnectionBroke(what)
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        elif self._answer is not None and not self._complete:
            self._complete = True
            self._answer.body.end(error)
        self.abort()

    def _peer_closed(self, *, clean: bool) -> None:
        """The connection ended: a FIN (`clean`) or a reset.  Only a clean close
        ends a body that has neither a length nor chunks."""
        if self._tunnel is not None and not self._tunnel.done():
            self._tunnel.set_exception(ConnectionBroke("the upstream proxy closed the connection"))
        if self._head is not None and not self._head.done():
            self._head.set_exception(ConnectionBroke("connection reset"))
            return
        answer = self._answer
        if answer is None or self._complete:
            return
        self._complete = True
        decoder = self._decoder
        if not (self._until_close and clean):
            answer.body.end(ConnectionBroke("connection reset"))
            return
        try:
            tail = decoder.flush() if decoder is not None else b""
        except zlib.error:
            answer.body.end(ConnectionBroke("malformed compressed body"))
            return
        answer.body.feed(tail)
        if decoder is not None and not decoder.complete:
            answer.body.end(ConnectionBroke("connection reset"))  # the compressed stream was cut
            return
        answer.body.end()


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
    ) -> None:
        self._verify = verify
        self._ca_file = ca_file
        self._ca_dir = ca_dir
        self._proxy: SplitResult | None = urlsplit(proxy) if proxy else None
        self._proxy_auth = ("Basic " + base64.b64encode(proxy_auth.encode()).decode()
                            if proxy_auth and ":" in proxy_auth else None)
        self._tls_context: ssl.SSLContext | None = None
        self._idle: dict[_Key, list[_Connection]] = {}
        self._closed = False

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

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float) -> UpstreamAnswer:
        """Send the request; returns once the response headers arrived."""
        url = urlsplit(request.url)
        scheme = url.scheme.lower()
        host = url.hostname or ""
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, host, port)
        authority = url.netloc.rpartition("@")[2]
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = list(request.headers)
        if self._proxy is not None and scheme == "http":
            target = f"http://{authority}{target}"  # absolute-form, for the proxy
            if self._proxy_auth:
                headers.append(("Proxy-Authorization", self._proxy_auth))
        head = _request_head(request.method, target, authority, headers, len(request.body))
        while True:
            connection = self._pooled(key)
            if connection is None:
                connection = await self._connect(scheme, host, port, authority, connect_timeout_s)
            try:
                return await connection.send(head, request.body, request.method)
            except ConnectionBroke:
                if connection.reused and not connection.received_any:
                    continue  # a pooled connection the upstream had just closed: it never saw the request
                raise
            except BaseException:
                connection.abort()
                raise

    async def _connect(self, scheme: str, host: str, port: int, authority: str, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        key = (scheme, host, port)
        connection: _Connection | None = None

        def made() -> _Connection:
            nonlocal connection
            connection = _Connection(self, key)
            return connection

        tls = self._tls() if scheme == "https" else None
        try:
            async with asyncio.timeout(timeout_s or None):
                if self._proxy is None:
                    await loop.create_connection(made, host, port, ssl=tls, server_hostname=host if tls else None)
                else:
                    proxy_tls = self._tls() if self._proxy.scheme == "https" else None
                    await loop.create_connection(made, self._proxy.hostname, self._proxy.port or 8080, ssl=proxy_tls,
                                                 server_hostname=self._proxy.hostname if proxy_tls else None)
                    assert connection is not None
                    if tls is not None:
                        await connection.tunnel(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                                                self._proxy_auth)
                        assert connection.transport is not None
                        transport = await loop.start_tls(connection.transport, connection, tls, server_hostname=host)
                        connection.transport = transport  # type: ignore[assignment]
        except TimeoutError:
            if connection is not None:
                connection.close()
            raise ConnectTimeout(f"no connection within {timeout_s:g}s") from None
        except BaseException:
            if connection is not None:
                connection.close()
            raise
        assert connection is not None
        return connection

    def _pooled(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                connection.reuse()
                return connection
        return None

    def release(self, connection: _Connection) -> None:
        """An answer was read to its end on a keep-alive connection: keep it for the next."""
        if self._closed or connection.transport is None or connection.transport.is_closing():
            connection.close()
            return
        if connection.transport.is_reading() is False:
            connection.transport.resume_reading()  # paused for a slow client: idle, it must see a close
        connection.idle(asyncio.get_running_loop().call_later(IDLE_KEEP_S, connection.close))
        self._idle.setdefault(connection.key, []).append(connection)

    def discard(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    @property
    def idle_connections(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in list(idle):
                connection.close()
        self._idle.clear()


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

