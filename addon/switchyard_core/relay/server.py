"""The loopback relay: an HTTP server inside mitmproxy's own event loop.

mitmproxy's stream callbacks are synchronous, so they cannot await a second
upstream.  Matched flows are therefore re-aimed at this server, which runs the
attempt loop and answers with the winner's stream.  It listens on 127.0.0.1
only and serves only single-use tokens the addon issued: it is never an open
proxy.

Each connection from mitmproxy is a `RelayConnection`, each request on it
answered by a `RelayAnswer` (connection.py).

An HTTP exchange's attempts start when it is routed (`register`), from the
same driver that sends every later attempt; its answer is attached when
mitmproxy's connection with the token arrives (`serve`).  The head goes to
mitmproxy at once, provisional (`x-switchyard-provisional`), while the attempt
core works: mitmproxy's own work on a response head (reading it, its hooks)
then happens while the upstream is still thinking, off the first token's path.
The Router's `responseheaders` hook waits for the real head (`Ticket.head`)
and puts it in place before mitmproxy sends anything to the client.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter
from typing import Any

from .. import observe
from ..attempts import Driver, ExchangeMachine, HeldSink
from ..attempts.outages import Outages
from ..exchange import AttemptListener, Exchange, OriginalRequest
from ..faults import FaultPlan
from ..rules import Route
from ..upstreams.client import UpstreamClient
from .connection import RelayAnswer, RelayConnection
from .ticket import MitmproxyStreams, Ticket
from .websocket_session import WebSocketSession

RETIRE_MAX_S = 600.0  # a retired relay (the script was reloaded) stops by then whatever is in flight
UNUSED_TOKEN_GRACE_S = 5.0  # ... and waits this long for flows it issued tokens to just before


class Relay:
    def __init__(self, http: UpstreamClient) -> None:
        self.http = http  # straight to upstreams
        self._via: dict[str, UpstreamClient] = {}  # through an upstream proxy, by the proxy's URL
        self._pending: dict[str, Ticket] = {}
        self._server: asyncio.Server | None = None
        self.connections: set[RelayConnection] = set()
        self.port: int | None = None
        self.in_flight = 0  # exchanges being served now (switchyard.status shows it)
        self.answers = 0  # exchanges served, and how many of them went to mitmproxy in-process
        self.direct_answers = 0
        self.client_answers = 0  # ... and whose body went from there straight to the client
        self.websocket: Counter[str] = Counter()  # WebSocket connections, turns, retries, fallbacks
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
                 outages: Outages | None = None, provisional_head: bool = False, websocket: bool = False, upstream_proxy: str | None = None,
                 mitmproxy_streams: MitmproxyStreams | None = None, story: dict[str, Any] | None = None,
                 listener: AttemptListener | None = None) -> Ticket:
        """An exchange the relay will serve once, for the holder of its token.  An HTTP
        exchange's first attempt is sent now, from its driver: the upstream starts on it
        while mitmproxy passes the flow to the relay (under a burst, after every other
        flow's hooks of that loop pass).  The Router's hook is the last in mitmproxy's
        chain, so nothing can still answer the flow instead; one that is killed or
        whose client leaves before it reaches the relay is stopped (`forget`).

        `provisional_head`: answer mitmproxy at once with a provisional head (see
        above).  Only where a client that leaves closes its connection: while the
        Router's hook waits, mitmproxy queues the flow's events, and an HTTP/2
        stream reset would wait with them while the upstream went on.

        `listener`: told each attempt's end, where the flow is shown live (exchange.py)."""
        ticket = Ticket(secrets.token_urlsafe(18), Exchange(route, request, listener=listener), faults, outages,
                        upstream_proxy, websocket, provisional_head, mitmproxy_streams, story)
        self._pending[ticket.token] = ticket
        if not websocket:
            machine = ExchangeMachine(ticket.exchange, HeldSink(), faults=faults, outages=outages)
            ticket.driver = Driver(machine, self.client_via(upstream_proxy))
            ticket.driver.start()
        return ticket

    def forget(self, token: str) -> None:
        ticket = self._pending.pop(token, None)
        if ticket is not None and ticket.driver is not None:
            ticket.driver.cancel()
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
        for ticket in self._pending.values():  # their flows were killed or answered elsewhere
            if ticket.driver is not None:
                ticket.driver.cancel()
        self._pending.clear()
        self._stop_if_retired_and_idle()

    def _stop_if_retired_and_idle(self) -> None:
        if self._retiring and not self._stopped and self.in_flight == 0 and not self._pending:
            self.stop(graceful=True)

    def stop(self, graceful: bool = False) -> None:
        """Close everything, at once (synchronous: mitmproxy calls `done` synchronously
        when it reloads the script).  `graceful`: nothing is in flight, and what was
        written is still sent before each connection closes."""
        self._stopped = True
        for ticket in self._pending.values():
            if ticket.driver is not None:
                ticket.driver.cancel()
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

    async def serve(self, token: str, sink: RelayAnswer) -> None:
        ticket = self._pending.pop(token, None) if token else None
        if ticket is None:
            sink.send_whole(403, [("Content-Type", "text/plain; charset=utf-8")],
                            b"switchyard relay: unknown or used token\n")
            return
        self.in_flight += 1  # a reload lets it go on
        try:
            if ticket.websocket:
                session = WebSocketSession(ticket, sink.connection, self.client_via(ticket.upstream_proxy),
                                           self.websocket)
                await session.run()
                return  # the connection was the session's: nothing more goes on it
            await self._answer(ticket, sink)
        finally:
            self.in_flight -= 1
            if self._retiring:
                asyncio.get_running_loop().call_soon(self._stop_if_retired_and_idle)  # after this answer's end

    async def _answer(self, ticket: Ticket, sink: RelayAnswer) -> None:
        driver = ticket.driver
        assert driver is not None
        self.answers += 1
        try:
            try:
                if sink.go_direct(ticket):
                    self.direct_answers += 1
                if ticket.provisional_head and ticket.exchange.request.method != "HEAD":
                    sink.begin(ticket)
            finally:
                driver.attach(sink)
        except Exception as exc:  # a bug must cost one request, never the proxy
            observe.log.exception(observe.format_event("switchyard.internal_error", route=ticket.exchange.route.name))
            driver.crashed(type(exc).__name__)
        try:
            await driver.run()
        finally:
            driver.machine.log.finished()  # once the outcome is known (a client that left, a bug)
        sink.end()
