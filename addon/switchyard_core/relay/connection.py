"""One connection from mitmproxy to the loopback relay: HTTP/1.1 in, the answer out.

Its only client is mitmproxy, so it is a small asyncio protocol rather than a
web framework: httptools parses the request, and each write of the answer is
one chunk on the transport, made in whatever callback produced the bytes (the
relay's cost per frame is what a user pays on every token).

The connection (`RelayConnection`, with a `State`) lives as long as mitmproxy
keeps it; each request on it is one exchange, answered by its own
`RelayAnswer`, the attempt loop's `ClientSink` for that exchange.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Protocol, cast

import httptools

from .. import observe
from .ticket import AnswerHead, Ticket
from ..upstreams.body import Body
from .direct_line import DirectLine

TOKEN_HEADER = "x-switchyard-token"
PROVISIONAL_HEADER = "x-switchyard-provisional"
_PROVISIONAL_HEAD = f"HTTP/1.1 200 OK\r\n{PROVISIONAL_HEADER}: 1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
# the relay's connection is going: mitmproxy answers the client with its own 502
_NO_RESPONSE = AnswerHead(502, (("Content-Type", "text/plain; charset=utf-8"),), streamed=False)
_TOKEN_HEADER = TOKEN_HEADER.encode()
# mitmproxy keeps its relay connection for the client connection's life and may be
# slow to send on it under load: idle ones go only after a while, as an HTTP server's
# keep-alive lets them; a request that has begun must be complete sooner
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
    client_answers: int  # answers whose body went straight to the client (direct_line.py)

    async def serve(self, token: str, sink: RelayAnswer) -> None: ...


class State(enum.Enum):
    """A relay connection's life."""

    IDLE = "idle"  # waiting for mitmproxy's next request (closed after IDLE_CLOSE_S)
    RECEIVING = "receiving"  # a request has begun (it must be complete within REQUEST_READ_S)
    ANSWERING = "answering"  # its exchange is being served
    CLOSED = "closed"


class RelayConnection(asyncio.Protocol):
    """One connection from mitmproxy, across the requests mitmproxy sends on it."""

    def __init__(self, relay: Server) -> None:
        self.relay = relay
        self.state = State.IDLE
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the transport's buffer is full: mitmproxy is not reading
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        # header values as mitmproxy passes them on (a control character in one is the
        # client's business); only the token is read from them
        self._parser.set_dangerous_leniencies(lenient_headers=True)
        self._token = ""
        self._timer: asyncio.TimerHandle | None = None  # closes the connection if nothing completes in time
        self._answer: RelayAnswer | None = None  # the current request's, while it is served
        self._task: asyncio.Task[None] | None = None

    # --- asyncio's side ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP server's transports are
        self.relay.connections.add(self)
        self._close_after(IDLE_CLOSE_S)

    def data_received(self, data: bytes) -> None:
        if self.state is State.IDLE:
            # a request began: it must also end, or the connection goes (never
            # a slow trickle holding it open)
            self.state = State.RECEIVING
            self._close_after(REQUEST_READ_S)
        if self._parser is None:
            return  # (lost already)
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
        self.state = State.CLOSED
        self._cancel_timer()
        # the parser holds this connection's callbacks: a cycle only a full garbage
        # collection would free, and those stop the loop for all they walk (addons/heap.py)
        self._parser = None
        answer = self._answer
        if answer is not None:
            answer.detach()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # mitmproxy gave up on the flow: the client left
        if answer is not None:
            answer.decide(_NO_RESPONSE)  # never leave the Router's hook waiting

    def pause_writing(self) -> None:
        self.paused = True
        if self._answer is not None:
            self._answer.flow_control(True)

    def resume_writing(self) -> None:
        self.paused = False
        if self._answer is not None:
            self._answer.flow_control(False)

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
        assert self.transport is not None
        self._cancel_timer()
        self.state = State.ANSWERING
        # an answer to HEAD has a head only
        bodiless = self._parser is not None and self._parser.get_method() == b"HEAD"
        answer = self._answer = RelayAnswer(self, self.transport, bodiless=bodiless)
        task = asyncio.get_running_loop().create_task(self._serve(self._token, answer))
        # mitmproxy's loop runs new tasks eagerly: a short answer (a 403) may be
        # served, and `_serve` finished, before create_task returns
        self._task = None if task.done() else task

    async def _serve(self, token: str, answer: RelayAnswer) -> None:
        try:
            await self.relay.serve(token, answer)
        finally:
            answer.finish()
            self._task = None
            self._answer = None
            if self.transport is not None and not self.transport.is_closing():
                self.state = State.IDLE
                self._close_after(IDLE_CLOSE_S)
            else:
                self.state = State.CLOSED

    def _close_after(self, seconds: float) -> None:
        assert self.transport is not None
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, self.transport.close)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        """Drop the connection at once; an answer in progress is cut."""
        if self._answer is not None:
            self._answer.abort()
        elif self.transport is not None:
            self.transport.abort()


class RelayAnswer:
    """One exchange's answer on its relay connection: the attempt core's `ClientSink`."""

    __slots__ = ("_connection", "_transport", "_bodiless", "_sent", "_chunked", "_aborted", "_head", "_line",
                 "_producer", "_send", "_ticket", "_fed")

    def __init__(self, connection: RelayConnection, transport: asyncio.Transport, *, bodiless: bool) -> None:
        self._connection = connection
        self._transport = transport
        self._bodiless = bodiless
        self._sent = False
        self._chunked = False
        self._aborted = False
        self._head: asyncio.Future[AnswerHead] | None = None  # the real head, for the Router's hook
        self._line: DirectLine | None = None  # the answer goes to mitmproxy in-process
        self._producer: Body | None = None
        self._send: Callable[[bytes], object] = transport.write  # where the bytes go: the socket or the line
        self._ticket: Ticket | None = None  # (in-process: it may say how to reach the client, see `write`)
        self._fed = 0  # body bytes given to mitmproxy (the switch to the client waits until it sent them all)

    # --- the connection's side ---------------------------------------------------------

    @property
    def connection(self) -> RelayConnection:
        """The relay connection this answer goes out on (a WebSocket session takes it over)."""
        return self._connection

    def flow_control(self, paused: bool) -> None:
        """mitmproxy stopped (or resumed) reading the socket."""
        if self._producer is not None and self._line is None:
            self._producer.hold(paused)

    def detach(self) -> None:
        """The connection is gone: nothing more can be sent."""
        self._send = _nowhere

    def decide(self, head: AnswerHead) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_result(head)

    def finish(self) -> None:
        """The exchange is over, however it went."""
        self.decide(_NO_RESPONSE)  # the Router's hook must not wait on
        self._producer = None
        self._ticket = None
        if self._line is not None:
            self._line.close()
            self._line = None

    # --- the attempt core's ClientSink -------------------------------------------------

    def go_direct(self, ticket: Ticket) -> bool:
        """Before the answer's first byte: hand it to mitmproxy in-process if it can be."""
        if ticket.mitmproxy_streams is None:
            return False
        try:
            streams = ticket.mitmproxy_streams()
        except (AttributeError, KeyError, TypeError) as exc:  # mitmproxy's structures moved under us
            observe.emit(logging.WARNING, "switchyard.direct_line_unavailable", error=f"{type(exc).__name__}: {exc}")
            return False
        self._line = DirectLine.connect(streams, self._transport)
        if self._line is None:
            return False
        self._send = self._line.write
        self._ticket = ticket
        return True

    def begin(self, ticket: Ticket) -> None:
        """Send mitmproxy the provisional head now; the real one follows in `ticket.head`."""
        self._head = ticket.head = asyncio.get_running_loop().create_future()
        self._chunked = True
        self._send(_PROVISIONAL_HEAD)

    @property
    def headers_sent(self) -> bool:
        return self._sent

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """A streamed answer, chunked (delimiting it by closing the connection, or
        announcing `Connection: close`, would slow the first byte)."""
        self._sent = True
        if self._head is not None:
            self.decide(AnswerHead(status, tuple(headers), streamed=True))
            return
        self._chunked = True
        self._send(_head(status, [*headers, ("Transfer-Encoding", "chunked")]))

    def write(self, data: bytes) -> None:
        if not data or self._aborted or self._bodiless:
            return
        line = self._line
        if line is not None and (line.client is not None or self._reach_client(line)):
            line.to_client(data)  # mitmproxy has sent the head: the body goes on without it (direct_line.py)
            return
        # one write() (never writelines(): before CPython 3.12.9 it skips the
        # flow-control check, and a slow client would never pause the upstream)
        self._send(b"%x\r\n%b\r\n" % (len(data), data))
        self._fed += len(data)

    def _reach_client(self, line: DirectLine) -> bool:
        ticket = self._ticket
        if ticket is None or not line.reach_client(ticket.client_end, self._fed):
            return False
        self._connection.relay.client_answers += 1
        return True

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._sent = True
        # no length where there is no body to measure: 204 and 304 must not carry one, and
        # an answer to HEAD would claim 0 (its upstream's own length is not known here)
        sized = not (self._bodiless or status in (204, 304))
        framing = [("Content-Length", str(len(body)))] if sized else []
        if self._head is not None:
            self.decide(AnswerHead(status, (*headers, *framing), streamed=False))
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
        elif producer is not None and self._connection.paused:
            producer.hold(True)

    def message(self, data: bytes) -> None:
        """(A WebSocket turn's sink takes messages; an HTTP answer never gets one.)"""
        raise TypeError("an HTTP answer has no messages")

    def abort(self) -> None:
        """End the answer without a clean end: the client must see it was cut."""
        self._aborted = True
        self.decide(_NO_RESPONSE)
        if self._line is not None:
            self._line.cut()  # what it wrote is in mitmproxy's reader, ahead of the end
        self._transport.abort()

    def end(self) -> None:
        if self._aborted or self._transport.is_closing():
            self.decide(_NO_RESPONSE)
            return
        if not self._sent:
            self.send_whole(502, [("Content-Type", "text/plain; charset=utf-8")], b"switchyard: no response\n")
        if self._chunked and not self._bodiless:
            self._send(b"0\r\n\r\n")
