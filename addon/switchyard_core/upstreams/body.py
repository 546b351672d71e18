"""An answer's bytes on their way from the upstream connection to the attempt loop.

Before an attempt commits, the loop *pulls* (`read_some`): it must stay free to
time out, discard the attempt and move on.  Once it has committed, the rest is
*pushed* (`pipe`): each read from the upstream goes through the gate to the
client inside the upstream connection's own callback.  Waking the loop's task
once per frame would cost more CPU than all the rest of the relay's work on
that frame, and a committed stream is most of every answer's frames (see
docs/architecture.md, "Speed").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

BUFFER_LIMIT = 256 * 1024  # unread bytes held before the upstream is asked to pause


class Producer(Protocol):
    """Whatever fills a `Body`: it can be asked to stop reading for a while."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Body:
    __slots__ = ("_producer", "_chunks", "_size", "_buffer_full", "_paused_for_client", "_paused", "_ended", "_error",
                 "_waiter", "_sink", "_finished")

    def __init__(self, producer: Producer | None = None) -> None:
        self._producer = producer
        self._chunks: list[bytes] = []
        self._size = 0
        self._buffer_full = False  # paused because nobody read
        self._paused_for_client = False  # the client cannot take more
        self._paused = False
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._finished: asyncio.Future[BaseException | None] | None = None

    # --- the producer's side -----------------------------------------------------------

    def feed(self, chunk: bytes) -> None:
        if not chunk or self._ended:
            return
        sink = self._sink
        if sink is not None:
            finished = self._finished
            if finished is None or finished.done():
                return  # the consumer stopped listening (a timeout): the rest is dropped
            try:
                sink(chunk)
            except Exception as exc:  # a bug costs this answer, never the connection's callback
                self._ended = True
                if not finished.done():
                    finished.set_exception(exc)
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > BUFFER_LIMIT and not self._buffer_full:
            self._buffer_full = True
            self._flow()
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        """The body is complete (`error` None) or broke off."""
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._sink = None  # nothing more goes there; the consumer's closures hold their reader's timer
        self._wake()
        finished = self._finished
        if finished is not None and not finished.done():
            finished.set_result(error)

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def paused_for_client(self) -> bool:
        """Paused because the client cannot take more (see `hold`)."""
        return self._paused_for_client

    # --- the consumer's side -----------------------------------------------------------

    async def read_some(self) -> tuple[bytes, BaseException | None]:
        """The next bytes; (b"", None) at a clean end, (b"", error) if the body broke.

        Bytes that arrived before a break come first: output followed at once by a
        reset must not look like a reset before output (and be replayed)."""
        while not self._chunks and not self._ended:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._chunks:
            return self._take(), None
        return b"", self._error

    def pipe(self, sink: Callable[[bytes], None]) -> asyncio.Future[BaseException | None]:
        """From now on every chunk goes straight to `sink`, synchronously, as it arrives.

        The future resolves when the body ends: None if it completed, the error if
        it broke; it raises what `sink` raised.  Cancelling it stops the piping."""
        finished: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._finished = finished
        self._sink = sink
        if self._chunks:
            try:
                sink(self._take())  # what came before, first (the sink may stop() here)
            except Exception as exc:
                self._sink = None
                if not finished.done():
                    finished.set_exception(exc)
                return finished
        if self._ended:
            self._sink = None
            if not finished.done():
                finished.set_result(self._error)
        return finished

    def stop(self) -> None:
        """Stop pushing: the consumer has seen enough for now.  Later bytes are kept
        for `read_some` or another `pipe`; the current pipe's future resolves None."""
        self._sink = None
        finished = self._finished
        if finished is not None and not finished.done():
            finished.set_result(None)

    def hold(self, held: bool) -> None:
        """The client cannot take more (True) or can again (False): flow control."""
        self._paused_for_client = held
        self._flow()

    # --- inside ----------------------------------------------------------------------

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._size = 0
        if self._buffer_full:
            self._buffer_full = False
            self._flow()
        return data

    def _flow(self) -> None:
        paused = self._buffer_full or self._paused_for_client
        if paused != self._paused and self._producer is not None and not self._ended:
            self._paused = paused
            if paused:
                self._producer.pause_reading()
            else:
                self._producer.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
