"""Where mitmproxy reads a routed flow's answer from: its own end of the relay connection.

The relay hands its answers to that reader in-process (relay/direct_line.py),
skipping the kernel hop.  mitmproxy has no public way to reach it, so this
follows mitmproxy 12's own structures: the `proxyserver` addon's handlers by
client connection (`connections`), and each handler's reader and writer by
server connection (`transports`, holding a `ConnectionIO`).  `unusable` checks
those once, at load; a mitmproxy without them gets every answer through the
socket instead, the same bytes a little slower.  Per flow, a handler or stream
that is not there (the client just left) means the socket too.

`client_end` reaches further, for a body that goes straight to the client: the
handler's writer of the client connection and its `timeout_watchdog`.  Either
missing keeps that body going through mitmproxy, and nothing else.

`head_with_first_content` reaches the client connection's socket the same way,
to send a held head in one segment with the first content behind it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import typing

from mitmproxy import ctx, http, master

from .direct_line import ClientEnd


def unusable(mitmproxy: master.Master) -> str | None:
    """Why mitmproxy's readers cannot be reached, or None if they can."""
    try:
        from mitmproxy.proxy.server import ConnectionHandler, ConnectionIO
    except ImportError:
        return "mitmproxy.proxy.server has no ConnectionHandler or ConnectionIO"
    if not isinstance(getattr(mitmproxy.addons.get("proxyserver"), "connections", None), dict):
        return "mitmproxy's proxyserver addon keeps no connections map"
    if "transports" not in typing.get_type_hints(ConnectionHandler):
        return "mitmproxy's connection handlers keep no transports"
    if not dataclasses.is_dataclass(ConnectionIO) or not {"reader", "writer"} <= {
            field.name for field in dataclasses.fields(ConnectionIO)}:
        return "mitmproxy's ConnectionIO holds no reader and writer"
    return None


def relay_streams(flow: http.HTTPFlow) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """mitmproxy's reader and writer of the flow's current server connection, or None."""
    handler = _handler(flow)
    if handler is None:
        return None
    reader, writer = _streams(handler, flow.server_conn)
    return (reader, writer) if reader is not None and writer is not None else None


def _handler(flow: http.HTTPFlow) -> typing.Any:
    """mitmproxy's handler of the flow's client connection, or None (the client left)."""
    return ctx.master.addons.get("proxyserver").connections.get(flow.client_conn.id)


def _streams(handler: typing.Any, conn: object) -> tuple[asyncio.StreamReader | None, asyncio.StreamWriter | None]:
    """The handler's reader and writer of one of its connections, each if it is asyncio's own."""
    io = handler.transports.get(conn)
    reader, writer = getattr(io, "reader", None), getattr(io, "writer", None)
    return (reader if isinstance(reader, asyncio.StreamReader) else None,
            writer if isinstance(writer, asyncio.StreamWriter) else None)


def client_end(flow: http.HTTPFlow, display: typing.Callable[[bytes], object]) -> ClientEnd | None:
    """Where the flow's body can go without mitmproxy (once mitmproxy has sent the head
    and all it was fed: the caller counts), or None: only where mitmproxy
    would write each chunk to the client unchanged, as the relay frames it, and
    keeps none of them.  That is an HTTP/1.1 answer it sends chunked over plain TCP
    (no TLS it would encrypt, no HTTP/2 or mitmproxy_rs stream it would frame),
    through that callback still, with `store_streamed_bodies` off (on, mitmproxy
    stores every chunk it passes on as the flow's body)."""
    response = flow.response
    client = flow.client_conn
    if (response is None or response.stream is not display or flow.request.http_version != "HTTP/1.1"
            or "store_streamed_bodies" not in ctx.options or ctx.options.store_streamed_bodies
            or client.tls or client.tls_established or client.transport_protocol != "tcp"
            or "chunked" not in response.headers.get("transfer-encoding", "").lower()):
        return None
    handler = _handler(flow)
    if handler is None:
        return None
    _, writer = _streams(handler, client)
    watchdog = getattr(handler, "timeout_watchdog", None)
    if writer is None or watchdog is None:
        return None
    transport = writer.transport
    if not isinstance(transport, asyncio.Transport) or transport.get_extra_info("sslcontext") is not None:
        return None
    return ClientEnd(transport, watchdog.register_activity, display)


def head_with_first_content(flow: http.HTTPFlow) -> None:
    """Hold the client socket's writes until mitmproxy has written the head and
    what is already waiting behind it.

    A head held until the attempt core commits is released together with the
    first content: once this hook returns, mitmproxy writes the head and, in
    the same step, the chunk already fed behind it.  With Nagle off (asyncio's
    default) that is two segments and, at the client, often two wake-ups before
    the first token can be read.  TCP_CORK (Linux) makes it one.  The cork comes
    off as soon as anything else runs: when the next flow's head is corked (this
    one's writes are done by then: under a burst, a head must not wait for
    other flows' work), or on the loop's next turn.  Where the socket or
    TCP_CORK cannot be reached, nothing changes but that.
    """
    cork = getattr(socket, "TCP_CORK", None)
    if cork is None:
        return
    handler = _handler(flow)
    writer = None if handler is None else _streams(handler, flow.client_conn)[1]
    sock = None if writer is None else writer.get_extra_info("socket")
    if sock is None:
        return
    _release(cork)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, cork, 1)
    except OSError:  # the client left, or its socket is no TCP one
        return
    _CORKED.append(sock)
    asyncio.get_running_loop().call_soon(_release, cork)


_CORKED: list[typing.Any] = []  # client sockets corked and not yet released: one, at most


def _release(cork: int) -> None:
    while _CORKED:
        try:
            _CORKED.pop().setsockopt(socket.IPPROTO_TCP, cork, 0)  # sends what was held, at once
        except OSError:
            pass  # the client left: nothing to send
