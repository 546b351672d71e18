"""One upstream answer as it is read off its connection: httptools' callbacks in,
the answer's head and body out (`UpstreamAnswer`, its `Body`).

How far the answer has been read is its `Phase`; how its body is framed
(`until_close`, `keep_alive`) is decided as mitmproxy decides it; a compressed
read is decoded a bounded step at a time, the connection not read meanwhile
(`backlog`), and not while the body's reader is behind (`held`).  The
connection that carries it (connection.py) lives across requests.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import re
from collections.abc import Callable
from typing import NamedTuple, Protocol, cast

import httptools
from mitmproxy import http
from mitmproxy.net.http import http1, validate
from multidict import CIMultiDict, CIMultiDictProxy

from .body import Body
from .content_coding import DECODED_PER_READ, Decoder, MalformedBody, UnsupportedCoding, decoder_for
from .messages import ConnectionBroke

# An answer's head: its bytes (status line and header lines, interim answers' too) and
# its header lines.  Past either the attempt fails: a peer that sends headers forever
# must not hold memory until `headers_timeout_s`.  The same byte bound holds for what
# arrives between body bytes (chunk framing, trailers).
HEAD_LIMIT = 64 * 1024
HEADER_COUNT_LIMIT = 256
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token: what a header name may be


@functools.lru_cache(maxsize=32)
def _request_of(method: str) -> http.Request:
    """A request as mitmproxy's framing rules read it: only its method counts.  One
    per method: building a `Request` runs its field checks, measurable per answer."""
    return http.Request("", 0, method.encode(), b"", b"", b"", b"HTTP/1.1", http.Headers(), None, None, 0.0, None)


class _FramingHead(NamedTuple):
    """What `http1.expected_http_body_size` reads of a response: its status and
    headers (a full `Response` runs field checks that cost more than the decision)."""

    status_code: int
    headers: http.Headers


class Carrier(Protocol):
    """What an answer needs of the connection it is read off (connection.UpstreamConnection)."""

    def abandon(self, answer: "UpstreamAnswer") -> None: ...

    def answered(self, reusable: bool) -> None: ...

    def abort(self) -> None: ...

    def transport_reading(self, reading: bool) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class UpstreamAnswer:
    """A real upstream response as an `Answer`: status, headers, and its `Body`."""

    __slots__ = ("_connection", "status", "headers", "body")

    def __init__(self, connection: Carrier, status: int, headers: CIMultiDictProxy[str]) -> None:
        self._connection = connection
        self.status = status
        self.headers = headers
        self.body = Body(producer=connection)

    def close(self) -> None:
        """Done with it: a connection still mid-answer is closed, never reused."""
        self._connection.abandon(self)


class Phase(enum.Enum):
    """How far one answer has been read."""

    HEAD = "head"  # its head has not come yet (1xx answers are skipped here)
    BODY = "body"  # its body is being read
    ENDING = "ending"  # the parser saw its end; decoded bytes are still going out
    DONE = "done"  # ended, cleanly or broken off


class ResponseReader:
    """One request's answer, read off its connection by httptools' callbacks."""

    __slots__ = ("connection", "parser", "method", "request", "head", "on_head", "headers", "pieces", "answer",
                 "decoder", "phase", "until_close", "keep_alive", "unframed", "problem", "held", "backlog", "drain")

    def __init__(self, connection: Carrier, method: str,
                 on_head: Callable[[UpstreamAnswer], None] | None = None) -> None:
        self.connection = connection
        self.on_head = on_head  # told once, by `announce`, after the read that completed the head
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        # about as forgiving as mitmproxy's own reader: bare-LF line ends in the head, a
        # header folded onto a second line (obs-fold) or holding a control character,
        # spaces after a chunk size; a Content-Length beside chunked it refuses too
        self.parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True,
                                             lenient_headers=True)
        self.method = method
        self.request = _request_of(method)  # as mitmproxy's framing rules read it
        self.head: asyncio.Future[UpstreamAnswer] = asyncio.get_running_loop().create_future()
        self.headers: list[tuple[bytes, bytes]] = []
        self.pieces: list[bytes] = []  # body bytes of the read being parsed
        self.answer: UpstreamAnswer | None = None
        self.decoder: Decoder | None = None
        self.phase = Phase.HEAD
        self.until_close = False  # a body with neither length nor chunks: it ends when the connection does
        self.keep_alive = False  # the answer lets the connection be reused
        self.unframed = 0  # bytes fed since the head began or body bytes last came
        self.problem: str | None = None  # why a callback stopped the parser
        self.held = False  # the body asked to stop reading (its reader or the client is behind)
        self.backlog = False  # the decoder holds more than one read may give out: reading waits
        self.drain: asyncio.Handle | None = None

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
        if self.phase is not Phase.HEAD:  # a second answer to one request
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
        framing = _FramingHead(status, http.Headers(fields))
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
            size = http1.expected_http_body_size(self.request, cast(http.Response, framing))
        except ValueError:
            self.broke("malformed HTTP response")
            return
        self.until_close = size == -1
        self.keep_alive = not http1.connection_close("HTTP/" + self.parser.get_http_version(), framing.headers)
        try:
            self.decoder = decoder_for(headers.get("content-encoding", ""))
        except UnsupportedCoding as exc:
            self.broke(str(exc))
            return
        answer = self.answer = UpstreamAnswer(self.connection, status, headers)
        self.phase = Phase.BODY
        if not self.head.done():
            self.head.set_result(answer)
        if self.method == "HEAD":
            self.until_close = False
            self.on_message_complete()
            self.parser = None  # llhttp cannot know a HEAD answer has no body; stop reading it

    def on_body(self, data: bytes) -> None:
        if self.phase is not Phase.BODY:
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
        if self.phase is not Phase.BODY:
            return
        self.phase = Phase.ENDING
        self.unframed = 0
        self.deliver()
        if not self.backlog and self.phase is Phase.ENDING:
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
        self.phase = Phase.DONE
        reusable = self.parser is not None and self.keep_alive and not self.until_close and self.method != "HEAD"
        answer.body.end()
        self.connection.answered(reusable)

    # --- the connection's side -------------------------------------------------------

    def announce(self) -> None:
        """The head to `on_head`, once it is read: called by the connection after each
        read that finds `on_head` still waiting, outside httptools' callbacks."""
        on_head, answer = self.on_head, self.answer
        if on_head is not None and answer is not None:
            self.on_head = None
            on_head(answer)

    def deliver(self, decode: bool = True) -> None:
        """What one read brought of the body, to the body, in one piece.

        A compressed read is decoded at most DECODED_PER_READ bytes at a time: while
        the decoder holds more, the connection stops reading, and each further step
        runs in a later pass of the loop once the body can take it (`drain_step`)."""
        pieces = self.pieces
        decoder = self.decoder
        done = self.phase is Phase.DONE
        if decode and decoder is not None and self.answer is not None and not done and not self.held:
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
        if decoder is None or self.phase is Phase.DONE or self.answer is None:
            return
        if decoder.pending:
            if not self.backlog:
                self.backlog = True
                self.connection.transport_reading(False)
            if not self.held:
                self.schedule_drain()
        elif self.backlog:
            self.backlog = False
            if self.phase is Phase.ENDING:
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
        if self.unframed > HEAD_LIMIT and self.phase is not Phase.DONE:
            part = "response head" if self.answer is None else "chunk framing or trailers"
            return f"upstream sent more than {HEAD_LIMIT // 1024} KiB of {part}"
        return None

    def broke(self, what: str) -> None:
        error = ConnectionBroke(what)
        if not self.head.done():
            self.on_head = None
            self.head.set_exception(error)
        elif self.answer is not None and self.phase is not Phase.DONE:
            self.deliver(decode=False)  # what came before the break comes first
            self.phase = Phase.DONE
            self.answer.body.end(error)
        self.connection.abort()

    def peer_closed(self, *, clean: bool) -> None:
        """The connection ended: a FIN (`clean`) or a reset.  Only a clean close
        ends a body that has neither a length nor chunks."""
        if not self.head.done():
            self.on_head = None
            self.head.set_exception(ConnectionBroke("connection reset"))
            return
        answer = self.answer
        if answer is None or self.phase is not Phase.BODY:
            return  # ENDING: whole, the decoded rest is still going out (`drain_step`), and ends it
        if self.until_close and clean and self.backlog:
            self.phase = Phase.ENDING  # the close ends it, once the decoded rest is out
            return
        self.deliver()
        if self.until_close and clean and self.backlog:
            self.phase = Phase.ENDING
            return
        self.phase = Phase.DONE
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
