"""A read deadline that costs nothing per read.

`asyncio.timeout()` around every upstream read schedules and cancels a timer
per frame: measurable on the hot path.  `Silence` keeps one timer per quiet
period instead: each read only moves a float forward, and the timer, when it
fires early, re-arms itself for the new due time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Silence:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._handle: asyncio.TimerHandle | None = None
        self._due: float | None = None
        self._waiting = False
        self._fired = False

    def expect_by(self, seconds: float | None) -> None:
        """The next wait must end within `seconds` from now (None: no bound)."""
        if seconds is None:
            self._due = None
            return
        due = self._loop.time() + seconds
        self._due = due
        if self._handle is None or self._handle.when() > due:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(due, self._fire)

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """Await, raising TimeoutError if the due time passes first."""
        self._waiting = True
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
                    raise TimeoutError from None
            raise
        finally:
            self._waiting = False

    def _fire(self) -> None:
        self._handle = None
        due = self._due
        if due is None:
            return
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._fire)  # moved on since: re-arm
        elif self._waiting:
            self._fired = True
            self._task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
