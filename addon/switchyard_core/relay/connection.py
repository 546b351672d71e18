"""One connection from mitmproxy to the loopback relay: HTTP/1.1 in, the answer out.

Its only client is mitmproxy, so it is a small asyncio protocol rather than a
web framework: httptools parses the request, and each write of the answer is
one chunk on the transport, made in whatever callback produced the bytes
(issue 6: the relay's per-frame cost is what a user pays on every token).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from typing import Protocol, cast

import httptools

from ..exchange import AnswerHead, Exchange
from ..upstreams.body import Body
from .direct_line import DirectLine

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


def _nowhere(data: bytes) -> None:
    """Where an answer's bytes go once the connection is gone."""


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason_phrase(status)}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


class Server(Protocol):
    """What a connection needs of the relay that accepted it (`server.Relay`)."""

    connections: set[RelayConnection]

    async def serve(self, token: str, sink: RelayConnection) -> None: ...


class RelayConnection(asyncio.Protocol):
    """One connection from mitmproxy.  Each request on it is one exchange; the
    connection is also the attempt loop's `ClientSink` for that exchange's answer."""

    def __init__(self, relay: Server) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        # header values as mitmproxy passes them on (a control character in one is the
        # client's business); only the token is read from them
        self._parser.set_dangerous_leniencies(lenient_headers=True)
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
        self.transport = cast(asyncio.Transport, transport)  # a TCP server's transports are
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
        except Exception:  # mitmproxy's internals moved (relay/mitmproxy_reader.py): the socket it is
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
        self._send(_head(status, [*headers, ("Transfer-Encoding", "chunked")]))

    def write(self, data: bytes) -> None:
        if not data or self._aborted or self._bodiless:
            return
        # one write() (never writelines(): before CPython 3.12.9 it skips the
        # flow-control check, and a slow client would never pause the upstream)
        self._send(b"%x\r\n%b\r\n" % (len(data), data))

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._sent = True
        # no length where there is no body to measure: 204 and 304 must not carry one, and
        # an answer to HEAD would claim 0 (its upstream's own length is not known here)
        sized = not (self._bodiless or status in (204, 304))
        framing = [("Content-Length", str(len(body)))] if sized else []
        if self._head is not None:
            self._decide(AnswerHead(status, (*headers, *framing), streamed=False))
            if sized:
                self.write(body)
            return
        self._chunked = False
        self._send(_head(status, [*headers, *framing]) + (body if sized else b""))

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
