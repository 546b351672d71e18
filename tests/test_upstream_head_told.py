"""An answer's head told from the read that brought it (`UpstreamClient.open`'s
`headed`), against real loopback servers as in tests/test_upstream_client.py.

Why it matters: the attempt core hears of a head from the upstream connection's
own read instead of from the opening task a loop pass later, and under a burst
that pass is every other flow's work.  What must hold: the head is told once,
before `open` returns the same answer, already as Switchyard keeps it; a failed
head is never told; and a task stopped after its head was read leaves the
connection to the answer (pooled for the next request), never aborts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from switchyard_core.upstreams.client import UpstreamClient
from switchyard_core.upstreams.connection import UpstreamAnswer, UpstreamConnection
from switchyard_core.upstreams.messages import ConnectionBroke, UpstreamRequest

from tests.support.scripted_server import WAIT_S, Peer, Server, answering, response


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    upstream = UpstreamClient()
    yield upstream
    upstream.close()


async def body_of(answer: UpstreamAnswer) -> bytes:
    chunks: list[bytes] = []
    async with asyncio.timeout(WAIT_S):
        while True:
            data, error = await answer.body.read_some()
            assert error is None
            if not data:
                return b"".join(chunks)
            chunks.append(data)


async def test_the_head_is_told_once_from_the_read_before_open_returns_it_as_kept(client: UpstreamClient) -> None:
    """Told outside any task (from the connection's read), before `open` returns, and
    with its head as Switchyard keeps it: a cookie set by another origin is not in
    it, even as it is told."""
    told: list[tuple[UpstreamAnswer, bool, bool, bool]] = []
    returned = False

    def headed(answer: UpstreamAnswer) -> None:
        told.append((answer, returned, asyncio.current_task() is None, "set-cookie" in answer.headers))

    reply = response(headers=[("Set-Cookie", "session=abc"), ("X-Kept", "yes")], body=b"all of it")
    async with Server(answering(reply)) as server:
        request = UpstreamRequest("GET", server.url(), (), b"", other_origin=True)
        async with asyncio.timeout(WAIT_S):
            answer = await client.open(request, connect_timeout_s=WAIT_S, headed=headed)
        returned = True
        assert await body_of(answer) == b"all of it"
    assert len(told) == 1
    told_answer, open_had_returned, outside_a_task, cookie_when_told = told[0]
    assert told_answer is answer and not open_had_returned and outside_a_task
    assert not cookie_when_told  # kept as Switchyard keeps heads before anyone saw it
    assert "set-cookie" not in answer.headers and answer.headers["x-kept"] == "yes"


async def test_a_head_that_never_comes_is_never_told(client: UpstreamClient) -> None:
    told: list[UpstreamAnswer] = []

    async def half_a_head(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-")
        peer.close()

    async with Server(half_a_head) as server:
        with pytest.raises(ConnectionBroke):
            async with asyncio.timeout(WAIT_S):
                await client.open(UpstreamRequest("GET", server.url(), (), b""), connect_timeout_s=WAIT_S,
                                  headed=told.append)
    assert told == []


async def test_a_task_stopped_after_its_head_was_read_leaves_the_connection_to_the_answer(
        client: UpstreamClient) -> None:
    """The whole answer came in one read and its connection went back to the pool; the
    opening task, not yet woken, is cancelled (its exchange ended meanwhile).  The
    connection serves the next request: one connection for both."""
    tasks: list[asyncio.Task[UpstreamAnswer]] = []
    told: list[UpstreamAnswer] = []

    def headed(answer: UpstreamAnswer) -> None:
        told.append(answer)
        tasks[0].cancel()

    replies = (response(body=b"first"), response(body=b"second"))
    async with Server(answering(*replies, requests=2)) as server:
        tasks.append(asyncio.create_task(client.open(UpstreamRequest("GET", server.url("/one"), (), b""),
                                                     connect_timeout_s=WAIT_S, headed=headed)))
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(WAIT_S):
                await tasks[0]
        assert await body_of(told[0]) == b"first"
        assert client.idle_connections == 1
        async with asyncio.timeout(WAIT_S):
            second = await client.open(UpstreamRequest("GET", server.url("/two"), (), b""), connect_timeout_s=WAIT_S)
        assert await body_of(second) == b"second"
        assert server.accepts == 1


async def test_without_headed_a_task_stopped_after_its_head_was_read_aborts_the_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody was told of that head, so nobody holds the answer: its connection must
    not be left open and busy.  The race (the task cancelled in the very pass its head
    was read, before it woke) is hit by cancelling it right after the real read."""
    client = UpstreamClient()
    tasks: list[asyncio.Task[UpstreamAnswer]] = []
    connections: list[UpstreamConnection] = []
    read = UpstreamConnection.data_received

    def then_cancel(self: UpstreamConnection, data: bytes) -> None:
        read(self, data)
        connections.append(self)
        if not tasks[0].done():
            tasks[0].cancel()

    async def streaming(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await peer.wait_closed_by_client()

    monkeypatch.setattr(UpstreamConnection, "data_received", then_cancel)
    try:
        async with Server(streaming) as server:
            tasks.append(asyncio.create_task(client.open(UpstreamRequest("GET", server.url(), (), b""),
                                                         connect_timeout_s=WAIT_S)))
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(WAIT_S):
                    await tasks[0]
            assert connections and connections[0].closed
    finally:
        client.close()
