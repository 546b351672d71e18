"""One HTTP/1.1 connection to an upstream, on an asyncio transport.

Why not aiohttp's client: its body reader wakes the reading task once per
read, and for a stream of small frames that wake-up cost more CPU than all the
rest of the relay's work (see docs/architecture.md, "Speed").  Here
`data_received` feeds httptools' parser (llhttp in C, the parser uvicorn uses)
and the body goes to a `Body`, which once the attempt has committed hands each
read to the gate synchronously.

The connection (`UpstreamConnection`, with a `State`) lives across requests; each
request's answer is read by its own `ResponseReader`, made when the request is sent.
One request at a time, answers read to their end before the connection is
reused; 1xx answers skipped; the content codings of `content_coding.py`
decoded; how a body is framed and whether the connection lives on decided as
mitmproxy decides them; a body that ends by a reset, or whose compressed stream
is cut, never ends cleanly.  `client.py` opens these, `pool.py` keeps them.
"""

from __future__ import annotations

import asyncio
import enum
import re
from collections.abc import Callable
from typing import Protocol, cast

import httptools
from mitmproxy import http
from mitmproxy.net.http import http1, validate
from multidict import CIMultiDict, CIMultiDictProxy

from .messages import ConnectionBroke
from .response import HEAD_LIMIT, HEADER_COUNT_LIMIT, Phase, ResponseReader, UpstreamAnswer

CONNECT_REPLY_LIMIT = 64 * 1024
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # where a reply's head ends, as mitmproxy finds it
_LINE_END = re.compile(rb"\r?\n")
Key = tuple[str, str, int, str]  # scheme, host, port, TLS name: what a pooled connection can be reused for


class State(enum.Enum):
    """A connection's life, as httpcore names it."""

    NEW = "new"  # being opened: TCP, TLS, an upstream proxy's CONNECT
    ACTIVE = "active"  # a request sent, its answer being read
    IDLE = "idle"  # between requests, in the pool
    CLOSED = "closed"


class Pool(Protocol):
    """Where a connection goes once its answer was read to the end, and leaves when it closes."""

    def release(self, connection: UpstreamConnection) -> None: ...

    def discard(self, connection: UpstreamConnection) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream (or through a proxy to one), across requests."""

    def __init__(self, pool: Pool, key: Key) -> None:
        self.pool = pool
        self.key = key
        self.state = State.NEW
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.received_any = False  # since the current request was sent
        self._response: ResponseReader | None = None  # the current request's answer, while one is read
        self._tunnel: asyncio.Future[int] | None = None  # a CONNECT in progress
        self._tunnel_reply = b""
        self._idle_timer: asyncio.TimerHandle | None = None

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    # --- asyncio's side ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's transports are

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        if self._tunnel is not None:
            self._tunnel_data(data)
            return
        response = self._response
        parser = response.parser if response is not None else None
        if response is None or parser is None:  # nothing asked: a server talking out of turn
            self.abort()
            return
        response.unframed += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            response.broke("upstream switched protocols")
        except httptools.HttpParserError:
            response.broke(response.problem or "malformed HTTP response")
        else:
            too_much = response.overflow()
            if too_much is not None:
                response.broke(too_much)
            else:
                response.deliver()
        if response.on_head is not None:
            # last: what it sets off may stop this connection or, once it is pooled again, send on it
            response.announce()

    def eof_received(self) -> bool:
        self.state = State.CLOSED
        self._peer_closed(clean=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = State.CLOSED
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.pool.discard(self)
        self._peer_closed(clean=exc is None)
        if self._response is None or self._response.phase is not Phase.ENDING:
            self._let_go()  # (ENDING: its decoded rest still goes out, on `resume_reading`; `answered` lets go)

    def pause_reading(self) -> None:
        """The body's reader (or the client) is behind."""
        if self._response is not None:
            self._response.held = True
        self.transport_reading(False)

    def resume_reading(self) -> None:
        response = self._response
        if response is not None:
            response.held = False
            if response.backlog:
                response.schedule_drain()  # decoded bytes first; reading resumes once they are out
                return
        self.transport_reading(True)

    def transport_reading(self, reading: bool) -> None:
        if self.transport is not None and not self.closed:
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    # --- the client's side -----------------------------------------------------------

    def send(self, head: bytes, body: bytes, method: str,
             on_head: Callable[[UpstreamAnswer], None] | None = None) -> asyncio.Future[UpstreamAnswer]:
        """The answer's head comes to the future, and to `on_head` from the read that completed it."""
        assert self.transport is not None
        self.state = State.ACTIVE
        response = self._response = ResponseReader(self, method, on_head)
        self.received_any = False
        if self.transport.is_reading() is False:
            self.transport.resume_reading()
        self.transport.write(head + body)
        return response.head

    async def tunnel(self, connect: bytes) -> None:
        """Send `connect` (a CONNECT) to the upstream proxy; TLS to the upstream starts
        after a 2xx, which is read as mitmproxy reads its own."""
        assert self.transport is not None
        self._tunnel = asyncio.get_running_loop().create_future()
        self.transport.write(connect)
        try:
            status = await self._tunnel
        finally:
            self._tunnel = None
        if not 200 <= status < 300:
            raise ConnectionRefusedError(f"upstream proxy refused CONNECT (status {status})")

    def _tunnel_data(self, data: bytes) -> None:
        assert self._tunnel is not None
        if self._tunnel.done():
            return  # already decided (a bad reply): the rest is not read
        self._tunnel_reply += data
        end = _HEAD_END.search(self._tunnel_reply)
        if end is None:
            if len(self._tunnel_reply) > CONNECT_REPLY_LIMIT:
                self._tunnel.set_exception(ConnectionBroke("malformed reply from the upstream proxy"))
            return
        if end.end() < len(self._tunnel_reply):  # the upstream's TLS cannot start before we speak: no proxy
            self._tunnel.set_exception(ConnectionBroke("malformed reply from the upstream proxy"))
            return
        try:
            reply = http1.read_response_head(_LINE_END.split(self._tunnel_reply[:end.start()]))
        except ValueError:
            self._tunnel.set_exception(ConnectionBroke("malformed reply from the upstream proxy"))
            return
        self._tunnel.set_result(reply.status_code)

    def abandon(self, answer: UpstreamAnswer) -> None:
        response = self._response
        if response is not None and response.answer is answer and not response.phase is Phase.DONE:
            response.answer = None
            response.backlog = False
            self.abort()

    def answered(self, reusable: bool) -> None:
        """The current answer was read to its end."""
        if reusable:
            self.pool.release(self)  # idle: lets go of the reader
        else:
            self.close()
            self._let_go()

    def idle(self, timer: asyncio.TimerHandle) -> None:
        self.state = State.IDLE
        self._let_go()
        self._idle_timer = timer

    def reuse(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.reused = True

    def close(self) -> None:
        self.state = State.CLOSED
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.state = State.CLOSED
        if self.transport is not None:
            self.transport.abort()

    # --- inside ----------------------------------------------------------------------

    def _let_go(self) -> None:
        """The current answer is over (read, or the connection lost): its parser holds
        the reader's callbacks, a cycle only a full garbage collection would free, and
        full collections stop the loop for all they walk (addons/heap.py)."""
        if self._response is not None:
            self._response.parser = None
            self._response = None

    def _peer_closed(self, *, clean: bool) -> None:
        if self._tunnel is not None and not self._tunnel.done():
            self._tunnel.set_exception(ConnectionBroke("the upstream proxy closed the connection"))
        if self._response is not None:
            self._response.peer_closed(clean=clean)
