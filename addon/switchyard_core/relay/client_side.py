"""The client's side of an exchange: what is written back, and how.

The attempt loop decides *what* the client gets; this module owns *how*:
`x-switchyard-*` headers on every response, the pre-answer keepalive (headers
and SSE comments while no upstream has answered), the comment that names the
winner when headers left early, and in-band error events that never run into a
frame the upstream left open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ..protocols import Api

SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
KEEPALIVE_FRAME = b": switchyard keepalive\n\n"
FRAME_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")


class ClientSink(Protocol):
    """Where the client's response goes (the relay's HTTP response)."""

    @property
    def headers_sent(self) -> bool: ...

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...

    def abort(self) -> None: ...


class ClientStream:
    def __init__(self, sink: ClientSink, api: Api) -> None:
        self.sink = sink
        self.api = api
        self.attempts = 0  # shown in x-switchyard-attempts
        self._tail = b""  # the last bytes written
        self._keepalive: asyncio.Task[None] | None = None
        self._keepalive_due: asyncio.TimerHandle | None = None

    @property
    def headers_sent(self) -> bool:
        return self.sink.headers_sent

    def _ours(self, headers: list[tuple[str, str]], upstream: str) -> list[tuple[str, str]]:
        return [*headers, ("x-switchyard-upstream", upstream), ("x-switchyard-attempts", str(self.attempts))]

    async def start(self, status: int, headers: list[tuple[str, str]], upstream: str) -> None:
        await self.sink.start(status, self._ours(headers, upstream))

    async def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes, upstream: str) -> None:
        await self.sink.send_whole(status, self._ours(headers, upstream), body)

    async def send_error(self, status: int, message: str, code: str, upstream: str) -> None:
        """A JSON error in the API's shape, as the whole answer."""
        body = self.api.error_body(message, code)
        await self.send_whole(status, [("Content-Type", "application/json")], body, upstream)

    async def write(self, data: bytes) -> None:
        await self.sink.write(data)
        self._tail = data[-4:]

    def cut(self) -> None:
        """A body forwarded as sent broke: end it so that the client sees a cut."""
        self.sink.abort()

    async def announce(self, upstream: str) -> None:
        """Headers left before the winner was known: name it in a comment."""
        await self.write(f": switchyard upstream={upstream} attempts={self.attempts}\n\n".encode())

    async def error_event(self, message: str, code: str) -> None:
        """An in-band error in the API's shape, after whatever was written."""
        frame = self.api.error_event(message, code)
        if self._tail and not self._tail.endswith(FRAME_ENDS):
            frame = b"\n\n" + frame  # never run into a frame the upstream left open
        await self.write(frame)

    # --- the pre-answer keepalive ----------------------------------------------------

    def keep_alive(self, interval_s: float) -> None:
        """Send headers and a comment every `interval_s` until `stop_keepalive()`.

        A timer first, not a task: most answers start long before it is due."""
        self._keepalive_due = asyncio.get_running_loop().call_later(interval_s, self._start_keepalive, interval_s)

    def _start_keepalive(self, interval_s: float) -> None:
        self._keepalive_due = None
        self._keepalive = asyncio.create_task(self._send_keepalives(interval_s))

    async def _send_keepalives(self, interval_s: float) -> None:
        while True:
            if not self.sink.headers_sent:
                pending = [("x-switchyard-upstream", "pending"), ("x-switchyard-attempts", "pending")]
                await self.sink.start(200, [*SSE_HEADERS, *pending])
            await self.write(KEEPALIVE_FRAME)
            await asyncio.sleep(interval_s)

    async def stop_keepalive(self) -> None:
        """Before anything else is written: keepalive writes must never interleave."""
        if self._keepalive_due is not None:
            self._keepalive_due.cancel()
            self._keepalive_due = None
        task, self._keepalive = self._keepalive, None
        if task is None:
            return
        if task.done():
            if not task.cancelled() and task.exception() is not None:
                logging.getLogger("switchyard").debug("switchyard.keepalive_failed %r", task.exception())
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves, not just the keepalive
        except Exception:  # a write failed: the client is gone, the handler will be cancelled
            pass
