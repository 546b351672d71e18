"""A held head leaves with the first content behind it, in one segment
(relay/mitmproxy_reader.py, `head_with_first_content`).

Real loopback sockets: mitmproxy's end is an asyncio server's writer, reached the
way the Router reaches it (the `proxyserver` addon's handler for the client
connection); the client is a plain socket that looks without waiting.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from mitmproxy.proxy.server import ConnectionIO
from mitmproxy.test import taddons, tflow

from switchyard_core.relay import mitmproxy_reader

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
FIRST = b'1f\r\ndata: {"delta":"Hello"}\r\n\r\n\r\n'


@dataclass
class Handler:
    transports: dict[Any, ConnectionIO] = field(default_factory=dict)


class ProxyServer:
    """Stands for mitmproxy's `proxyserver` addon: its connection handlers by client id."""

    def __init__(self) -> None:
        self.connections: dict[str, Handler] = {}


@dataclass
class Ends:
    writer: asyncio.StreamWriter  # mitmproxy's end of the client connection
    client: socket.socket  # the client's end, non-blocking


@pytest.fixture
async def ends() -> AsyncIterator[Ends]:
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    client.setblocking(False)
    writer = await asyncio.wait_for(accepted, 5)
    try:
        yield Ends(writer, client)
    finally:
        client.close()
        writer.close()
        server.close()
        await server.wait_closed()


def received(client: socket.socket) -> bytes:
    try:
        return client.recv(65536)
    except BlockingIOError:
        return b""


async def settled(client: socket.socket, want: int) -> bytes:
    """What the client can read once `want` bytes are there (bounded: 5 s)."""
    got = b""
    for _ in range(500):
        got += received(client)
        if len(got) >= want:
            break
        await asyncio.sleep(0.01)
    return got


def wired(proxyserver: ProxyServer, ends: Ends) -> Any:
    flow = tflow.tflow(resp=True)
    reader = asyncio.StreamReader()
    proxyserver.connections[flow.client_conn.id] = Handler(
        {flow.client_conn: ConnectionIO(handler=None, reader=reader, writer=ends.writer)})
    return flow


async def test_nothing_is_sent_before_the_turn_ends_and_everything_after_it(ends: Ends) -> None:
    proxyserver = ProxyServer()
    with taddons.context(proxyserver):
        flow = wired(proxyserver, ends)
        mitmproxy_reader.head_with_first_content(flow)
        ends.writer.write(HEAD)
        ends.writer.write(FIRST)
        # still this turn: a client that looks finds nothing, not a lone head
        held = b""
        for _ in range(20):
            held += received(ends.client)
        assert held == b""
        assert await settled(ends.client, len(HEAD) + len(FIRST)) == HEAD + FIRST
        # and the frames after the first are not held: the cork is off
        sock = ends.writer.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0


async def test_a_client_that_left_changes_nothing(ends: Ends) -> None:
    proxyserver = ProxyServer()
    with taddons.context(proxyserver):
        flow = tflow.tflow(resp=True)  # no handler for its client: it has gone
        mitmproxy_reader.head_with_first_content(flow)
        ends.writer.write(HEAD)
        assert await settled(ends.client, len(HEAD)) == HEAD
