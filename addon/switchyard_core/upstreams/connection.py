"""One HTTP/1.1 connection to an upstream, on an asyncio transport.

Why not aiohttp's client: its body reader wakes the reading task once per
read, and for a stream of small frames that wake-up cost more CPU than all the
rest of the relay's work (issue 6; an aiohttp relay forwarding raw bytes ran at
~1.35x plain mitmdump's CPU).  Here `data_received` feeds httptools' parser
(llhttp in C, the parser uvicorn uses) and the body goes to a `Body`, which
once the attempt has committed hands each read to the gate synchronously.

One request at a time, answers read to their end before the connection is
reused; 1xx answers skipped; gzip and deflate decoded (the only codings the
relay asks for); a body that ends by a reset, or whose compressed stream is
cut, never ends cleanly.  `client.py` opens, pools and reuses these.
"""

from __future__ import annotations

import asyncio
import re
from typing import Protocol

import httptools
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
Key = tuple[str, str, int, str]  # scheme, host, port, TLS name: what a pooled connection can be reused for


class UpstreamAnswer:
    """A real upstream response as an `Answer`: status, headers, and its `Body`."""

    __slots__ = ("_connection", "status", "headers", "body")

    def __init__(self, connection: "UpstreamConnection", status: int, headers: CIMultiDictProxy[str]) -> None:
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


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream (or through a proxy to one)."""

    def __init__(self, pool: Pool, key: Key) -> None:
        self.pool = pool
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
        self._pieces: list[bytes] = []  # body bytes of the read being parsed
        self._answer: UpstreamAnswer | None = None
        self._decoder: Decoder | None = None
        self._complete = False
        self._until_close = False  # a body with neither length nor chunks: it ends when the connection does
        self._idle_timer: asyncio.TimerHandle | None = None
        self._unframed = 0  # bytes fed since the head began or body bytes last came
        self._problem: str | None = None  # why a callback stopped the parser
        self._held = False  # the body asked to stop reading (its reader or the client is behind)
        self._backlog = False  # the decoder holds more than one read may give out: reading waits
        self._drain: asyncio.Handle | None = None
        self._message_done = False  # the parser saw the answer's end; decoded bytes may still wait
        self._keep_alive = False

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
        self._unframed += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broke("upstream switched protocols")
        except httptools.HttpParserError:
            self._broke(self._problem or "malformed HTTP response")
        else:
            if self._unframed > HEAD_LIMIT and not self._complete:
                part = "response head" if self._answer is None else "chunk framing or trailers"
                self._broke(f"upstream sent more than {HEAD_LIMIT // 1024} KiB of {part}")
                return
            self._deliver()

    def eof_received(self) -> bool:
        self.closed = True
        self._peer_closed(clean=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.pool.discard(self)
        self._peer_closed(clean=exc is None)

    def pause_reading(self) -> None:
        self._held = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        self._held = False
        if self._backlog:
            self._schedule_drain()  # decoded bytes first; reading resumes once they are out
        elif self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # --- httptools' callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if _TOKEN.fullmatch(name) is None:
            # the parser's leniency is for values (a folded line); a name it let through with a
            # space (`Transfer-Encoding : chunked`) would dodge every check of the framing
            raise ValueError("malformed header name")  # the parser stops: "malformed HTTP response"
        if self._answer is not None:
            return  # a trailer: not read (what it may take is bounded in `data_received`)
        if len(self._headers) >= HEADER_COUNT_LIMIT:
            self._problem = f"upstream sent more than {HEADER_COUNT_LIMIT} header lines"
            raise ValueError(self._problem)
        self._headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        if self._complete or self._head is None:  # a second answer to one request
            self._broke("upstream sent more than one answer")
            return
        status = self._parser.get_status_code()
        self._unframed = 0
        if status < 200:  # 1xx: interim, the real answer follows
            self._headers = []
            return
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        transfer = headers.get("transfer-encoding", "")
        self._until_close = ("chunked" not in transfer.lower()
                             and "content-length" not in headers and status not in (204, 304))
        if any(coding.strip().lower() not in ("", "chunked", "identity") for coding in transfer.split(",")):
            # `gzip, chunked`: llhttp undoes the chunks only, and nobody asked for the rest
            self._broke(f"upstream answered with Transfer-Encoding {transfer.strip()[:40]!r}, "
                        "which Switchyard cannot read")
            return
        try:
            self._decoder = decoder_for(headers.get("content-encoding", ""))
        except UnsupportedCoding as exc:
            self._broke(str(exc))
            return
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
        self._unframed = 0
        if self._decoder is not None:
            self._decoder.feed(data)  # decoded once the whole read is parsed, a bounded step at a time
        elif data:
            self._pieces.append(data)  # delivered once the whole read is parsed: one write per read

    def _deliver(self, decode: bool = True) -> None:
        """What one read brought of the body, to the body, in one piece.

        A compressed read is decoded at most DECODED_PER_READ bytes at a time: while
        the decoder holds more, the connection stops reading, and each further step
        runs in a later pass of the loop once the body can take it (`_drain`)."""
        pieces = self._pieces
        decoder = self._decoder
        if decode and decoder is not None and self._answer is not None and not self._complete and not self._held:
            try:
                decoded = decoder.read(DECODED_PER_READ)
            except MalformedBody:
                self._broke("malformed compressed body")
                return
            if decoded:
                pieces.append(decoded)
        if pieces and self._answer is not None:
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            self._answer.body.feed(data)
        if decoder is None or self._complete or self._answer is None:
            return
        if decoder.pending:
            if not self._backlog:
                self._backlog = True
                if self.transport is not None and not self.closed:
                    self.transport.pause_reading()
            if not self._held:
                self._schedule_drain()
        elif self._backlog:
            self._backlog = False
            if self._message_done:
                self._finish_message()
            elif not self._held and self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def _schedule_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().call_soon(self._drain_step)

    def _drain_step(self) -> None:
        self._drain = None
        if self._backlog and not self._held:
            self._deliver()

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is None:  # the end of a 1xx
            self._headers = []
            return
        if self._complete or self._message_done:
            return
        self._message_done = True
        self._unframed = 0
        # asked now: once the parser has moved past this answer it no longer knows
        self._keep_alive = self._parser is not None and self._parser.should_keep_alive()
        self._deliver()
        if not self._backlog and not self._complete:
            self._finish_message()

    def _finish_message(self) -> None:
        """The answer's end, once every decoded byte of it is out."""
        answer = self._answer
        assert answer is not None
        if self._decoder is not None:
            try:
                answer.body.feed(self._decoder.flush())
            except MalformedBody:
                self._broke("malformed compressed body")
                return
            if not self._decoder.complete:
                self._broke("malformed compressed body")
                return
        self._complete = True
        reusable = (self._parser is not None and self._keep_alive and not self._until_close
                    and self._method != "HEAD")
        answer.body.end()
        if reusable:
            self.pool.release(self)
        else:
            self.close()

    # --- the client's side -----------------------------------------------------------

    def send(self, head: bytes, body: bytes, method: str) -> asyncio.Future[UpstreamAnswer]:
        assert self.transport is not None
        self._parser = parser = httptools.HttpResponseParser(self)
        # about as forgiving as mitmproxy's own reader: bare-LF line ends in the head, a
        # header folded onto a second line (obs-fold) or holding a control character,
        # spaces after a chunk size; a Content-Length beside chunked it refuses too
        parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True,
                                        lenient_headers=True)
        self._method = method
        self._headers = []
        self._pieces = []
        self._answer = None
        self._complete = False
        self._until_close = False
        self._decoder = None
        self._unframed = 0
        self._problem = None
        self._held = False
        self._backlog = False
        self._message_done = False
        self.received_any = False
        self._head = asyncio.get_running_loop().create_future()
        if self.transport.is_reading() is False:
            self.transport.resume_reading()
        self.transport.write(head + body)
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
        if self._tunnel.done():
            return  # already decided (a bad reply): the rest is not read
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
            self._backlog = False
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
            self._deliver(decode=False)  # what came before the break comes first
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
        if self._message_done:
            return  # whole: the decoded rest is still going out (`_drain`), and ends it
        if self._until_close and clean and self._backlog:
            self._message_done = True  # the close ends it, once the decoded rest is out
            return
        self._deliver()
        if self._until_close and clean and self._backlog:
            self._message_done = True
            return
        self._complete = True
        decoder = self._decoder
        if not (self._until_close and clean):
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
