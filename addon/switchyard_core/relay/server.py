"""The loopback relay: an HTTP server inside mitmproxy's own event loop.

mitmproxy's stream callbacks are synchronous, so they cannot await a second
upstream.  Matched flows are therefore re-aimed at this server, which runs the
attempt loop and answers with the winner's stream.  It listens on 127.0.0.1
only and serves only single-use tokens the addon issued: it is never an open
proxy.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from aiohttp import web

from .. import observe
from .attempts import AttemptLoop
from ..faults import FaultPlan
from ..rules import Route
from .exchange import Exchange, OriginalRequest
from .upstream import UpstreamClient

TOKEN_HEADER = "x-switchyard-token"


class WebSink:
    """The relay's HTTP response to mitmproxy, as the attempt loop's `ClientSink`."""

    __slots__ = ("_request", "_response", "_aborted")

    def __init__(self, request: web.BaseRequest) -> None:
        self._request = request
        self._response: web.StreamResponse | None = None
        self._aborted = False

    @property
    def headers_sent(self) -> bool:
        return self._response is not None

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """A streamed answer, chunked.  (Delimiting it by closing the connection, or
        announcing `Connection: close`, measured ~3 ms slower to first byte.)"""
        response = web.StreamResponse(status=status)
        for name, value in headers:
            response.headers.add(name, value)
        response.enable_chunked_encoding()
        await response.prepare(self._request)
        self._response = response

    async def write(self, data: bytes) -> None:
        assert self._response is not None, "start() first"
        await self._response.write(data)

    async def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        response = web.Response(status=status, body=body)
        response.force_close()  # relay connections are single-use: a fresh one per flow
        for name, value in headers:
            if name.lower() != "content-type":
                response.headers.add(name, value)
            else:
                response.headers[name] = value
        await response.prepare(self._request)
        await response.write_eof()
        self._response = response

    def abort(self) -> None:
        """End the answer without a clean end: the client must see it was cut."""
        self._aborted = True
        if self._request.transport is not None:
            self._request.transport.abort()

    async def end(self) -> web.StreamResponse:
        if self._aborted and self._response is not None:
            return self._response
        if self._response is None:
            self._response = web.Response(status=502, text="switchyard: no response")
            await self._response.prepare(self._request)
        await self._response.write_eof()
        return self._response


class Relay:
    def __init__(self, http: UpstreamClient) -> None:
        self.http = http
        self._pending: dict[str, Exchange] = {}
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self.port: int | None = None
        self.in_flight = 0  # exchanges being served now (switchyard.status shows it)
        self._retired: list[UpstreamClient] = []

    @property
    def pending(self) -> int:
        """Tokens issued and not yet used."""
        return len(self._pending)

    def replace_client(self, http: UpstreamClient) -> None:
        """New upstream settings; exchanges in flight keep the client they started with."""
        self._retired.append(self.http)
        self.http = http

    def register(self, route: Route, request: OriginalRequest, faults: FaultPlan | None = None) -> Exchange:
        """An exchange the relay will serve once, for the holder of its token."""
        exchange = Exchange(token=secrets.token_urlsafe(18), route=route, request=request, faults=faults)
        self._pending[exchange.token] = exchange
        return exchange

    def forget(self, token: str) -> None:
        self._pending.pop(token, None)

    async def start(self) -> None:
        if self._runner is not None:
            return
        # mitmproxy opens a fresh relay connection per flow; idle ones go after 5 s
        server = web.Server(self._handle, handler_cancellation=True, access_log=None, keepalive_timeout=5)
        self._runner = web.ServerRunner(server, handle_signals=False, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await self._site.start()
        sockets = self._site._server.sockets if self._site._server else []  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]
        observe.emit(logging.DEBUG, "switchyard.relay_listening", port=self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self._site = None
        self.port = None
        for client in (*self._retired, self.http):
            await client.close()
        self._retired.clear()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        token = request.headers.get(TOKEN_HEADER, "")
        exchange = self._pending.pop(token, None) if token else None
        if exchange is None:
            return web.Response(status=403, text="switchyard relay: unknown or used token\n")
        # the body was recorded in the request hook; drain it without aiohttp's
        # 1 MiB client_max_size (long contexts and images are larger)
        while await request.content.readany():
            pass
        sink = WebSink(request)
        loop = AttemptLoop(exchange, self.http, sink)
        self.in_flight += 1
        try:
            await loop.run()
        except asyncio.CancelledError:
            exchange.outcome = "client_gone"
            observe.emit(logging.INFO, "switchyard.client_gone", route=exchange.route.name, attempts=len(exchange.attempts))
            raise
        except Exception as exc:  # a bug must cost one request, never the proxy
            logging.getLogger("switchyard").exception("switchyard.internal_error route=%s", exchange.route.name)
            exchange.outcome = "internal_error"
            await loop.fail_internally(type(exc).__name__)
        finally:
            self.in_flight -= 1
        return await sink.end()
