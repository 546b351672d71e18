"""A held head leaves with the first content behind it, in one segment
(relay/mitmproxy_reader.py, `head_with_first_content`).

Real loopback sockets: mitmproxy's end is an asyncio server's writer, reached the
way the Router reaches it (the `proxyserver` addon's handler for the client
connection); the client is a plain socket that looks without waiting.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
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


Connect = Callable[[], Awaitable[Ends]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Client connections to an asyncio server, as many as a test asks for."""
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.put_nowait(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    made: list[Ends] = []

    async def one() -> Ends:
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        made.append(Ends(await asyncio.wait_for(accepted.get(), 5), client))
        return made[-1]

    try:
        yield one
    finally:
        for ends in made:
            ends.client.close()
            ends.writer.close()
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


def looked(client: socket.socket, want: int | None = None) -> bytes:
    """What a client finds that looks, again and again without waiting (so without the
    loop turning), until `want` bytes are there (bounded: 10,000 looks)."""
    got = b""
    for _ in range(10_000):
        got += received(client)
        if want is not None and len(got) >= want:
            break
    return got


async def test_nothing_is_sent_before_the_turn_ends_and_everything_after_it(connect: Connect) -> None:
    ends = await connect()
    proxyserver = ProxyServer()
    with taddons.context(proxyserver):
        flow = wired(proxyserver, ends)
        mitmproxy_reader.head_with_first_content(flow)
        ends.writer.write(HEAD)
        ends.writer.write(FIRST)
        # still this turn: a client that looks finds nothing, not a lone head
        assert looked(ends.client) == b""
        assert await settled(ends.client, len(HEAD) + len(FIRST)) == HEAD + FIRST
        # and the frames after the first are not held: the cork is off
        sock = ends.writer.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0


async def test_a_client_that_left_changes_nothing(connect: Connect) -> None:
    ends = await connect()
    proxyserver = ProxyServer()
    with taddons.context(proxyserver):
        flow = tflow.tflow(resp=True)  # no handler for its client: it has gone
        mitmproxy_reader.head_with_first_content(flow)
        ends.writer.write(HEAD)
        assert await settled(ends.client, len(HEAD)) == HEAD


async def test_under_a_burst_a_head_waits_for_its_own_writes_not_for_the_next_flows(connect: Connect) -> None:
    first, second = await connect(), await connect()
    proxyserver = ProxyServer()
    with taddons.context(proxyserver):
        one, two = wired(proxyserver, first), wired(proxyserver, second)
        mitmproxy_reader.head_with_first_content(one)
        first.writer.write(HEAD)
        first.writer.write(FIRST)
        # the same turn: the next flow's head is released, so the first one's writes are done
        mitmproxy_reader.head_with_first_content(two)
        second.writer.write(HEAD)
        assert looked(first.client, len(HEAD) + len(FIRST)) == HEAD + FIRST
        assert looked(second.client) == b""
        assert await settled(second.client, len(HEAD)) == HEAD

