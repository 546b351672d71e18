"""A scripted loopback HTTP server for tests that need exact bytes on the wire:
the n-th accepted connection runs the n-th handler, which reads raw requests
and writes exactly what the test says (split, late, cut, or not at all)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Self

WAIT_S = 5.0  # the bound on every network wait

# ---------------------------------------------------------------------------
# a scripted loopback server


class Peer:
    """The server's side of one accepted connection."""

    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer

    async def read_request(self) -> bytes:
        """One whole request (head and Content-Length body), recorded raw."""
        async with asyncio.timeout(WAIT_S):
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await self.reader.readexactly(length)
        raw = head + body
        self.server.requests.append(raw)
        return raw

    async def send(self, *pieces: bytes) -> None:
        """Each piece as its own write, drained before the next."""
        for piece in pieces:
            self.writer.write(piece)
            async with asyncio.timeout(WAIT_S):
                await self.writer.drain()

    async def wait_closed_by_client(self) -> None:
        """Until the client closes its end (bounded)."""
        async with asyncio.timeout(WAIT_S):
            while await self.reader.read(65536):
                pass

    def close(self) -> None:
        self.writer.close()


Handler = Callable[[Peer], Awaitable[None]]


class Server:
    """A loopback server: the n-th accepted connection runs `handlers[n]`
    (the last one repeats).  Records accepts and raw requests."""

    def __init__(self, *handlers: Handler) -> None:
        self.handlers = handlers
        self.accepts = 0
        self.requests: list[bytes] = []
        self.errors: list[Exception] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._peers: list[Peer] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        assert self._server is not None
        self._server.close()
        for peer in self._peers:
            peer.writer.transport.abort()
        async with asyncio.timeout(WAIT_S):
            await self._server.wait_closed()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if exc_type is None and self.errors:  # a script that did not run as the test meant
            raise self.errors[0]

    def url(self, path: str = "/", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.accepts
        self.accepts += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        peer = Peer(self, reader, writer)
        self._peers.append(peer)
        try:
            await self.handlers[min(index, len(self.handlers) - 1)](peer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: some tests are about exactly that
        except Exception as exc:  # noqa: BLE001 -- re-raised when the server stops
            self.errors.append(exc)


def response(status: str = "200 OK", headers: Sequence[tuple[str, str]] = (), body: bytes = b"",
             *, length: bool = True) -> bytes:
    """A response's bytes; with `length` a Content-Length header is added."""
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers)]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def chunked_head(headers: Sequence[tuple[str, str]] = ()) -> bytes:
    return response(headers=[*headers, ("Transfer-Encoding", "chunked")], length=False)


def answering(*replies: bytes, requests: int = 1) -> Handler:
    """A handler that reads `requests` requests, answering each with the next reply."""

    async def handle(peer: Peer) -> None:
        for index in range(requests):
            await peer.read_request()
            await peer.send(replies[min(index, len(replies) - 1)])
        await peer.wait_closed_by_client()

    return handle


def dechunk(body: bytes) -> bytes:
    """A chunked body's data, up to its last chunk."""
    out, pos = bytearray(), 0
    while True:
        line_end = body.index(b"\r\n", pos)
        size = int(body[pos:line_end], 16)
        if size == 0:
            return bytes(out)
        out += body[line_end + 2:line_end + 2 + size]
        pos = line_end + 2 + size + 2


class Flood:
    """A handler streaming `count` copies of `frame` as fast as the reader takes
    them, then `last`: for tests of a reader that stops.  Counts what it sent;
    `ended` is set when it stops, done or cut off."""

    def __init__(self, frame: bytes, count: int, last: bytes) -> None:
        self.frame, self.count, self.last = frame, count, last
        self.sent = 0
        self.ended = asyncio.Event()

    async def __call__(self, peer: Peer) -> None:
        await peer.read_request()
        peer.writer.write(chunked_head([("Content-Type", "text/event-stream")]))
        try:
            for _ in range(self.count):
                peer.writer.write(chunk(self.frame))
                await peer.writer.drain()
                self.sent += 1
            await peer.send(chunk(self.last), LAST_CHUNK)
        finally:
            self.ended.set()
        await peer.wait_closed_by_client()

    async def until_held(self, each: Callable[[], None] = lambda: None) -> int:
        """Frames sent once sending stalled for 0.3 s (or all were sent; at most 10 s),
        calling `each` every 50 ms meanwhile."""
        last, still = -1, 0
        for _ in range(200):
            await asyncio.sleep(0.05)
            each()
            still = still + 1 if self.sent == last else 0
            last = self.sent
            if still >= 6 or self.sent == self.count:
                break
        return self.sent
