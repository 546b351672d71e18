"""A read deadline that costs nothing per read.

`asyncio.timeout()` around every upstream read schedules and cancels a timer
per frame: measurable on the hot path.  `Silence` keeps one timer per quiet
period instead: each read only moves a float forward (`touch` is one clock
read), and the timer, when it fires early, re-arms itself for the new due time.
Times are `time.monotonic()`, the clock asyncio's loops keep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Any, TypeVar

T = TypeVar("T")


class Silence:
    def __init__(self, excused: Callable[[], bool] | None = None) -> None:
        """`excused`: while it says True, quiet is not silence (the upstream was
        paused because the client is not keeping up: that is not its fault)."""
        self._excused = excused
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._handle: asyncio.TimerHandle | None = None
        self._span: float | None = None  # the bound; None: none
        self._since = 0.0  # when the current quiet period began
        self._waiting = False
        self._fired = False
        self._awaited: asyncio.Future[Any] | None = None

    def expect_by(self, seconds: float | None) -> None:
        """The next wait must end within `seconds` from now (None: no bound)."""
        self._span = seconds
        if seconds is None:
            return
        self._since = now = monotonic()
        due = now + seconds
        if self._handle is None or self._handle.when() > due:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(due, self._fire)

    def touch(self) -> None:
        """Something arrived: the same bound starts again from now."""
        self._since = monotonic()

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """Await, raising TimeoutError if the due time passes first.

        An answer that came in the same pass of the loop as the due time wins:
        a stream that ended is not a stream that went silent."""
        self._waiting = True
        self._awaited = awaitable if isinstance(awaitable, asyncio.Future) else None
        try:
            result = await awaitable
            if self._fired:  # the awaited call swallowed our cancel: take it back
                self._fired = False
                self._task.uncancel()
            return result
        except asyncio.CancelledError:
            if self._fired:
                self._fired = False
                if self._task.uncancel() == 0:
                    awaited = self._awaited
                    if awaited is not None and awaited.done() and not awaited.cancelled():
                        return awaited.result()
                    raise TimeoutError from None
            raise
        finally:
            self._waiting = False
            self._awaited = None

    def _fire(self) -> None:
        self._handle = None
        if self._span is None:
            return
        due = self._since + self._span
        now = self._loop.time()
        if now < due:
            self._handle = self._loop.call_at(due, self._fire)  # moved on since: re-arm
        elif self._excused is not None and self._excused():
            self._since = now  # the quiet period starts again once the client catches up
            self._handle = self._loop.call_at(now + self._span, self._fire)
        elif self._waiting and not (self._awaited is not None and self._awaited.done()):
            self._fired = True
            self._task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
