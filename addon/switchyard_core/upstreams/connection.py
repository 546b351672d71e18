"""One HTTP/1.1 connection to an upstream, on an asyncio transport.

Why not aiohttp's client: its body reader wakes the reading task once per
read, and for a stream of small frames that wake-up cost more CPU than all the
rest of the relay's work (see docs/architecture.md, "Speed").  Here
`data_received` feeds httptools' parser (llhttp in C, the parser uvicorn uses)
and the body goes to a `Body`, which once the attempt has committed hands each
read to the gate synchronously.

The connection (`UpstreamConnection`, with a `State`) lives across requests; each
request's answer is read by its own `_Response`, made when the request is sent.
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
from typing import Protocol, cast

import httptools
from mitmproxy import http
from mitmproxy.net.http import http1, validate
from multidict import CIMultiDict, CIMultiDictProxy

from .body import Body
from .content_coding import DECODED_PER_READ, Decoder, MalformedBody, UnsupportedCoding, decoder_for
from .messages import ConnectionBroke

CONNECT_REPLY_LIMIT = 64 * 1024
# An answer's head: its bytes (status line and header lines, interim answers' too) and
# its header lines.  Past either the attempt fails: a peer that sends headers forever
# must not hold memory until `headers_timeout_s`.  The same byte bound holds for what
# arrives between body bytes (chunk framing, trailers).
HEAD_LIMIT = 64 * 1024
HEADER_COUNT_LIMIT = 256
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token: what a header name may be
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # where a reply's head ends, as mitmproxy finds it
_LINE_END = re.compile(rb"\r?\n")
Key = tuple[str, str, int, str]  # scheme, host, port, TLS name: what a pooled connection can be reused for


class State(enum.Enum):
    """A connection's life, as httpcore names it."""

    NEW = "new"  # being opened: TCP, TLS, an upstream proxy's CONNECT
    ACTIVE = "active"  # a request sent, its answer being read
    IDLE = "idle"  # between requests, in the pool
    CLOSED = "closed"


class UpstreamAnswer:
    """A real upstream response as an `Answer`: status, headers, and its `Body`."""

    __slots__ = ("_connection", "status", "headers", "body")

    def __init__(self, connection: UpstreamConnection, status: int, headers: CIMultiDictProxy[str]) -> None:
        self._connection = connection
        self.status = status
        self.headers = headers
        self.body = Body(producer=connection)

    def close(self) -> None:
        """Done with it: a connection still mid-answer is closed, never reused."""
        self._connection.abandon(self)


class Pool(Protocol):
    """Where a connection goes once its answer was read to the end, and leaves when it closes."""

    def release(self, connection: UpstreamConnection) -> None: ...

    def discard(self, connection: UpstreamConnection) -> None: ...


class _Response:
    """One request's answer, read off its connection by httptools' callbacks."""

    __slots__ = ("connection", "parser", "method", "request", "head", "headers", "pieces", "answer", "decoder",
                 "complete", "until_close", "keep_alive", "unframed", "problem", "held", "backlog", "drain",
                 "message_done")

    def __init__(self, connection: UpstreamConnection, method: str) -> None:
        self.connection = connection
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        # about as forgiving as mitmproxy's own reader: bare-LF line ends in the head, a
        # header folded onto a second line (obs-fold) or holding a control character,
        # spaces after a chunk size; a Content-Length beside chunked it refuses too
        self.parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True,
                                             lenient_headers=True)
        self.method = method
        # the request as mitmproxy's framing rules read it: only its method counts
        self.request = http.Request("", 0, method.encode(), b"", b"", b"", b"HTTP/1.1", http.Headers(), None, None,
                                    0.0, None)
        self.head: asyncio.Future[UpstreamAnswer] = asyncio.get_running_loop().create_future()
        self.headers: list[tuple[bytes, bytes]] = []
        self.pieces: list[bytes] = []  # body bytes of the read being parsed
        self.answer: UpstreamAnswer | None = None
        self.decoder: Decoder | None = None
        self.complete = False
        self.until_close = False  # a body with neither length nor chunks: it ends when the connection does
        self.keep_alive = False  # the answer lets the connection be reused
        self.unframed = 0  # bytes fed since the head began or body bytes last came
        self.problem: str | None = None  # why a callback stopped the parser
        self.held = False  # the body asked to stop reading (its reader or the client is behind)
        self.backlog = False  # the decoder holds more than one read may give out: reading waits
        self.drain: asyncio.Handle | None = None
        self.message_done = False  # the parser saw the answer's end; decoded bytes may still wait

    # --- httptools' callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if _TOKEN.fullmatch(name) is None:
            # the parser's leniency is for values (a folded line); a name it let through with a
            # space (`Transfer-Encoding : chunked`) would dodge every check of the framing
            raise ValueError("malformed header name")  # the parser stops: "malformed HTTP response"
        if self.answer is not None:
            return  # a trailer: not read (what it may take is bounded in `data_received`)
        if len(self.headers) >= HEADER_COUNT_LIMIT:
            self.problem = f"upstream sent more than {HEADER_COUNT_LIMIT} header lines"
            raise ValueError(self.problem)
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        if self.complete or self.answer is not None:  # a second answer to one request
            self.broke("upstream sent more than one answer")
            return
        status = self.parser.get_status_code()
        self.unframed = 0
        if status < 200:  # 1xx: interim, the real answer follows
            self.headers = []
            return
        fields = self.headers
        headers = CIMultiDictProxy(CIMultiDict(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")) for name, value in fields))
        # how the body is framed and whether the connection lives on, decided as mitmproxy
        # decides them (llhttp only reads the bytes)
        head = http.Response(b"HTTP/" + self.parser.get_http_version().encode(), status, b"", http.Headers(fields),
                             None, None, 0.0, None)
        transfer = headers.get("transfer-encoding", "")
        try:
            coding: str | None = validate.parse_transfer_encoding(transfer) if transfer else "identity"
        except ValueError:
            coding = None
        if coding not in ("chunked", "identity"):
            # `gzip, chunked`: llhttp undoes the chunks only, and nobody asked for the rest
            self.broke(f"upstream answered with Transfer-Encoding {transfer.strip()[:40]!r}, "
                       "which Switchyard cannot read")
            return
        try:
            size = http1.expected_http_body_size(self.request, head)
        except ValueError:
            self.broke("malformed HTTP response")
            return
        self.until_close = size == -1
        self.keep_alive = not http1.connection_close(head.http_version, head.headers)
        try:
            self.decoder = decoder_for(headers.get("content-encoding", ""))
        except UnsupportedCoding as exc:
            self.broke(str(exc))
            return
        answer = self.answer = UpstreamAnswer(self.connection, status, headers)
        if not self.head.done():
            self.head.set_result(answer)
        if self.method == "HEAD":
            self.until_close = False
            self.on_message_complete()
            self.parser = None  # llhttp cannot know a HEAD answer has no body; stop reading it

    def on_body(self, data: bytes) -> None:
        if self.answer is None or self.complete:
            return
        self.unframed = 0
        if self.decoder is not None:
            self.decoder.feed(data)  # decoded once the whole read is parsed, a bounded step at a time
        elif data:
            self.pieces.append(data)  # delivered once the whole read is parsed: one write per read

    def on_message_complete(self) -> None:
        answer = self.answer
        if answer is None:  # the end of a 1xx
            self.headers = []
            return
        if self.complete or self.message_done:
            return
        self.message_done = True
        self.unframed = 0
        self.deliver()
        if not self.backlog and not self.complete:
            self.finish_message()

    def finish_message(self) -> None:
        """The answer's end, once every decoded byte of it is out."""
        answer = self.answer
        assert answer is not None
        if self.decoder is not None:
            try:
                answer.body.feed(self.decoder.flush())
            except MalformedBody:
                self.broke("malformed compressed body")
                return
            if not self.decoder.complete:
                self.broke("malformed compressed body")
                return
        self.complete = True
        reusable = self.parser is not None and self.keep_alive and not self.until_close and self.method != "HEAD"
        answer.body.end()
        self.connection.answered(reusable)

    # --- the connection's side -------------------------------------------------------

    def deliver(self, decode: bool = True) -> None:
        """What one read brought of the body, to the body, in one piece.

        A compressed read is decoded at most DECODED_PER_READ bytes at a time: while
        the decoder holds more, the connection stops reading, and each further step
        runs in a later pass of the loop once the body can take it (`drain_step`)."""
        pieces = self.pieces
        decoder = self.decoder
        if decode and decoder is not None and self.answer is not None and not self.complete and not self.held:
            try:
                decoded = decoder.read(DECODED_PER_READ)
            except MalformedBody:
                self.broke("malformed compressed body")
                return
            if decoded:
                pieces.append(decoded)
        if pieces and self.answer is not None:
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            self.answer.body.feed(data)
        if decoder is None or self.complete or self.answer is None:
            return
        if decoder.pending:
            if not self.backlog:
                self.backlog = True
                self.connection.transport_reading(False)
            if not self.held:
                self.schedule_drain()
        elif self.backlog:
            self.backlog = False
            if self.message_done:
                self.finish_message()
            elif not self.held:
                self.connection.transport_reading(True)

    def schedule_drain(self) -> None:
        if self.drain is None:
            self.drain = asyncio.get_running_loop().call_soon(self.drain_step)

    def drain_step(self) -> None:
        self.drain = None
        if self.backlog and not self.held:
            self.deliver()

    def overflow(self) -> str | None:
        """After a read was parsed: what is wrong if the bytes outside any body grew past HEAD_LIMIT."""
        if self.unframed > HEAD_LIMIT and not self.complete:
            part = "response head" if self.answer is None else "chunk framing or trailers"
            return f"upstream sent more than {HEAD_LIMIT // 1024} KiB of {part}"
        return None

    def broke(self, what: str) -> None:
        error = ConnectionBroke(what)
        if not self.head.done():
            self.head.set_exception(error)
        elif self.answer is not None and not self.complete:
            self.deliver(decode=False)  # what came before the break comes first
            self.complete = True
            self.answer.body.end(error)
        self.connection.abort()

    def peer_closed(self, *, clean: bool) -> None:
        """The connection ended: a FIN (`clean`) or a reset.  Only a clean close
        ends a body that has neither a length nor chunks."""
        if not self.head.done():
            self.head.set_exception(ConnectionBroke("connection reset"))
            return
        answer = self.answer
        if answer is None or self.complete:
            return
        if self.message_done:
            return  # whole: the decoded rest is still going out (`drain_step`), and ends it
        if self.until_close and clean and self.backlog:
            self.message_done = True  # the close ends it, once the decoded rest is out
            return
        self.deliver()
        if self.until_close and clean and self.backlog:
            self.message_done = True
            return
        self.complete = True
        decoder = self.decoder
        if not (self.until_close and clean):
            answer.body.end(ConnectionBroke("connection reset"))
            return
        try:
            tail = decoder.flush() if decoder is not None else b""
        except MalformedBody:
            answer.body.end(ConnectionBroke("malformed compressed body"))
            return
        answer.body.feed(tail)
        if decoder is not None and not decoder.complete:
            answer.body.end(ConnectionBroke("connection reset"))  # the compressed stream was cut
            return
        answer.body.end()


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream (or through a proxy to one), across requests."""

    def __init__(self, pool: Pool, key: Key) -> None:
        self.pool = pool
        self.key = key
        self.state = State.NEW
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.received_any = False  # since the current request was sent
        self._response: _Response | None = None  # the current request's answer, while one is read
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
                return
            response.deliver()

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

    def send(self, head: bytes, body: bytes, method: str) -> asyncio.Future[UpstreamAnswer]:
        assert self.transport is not None
        self.state = State.ACTIVE
        response = self._response = _Response(self, method)
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
        if response is not None and response.answer is answer and not response.complete:
            response.answer = None
            response.backlog = False
            self.abort()

    def answered(self, reusable: bool) -> None:
        """The current answer was read to its end."""
        if reusable:
            self.pool.release(self)
        else:
            self.close()

    def idle(self, timer: asyncio.TimerHandle) -> None:
        self.state = State.IDLE
        self._response = None
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

    def _peer_closed(self, *, clean: bool) -> None:
        if self._tunnel is not None and not self._tunnel.done():
            self._tunnel.set_exception(ConnectionBroke("the upstream proxy closed the connection"))
        if self._response is not None:
            self._response.peer_closed(clean=clean)
