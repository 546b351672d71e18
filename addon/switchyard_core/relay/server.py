"""The loopback relay: an HTTP server inside mitmproxy's own event loop.

mitmproxy's stream callbacks are synchronous, so they cannot await a second
upstream.  Matched flows are therefore re-aimed at this server, which runs the
attempt loop and answers with the winner's stream.  It listens on 127.0.0.1
only and serves only single-use tokens the addon issued: it is never an open
proxy.

Its only client is mitmproxy, so it is a small asyncio protocol rather than a
web framework: httptools parses the request, and each write of the answer is
one chunk on the transport, made in whatever callback produced the bytes
(issue 6: the relay's per-frame cost is what a user pays on every token).

The head goes to mitmproxy at once, provisional (`x-switchyard-provisional`),
while the attempt loop works: mitmproxy reads and hooks a response head in
about half a millisecond, and doing that while the upstream is still thinking
takes it off the first token's path.  The Router's `responseheaders` hook
waits for the real head (`Exchange.head`) and puts it in place before
mitmproxy sends anything to the client.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from http import HTTPStatus

import httptools

from .. import observe
from ..faults import FaultPlan
from ..rules import Route
from .attempts import AttemptLoop
from ..body import Body
from .direct_line import DirectLine
from .exchange import AnswerHead, Exchange, OriginalRequest
from .upstream_client import UpstreamClient

TOKEN_HEADER = "x-switchyard-token"
PROVISIONAL_HEADER = "x-switchyard-provisional"
_PROVISIONAL_HEAD = f"HTTP/1.1 200 OK\r\n{PROVISIONAL_HEADER}: 1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
# the relay's connection is going: mitmproxy answers the client with its own 502
_NO_RESPONSE = AnswerHead(502, (("Content-Type", "text/plain; charset=utf-8"),), streamed=False)
_TOKEN_HEADER = TOKEN_HEADER.encode()
# mitmproxy keeps its relay connection for the client connection's life and may be
# slow to send on it under load: idle ones go only after a while (aiohttp's default
# keep-alive is 75 s); a request that has begun must be complete sooner
IDLE_CLOSE_S = 60.0
REQUEST_READ_S = 30.0
RETIRE_MAX_S = 600.0  # a retired relay (the script was reloaded) stops by then whatever is in flight
UNUSED_TOKEN_GRACE_S = 5.0  # ... and waits this long for flows it issued tokens to just before


def _nowhere(data: bytes) -> None:
    """Where an answer's bytes go once the connection is gone."""


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _head(status: int, headers: list[tuple[str, str]], framing: str) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason_phrase(status)}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    lines.append(framing)
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


class RelayConnection(asyncio.Protocol):
    """One connection from mitmproxy.  Each request on it is one exchange; the
    connection is also the attempt loop's `ClientSink` for that exchange's answer."""

    def __init__(self, relay: "Relay") -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._token = ""
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None  # closes the connection if nothing completes in time
        self._reading = False  # a request has begun and not yet ended
        self._paused = False  # the transport's buffer is full: mitmproxy is not reading
        self._producer: Body | None = None
        self._sent = False
        self._chunked = False
        self._aborted = False
        self._bodiless = False
        self._head: asyncio.Future[AnswerHead] | None = None  # the real head, for the Router's hook
        self._line: DirectLine | None = None  # this exchange's answer goes to mitmproxy in-process
        self._send: Callable[[bytes], object] = _nowhere  # where the answer's bytes go: the socket or the line

    # --- asyncio's side ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send = self.transport.write
        self.relay.connections.add(self)
        self._idle_for(IDLE_CLOSE_S)

    def data_received(self, data: bytes) -> None:
        if self._idle is not None and not self._reading:
            # a request began: it must also end, or the connection goes (never
            # a slow trickle holding it open)
            self._idle.cancel()
            self._reading = True
            self._idle_for(REQUEST_READ_S)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # `Connection: upgrade` (an h2c offer, ...): the request is complete and is
            # served as an ordinary one; the upgrade is not taken (nor sent upstream)
            pass
        except httptools.HttpParserError:
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.connections.discard(self)
        self._send = _nowhere
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._task is not None and not self._task.done():
            self._task.cancel()  # mitmproxy gave up on the flow: the client left
        self._decide(_NO_RESPONSE)  # never leave the Router's hook waiting

    def pause_writing(self) -> None:
        self._paused = True
        if self._producer is not None and self._line is None:
            self._producer.hold(True)

    def resume_writing(self) -> None:
        self._paused = False
        if self._producer is not None and self._line is None:
            self._producer.hold(False)

    # --- httptools' callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._token = ""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == _TOKEN_HEADER:
            self._token = value.decode("ascii", "replace")

    def on_message_complete(self) -> None:
        # the body was recorded in the addon's request hook: it is not read again here
        if self._task is not None:  # mitmproxy does not pipeline; anything else is not mitmproxy
            self.abort()
            return
        self._reading = False
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._sent = self._chunked = self._aborted = False
        self._bodiless = self._parser.get_method() == b"HEAD"  # an answer to HEAD has a head only
        self._head = None
        task = asyncio.get_running_loop().create_task(self._serve(self._token))
        # mitmproxy's loop runs new tasks eagerly: a short answer (a 403) may be
        # served, and `_serve` finished, before create_task returns
        self._task = None if task.done() else task

    async def _serve(self, token: str) -> None:
        try:
            await self.relay.serve(token, self)
        finally:
            self._decide(_NO_RESPONSE)  # whatever happened, the Router's hook must not wait on
            self._task = None
            self._producer = None
            if self._line is not None:
                self._line.close()
                self._line = None
            if self.transport is not None and not self.transport.is_closing():
                self._send = self.transport.write
                self._idle_for(IDLE_CLOSE_S)
            else:
                self._send = _nowhere

    def _idle_for(self, seconds: float) -> None:
        assert self.transport is not None
        self._idle = asyncio.get_running_loop().call_later(seconds, self.transport.close)

    # --- the attempt loop's ClientSink -------------------------------------------------

    def go_direct(self, exchange: Exchange) -> bool:
        """Before the answer's first byte: hand it to mitmproxy in-process if it can be."""
        if exchange.mitmproxy_streams is None or self.transport is None:
            return False
        try:
            streams = exchange.mitmproxy_streams()
        except Exception:  # mitmproxy's internals moved (addons/relay_streams.py): the socket it is
            streams = None
        self._line = DirectLine.connect(streams, self.transport)
        if self._line is None:
            return False
        self._send = self._line.write
        return True

    def begin(self, exchange: Exchange) -> None:
        """Send mitmproxy the provisional head now; the real one follows in `exchange.head`."""
        self._head = exchange.head = asyncio.get_running_loop().create_future()
        self._chunked = True
        self._send(_PROVISIONAL_HEAD)

    def _decide(self, head: AnswerHead) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_result(head)

    @property
    def headers_sent(self) -> bool:
        return self._sent

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """A streamed answer, chunked.  (Delimiting it by closing the connection, or
        announcing `Connection: close`, measured ~3 ms slower to first byte.)"""
        self._sent = True
        if self._head is not None:
            self._decide(AnswerHead(status, tuple(headers), streamed=True))
            return
        self._chunked = True
        self._send(_head(status, headers, "Transfer-Encoding: chunked"))

    def write(self, data: bytes) -> None:
        if not data or self._aborted or self._bodiless:
            return
        # one write() (never writelines(): before CPython 3.12.9 it skips the
        # flow-control check, and a slow client would never pause the upstream)
        self._send(b"%x\r\n%b\r\n" % (len(data), data))

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._sent = True
        if self._head is not None:
            self._decide(AnswerHead(status, (*headers, ("Content-Length", str(len(body)))), streamed=False))
            self.write(body)
            return
        self._chunked = False
        self._send(_head(status, headers, f"Content-Length: {len(body)}") + (b"" if self._bodiless else body))

    def pace(self, producer: Body | None) -> None:
        """While mitmproxy is not reading, the upstream answer being forwarded must not be either."""
        self._producer = producer
        if self._line is not None:
            self._line.pace(producer)
        elif producer is not None and self._paused:
            producer.hold(True)

    def abort(self) -> None:
        """End the answer without a clean end: the client must see it was cut."""
        self._aborted = True
        self._decide(_NO_RESPONSE)
        if self._line is not None:
            self._line.cut()  # what it wrote is in mitmproxy's reader, ahead of the end
        if self.transport is not None:
            self.transport.abort()

    def end(self) -> None:
        if self._aborted or self.transport is None or self.transport.is_closing():
            self._decide(_NO_RESPONSE)
            return
        if not self._sent:
            self.send_whole(502, [("Content-Type", "text/plain; charset=utf-8")], b"switchyard: no response\n")
        if self._chunked and not self._bodiless:
            self._send(b"0\r\n\r\n")


class Relay:
    def __init__(self, http: UpstreamClient) -> None:
        self.http = http  # straight to upstreams
        self._via: dict[str, UpstreamClient] = {}  # through an upstream proxy, by the proxy's URL
        self._pending: dict[str, Exchange] = {}
        self._server: asyncio.Server | None = None
        self.connections: set[RelayConnection] = set()
        self.port: int | None = None
        self.in_flight = 0  # exchanges being served now (switchyard.status shows it)
        self.answers = 0  # exchanges served, and how many of them went to mitmproxy in-process
        self.direct_answers = 0
        self._retired: list[UpstreamClient] = []
        self._starting = asyncio.Lock()
        self._retiring = False
        self._stopped = False

    @property
    def pending(self) -> int:
        """Tokens issued and not yet used."""
        return len(self._pending)

    def replace_client(self, http: UpstreamClient) -> None:
        """New upstream settings; exchanges in flight keep the client they started with."""
        self._retired += [self.http, *self._via.values()]
        self.http = http
        self._via = {}

    def client_via(self, proxy: str | None) -> UpstreamClient:
        """The client for an exchange: straight, or through the upstream proxy its flow's mode names."""
        if proxy is None:
            return self.http
        client = self._via.get(proxy)
        if client is None:
            client = self._via[proxy] = self.http.via(proxy)
        return client

    def register(self, route: Route, request: OriginalRequest, faults: FaultPlan | None = None, *,
                 provisional_head: bool = False) -> Exchange:
        """An exchange the relay will serve once, for the holder of its token.

        `provisional_head`: answer mitmproxy at once with a provisional head (see
        above).  Only where a client that leaves closes its connection: while the
        Router's hook waits, mitmproxy queues the flow's events, and an HTTP/2
        stream reset would wait with them while the upstream went on."""
        exchange = Exchange(token=secrets.token_urlsafe(18), route=route, request=request, faults=faults,
                            provisional_head=provisional_head)
        self._pending[exchange.token] = exchange
        return exchange

    def forget(self, token: str) -> None:
        self._pending.pop(token, None)
        self._stop_if_retired_and_idle()

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def start(self) -> None:
        async with self._starting:  # the `running` hook's start and a first flow's may overlap
            if self._server is not None:
                return
            loop = asyncio.get_running_loop()
            # a burst of flows opens as many relay connections at once: asyncio's default
            # backlog of 100 would drop the rest's SYNs, and they would retry for seconds
            server = await loop.create_server(lambda: RelayConnection(self), "127.0.0.1", 0, backlog=4096)
            if self._stopped:  # stopped while it started (a reload): nobody will ever stop it again
                server.close()
                return
            self._server = server
            self.port = server.sockets[0].getsockname()[1]
            observe.emit(logging.DEBUG, "switchyard.relay_listening", port=self.port)

    def retire(self) -> None:
        """Stop once the exchanges in flight have ended.

        For a reload of the script (synchronous, like `done`): the clients streaming
        through this relay keep their answers, while the next Router's relay takes
        the new flows.  At most RETIRE_MAX_S, in case an exchange never ends."""
        self._retiring = True
        loop = asyncio.get_running_loop()
        loop.call_later(RETIRE_MAX_S, self.stop)
        # tokens issued just before the reload whose flows have not reached it yet
        loop.call_later(UNUSED_TOKEN_GRACE_S, self._drop_unused_tokens)
        self._stop_if_retired_and_idle()

    def _drop_unused_tokens(self) -> None:
        self._pending.clear()  # their flows were killed or answered elsewhere
        self._stop_if_retired_and_idle()

    def _stop_if_retired_and_idle(self) -> None:
        if self._retiring and not self._stopped and self.in_flight == 0 and not self._pending:
            self.stop(graceful=True)

    def stop(self, graceful: bool = False) -> None:
        """Close everything, at once (synchronous: mitmproxy calls `done` synchronously
        when it reloads the script).  `graceful`: nothing is in flight, and what was
        written is still sent before each connection closes."""
        self._stopped = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            if graceful and connection.transport is not None:
                connection.transport.close()
            else:
                connection.abort()
        self._server = None
        self.port = None
        for client in (*self._retired, self.http, *self._via.values()):
            client.close()
        self._retired.clear()
        self._via.clear()

    async def serve(self, token: str, sink: RelayConnection) -> None:
        exchange = self._pending.pop(token, None) if token else None
        if exchange is None:
            sink.send_whole(403, [("Content-Type", "text/plain; charset=utf-8")],
                            b"switchyard relay: unknown or used token\n")
            return
        if sink.go_direct(exchange):
            self.direct_answers += 1
        if exchange.provisional_head and exchange.request.method != "HEAD":
            sink.begin(exchange)
        loop = AttemptLoop(exchange, self.client_via(exchange.upstream_proxy), sink)
        self.answers += 1
        self.in_flight += 1
        try:
            await loop.run()
        except asyncio.CancelledError:
            exchange.outcome = "client_gone"
            observe.emit(logging.INFO, "switchyard.client_gone", route=exchange.route.name, attempts=len(exchange.attempts))
            raise
        except Exception as exc:  # a bug must cost one request, never the proxy
            observe.log.exception(observe.format_event("switchyard.internal_error", route=exchange.route.name))
            exchange.outcome = "internal_error"
            loop.fail_internally(type(exc).__name__)
        finally:
            self.in_flight -= 1
            loop.log.finished()  # once the outcome is known (a client that left, a bug)
            if self._retiring:
                asyncio.get_running_loop().call_soon(self._stop_if_retired_and_idle)  # after this answer's end
        sink.end()
