"""A WebSocket to an upstream, as a client: wsproto over an asyncio transport.

An upstream's `url` is its HTTP URL; its WebSocket is that URL upgraded
(http→ws, https→wss).  The handshake carries the headers `build_request`
chose for that upstream (its own credentials; the client's only on its own
origin).  Messages and the close are handed, in order, to whoever the
session says owns the socket now; pings are answered here and never reach
anyone (they are not output).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from ..redaction import CLOSE_REASON_LIMIT, redact_bytes, redact_cut, redact_headers, redact_text
from ..ws_items import Binary, Closed, Item
from .messages import ConnectionBroke, ConnectTimeout, UpstreamRequest

# a message (or a refused handshake's body) larger than this breaks the connection
MESSAGE_LIMIT = 64 * 1024 * 1024
REJECT_BODY_LIMIT = 1024 * 1024
# statuses that say "no WebSocket here": with `websocket: auto` the upstream is asked over HTTP
# (a success other than 101 is a server that ignored the upgrade and answered the GET)
NOT_A_WEBSOCKET = frozenset({400, 404, 405, 426, 501, *range(200, 300)})
_HANDSHAKE_OWN = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                            "sec-websocket-protocol", "content-length", "content-type", "accept-encoding"})



class Refused(Exception):
    """The upstream answered the upgrade with something other than 101."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        super().__init__(f"WebSocket upgrade refused with {status}")
        self.status = status
        self.headers = headers
        self.body = body


def websocket_url(http_url: str) -> str:
    parts = urlsplit(http_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme.lower(), parts.scheme)
    return parts._replace(scheme=scheme).geturl()


class HoldsTheOtherSide(asyncio.Protocol):
    """A socket of a relayed WebSocket: while its writes back up (its peer reads
    nothing), `paused` is told, so that the other side of the relay is not read
    meanwhile and nothing piles up in between."""

    paused: Callable[[bool], None] | None = None

    def pause_writing(self) -> None:
        if self.paused is not None:
            self.paused(True)

    def resume_writing(self) -> None:
        if self.paused is not None:
            self.paused(False)


class UpstreamSocket(HoldsTheOtherSide):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reject: tuple[int, list[tuple[str, str]]] | None = None
        self._reject_body = bytearray()
        self._parts: list[bytes] = []
        self._size = 0
        self.closed: Closed | None = None
        self._receiver: Callable[[Item], None] | None = None
        self._early: list[Item] = []  # what came before anyone listened
        # what the upstream's `${VAR}`s hold (its request's `secrets`): its close reason and a
        # refused upgrade's head and body are redacted here, before anyone reads them
        self._secrets: tuple[bytes, ...] = ()
        self.paused: Callable[[bool], None] | None = None  # the client side, held while the upstream is not reading

    # --- the owner's side -----------------------------------------------------------

    def listen(self, receiver: Callable[[Item], None] | None) -> None:
        """Items from now on go to `receiver`; None: nobody listens (they are dropped)."""
        self._receiver = receiver
        if receiver is not None:
            early, self._early = self._early, []
            for item in early:
                receiver(item)

    def send_text(self, text: str) -> None:
        self._send(TextMessage(data=text))

    def send_bytes(self, data: bytes) -> None:
        self._send(BytesMessage(data=data))

    def close(self, code: int = 1000, reason: str = "") -> None:
        """A clean close when the socket is open, else just the transport."""
        if self.closed is None:
            self.closed = Closed(code, reason)
            try:
                self._write(self._ws.send(CloseConnection(code=code, reason=reason)))
            except LocalProtocolError:
                pass
        self._receiver = None
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = self.closed or Closed(1006)
        self._receiver = None
        if self.transport is not None:
            self.transport.abort()

    @property
    def open(self) -> bool:
        return self.closed is None and self.transport is not None and not self.transport.is_closing()

    def _send(self, event: TextMessage | BytesMessage) -> None:
        if self.open:
            self._write(self._ws.send(event))

    def _write(self, data: bytes) -> None:
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # --- asyncio's side -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                self._event(event)
        except RemoteProtocolError as exc:
            self._fail(ConnectionBroke(f"upstream broke the WebSocket protocol ({exc})"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.paused is not None:
            self.paused(False)  # nothing more to write: whoever was held goes on
        if not self._handshake.done():
            self._handshake.set_exception(ConnectionBroke("connection closed during the WebSocket handshake"))
        self._ended(Closed(1006))

    def _event(self, event: object) -> None:
        if isinstance(event, AcceptConnection):
            if not self._handshake.done():
                self._handshake.set_result(None)
        elif isinstance(event, RejectConnection):
            self._reject = (event.status_code, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers])
            if not event.has_body:
                self._refused()
        elif isinstance(event, RejectData):
            if len(self._reject_body) < REJECT_BODY_LIMIT:
                self._reject_body += event.data[:REJECT_BODY_LIMIT - len(self._reject_body)]
            if event.body_finished:
                self._refused()
        elif isinstance(event, TextMessage | BytesMessage):
            piece = event.data.encode() if isinstance(event, TextMessage) else bytes(event.data)
            self._size += len(piece)
            if self._size > MESSAGE_LIMIT:
                self._fail(ConnectionBroke(f"upstream sent a WebSocket message over {MESSAGE_LIMIT} bytes"))
                return
            self._parts.append(piece)
            if event.message_finished:
                whole = b"".join(self._parts)
                self._parts, self._size = [], 0
                self._deliver(whole if isinstance(event, TextMessage) else Binary(whole))
        elif isinstance(event, Ping):
            self._write(self._ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            try:
                self._write(self._ws.send(event.response()))
            except LocalProtocolError:
                pass
            self._ended(Closed(event.code, redact_text(event.reason or "", self._secrets, limit=CLOSE_REASON_LIMIT)))
            if self.transport is not None:
                self.transport.close()

    def _refused(self) -> None:
        assert self._reject is not None
        if not self._handshake.done():
            status, headers = self._reject
            self._handshake.set_exception(Refused(status, redact_headers(headers, self._secrets),
                                                  redact_cut(bytes(self._reject_body), self._secrets)))
        if self.transport is not None:
            self.transport.close()

    def _deliver(self, item: Item) -> None:
        if self._receiver is not None:
            self._receiver(item)
        elif self.closed is None:
            self._early.append(item)

    def _ended(self, closed: Closed) -> None:
        first = self.closed is None
        self.closed = self.closed or closed
        if first:
            self._deliver(closed)

    def _fail(self, error: ConnectionBroke) -> None:
        if not self._handshake.done():
            self._handshake.set_exception(error)
        self._ended(Closed(1006, error.what))
        if self.transport is not None:
            self.transport.abort()

    # --- opening ----------------------------------------------------------------------

    async def handshake(self, request: UpstreamRequest) -> None:
        self._secrets = request.secrets
        url = urlsplit(request.url)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = [(name.encode(), value.encode("utf-8", "surrogateescape")) for name, value in request.headers
                   if name.lower() not in _HANDSHAKE_OWN]
        self._write(self._ws.send(Request(host=url.netloc.rpartition("@")[2], target=target, extra_headers=headers,
                                          extensions=[PerMessageDeflate()])))
        await self._handshake


async def open_socket(request: UpstreamRequest, tls: Callable[[], ssl.SSLContext], *, connect_timeout_s: float,
                      handshake_timeout_s: float | None) -> UpstreamSocket:
    """Connect, upgrade, and return the open socket.  Raises `ConnectTimeout`,
    `TimeoutError` (no handshake answer in time), `Refused`, or an `OSError`."""
    loop = asyncio.get_running_loop()
    url = urlsplit(request.url)
    secure = url.scheme.lower() == "https"
    host = url.hostname or ""
    port = url.port or (443 if secure else 80)
    socket = UpstreamSocket()
    try:
        async with asyncio.timeout(connect_timeout_s or None):
            await loop.create_connection(lambda: socket, request.address or host, port,
                                         ssl=tls() if secure else None,
                                         server_hostname=host if secure else None)
    except TimeoutError:
        socket.abort()
        raise ConnectTimeout(f"no connection within {connect_timeout_s:g}s") from None
    except BaseException:
        socket.abort()
        raise
    try:
        async with asyncio.timeout(handshake_timeout_s):
            await socket.handshake(request)
    except BaseException:
        socket.abort()
        raise
    return socket
