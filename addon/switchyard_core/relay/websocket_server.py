"""The client's WebSocket as the relay serves it: wsproto, as a server, on the
relay connection mitmproxy opened (mitmproxy carries the client's side).

It answers the upgrade, hands whole messages to the session, answers pings
(never output), and writes what the session sends in order, its close last.
While mitmproxy is not reading, the upstream socket is not read either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import BytesMessage, CloseConnection, Message, Ping, TextMessage
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError, generate_accept_token

from .. import observe
from ..upstreams.websocket import MESSAGE_LIMIT, HoldsTheOtherSide
from ..ws_items import Binary

UNSENDABLE_CLOSE = frozenset({1005, 1006, 1015})  # codes a close frame may not carry
BROKEN_CLOSE = frozenset({1006, 1015})  # of those, the ones that say the connection broke
BROKE = 1011  # "an unexpected condition": the close the client gets when the upstream side broke


class ClientSocket(HoldsTheOtherSide):
    def __init__(self, route: str, on_message: Callable[[str | bytes], None],
                 on_close: Callable[[int, str], None], on_lost: Callable[[], None]) -> None:
        self.route = route
        self._on_message = on_message
        self._on_close = on_close  # the client sent a close (its code and reason)
        self._on_lost = on_lost  # the connection is gone, however
        self.transport: asyncio.Transport | None = None
        self._ws = Connection(ConnectionType.SERVER)
        self._parts: list[Any] = []
        self._size = 0
        self.closed = False  # closing or gone: nothing more is written
        self.paused: Callable[[bool], None] | None = None  # the upstream side, held while mitmproxy is not reading

    def take_over(self, transport: asyncio.Transport, key: str) -> None:
        """The relay connection is this socket's from now on: answer the upgrade."""
        self.transport = transport
        transport.set_protocol(self)
        transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        b"Sec-WebSocket-Accept: " + generate_accept_token(key.encode()) + b"\r\n\r\n")

    # --- writing ---------------------------------------------------------------------

    def send(self, message: bytes) -> None:
        if self.closed or self.transport is None:
            return
        event: Message[Any] = (BytesMessage(data=bytes(message)) if isinstance(message, Binary)
                               else TextMessage(data=message.decode("utf-8", "replace")))
        self.transport.write(self._ws.send(event))

    def close(self, code: int, reason: str) -> None:
        """A close after everything written before it; a broken connection (1006,
        1015: no close frame) is told as a failure (`failed`), and a close without a
        code (1005) is passed on as one: a clean end."""
        if code in BROKEN_CLOSE:
            self.failed(reason or "upstream connection broke")
            return
        if self.closed:
            return
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            close = (CloseConnection(code=CloseReason.NO_STATUS_RCVD) if code == CloseReason.NO_STATUS_RCVD
                     else CloseConnection(code=code, reason=reason))
            try:
                self.transport.write(self._ws.send(close))
            except LocalProtocolError:
                pass
            self.transport.close()

    def failed(self, why: str) -> None:
        """The upstream side broke: the client's WebSocket ends with close code 1011, after
        everything written before it, so that it never looks like a clean end.  Not an
        abort: mitmproxy, between the relay and the client, ends the client's side of a
        dropped connection with a clean 1000 close."""
        if self.closed:
            return
        observe.emit(logging.WARNING, "switchyard.websocket_broken", route=self.route, transport="websocket",
                     reason=why)
        self.close(BROKE, why.encode()[:120].decode("utf-8", "ignore"))  # a close's reason: at most 123 bytes

    def break_off(self, why: str) -> None:
        """End the client's WebSocket without a close (the client broke the protocol)."""
        if self.closed:
            return
        observe.emit(logging.WARNING, "switchyard.websocket_broken", route=self.route, transport="websocket",
                     reason=why)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # --- asyncio's side ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            self._ws.receive_data(data)
            for event in self._ws.events():
                self._event(event)
        except RemoteProtocolError:
            self.break_off("the client broke the WebSocket protocol")
            self._on_lost()

    def _event(self, event: object) -> None:
        if isinstance(event, TextMessage | BytesMessage):
            self._size += len(event.data)
            if self._size > MESSAGE_LIMIT:
                self.break_off(f"a client message over {MESSAGE_LIMIT} bytes")
                self._on_lost()
                return
            self._parts.append(event.data)
            if event.message_finished:
                parts, self._parts, self._size = self._parts, [], 0
                self._on_message("".join(parts) if isinstance(event, TextMessage) else b"".join(parts))
        elif isinstance(event, Ping):
            if self.transport is not None and not self.closed:
                self.transport.write(self._ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if not self.closed and self.transport is not None:
                self.closed = True
                try:
                    self.transport.write(self._ws.send(event.response()))
                except LocalProtocolError:
                    pass
                self.transport.close()
            self._on_close(event.code, event.reason or "")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_lost()
