"""An attempt's read bound as one timer that costs nothing per read.

`asyncio.timeout()` around every upstream read schedules and cancels a timer
per frame, on the path every token takes.  An `AttemptTimer` keeps one timer
per quiet period instead: each read only moves a float forward (`touch`), and
the timer, when it fires early, re-arms itself for the new due time.  A fixed
bound (`by`) is not moved by reads at all.  Times are `time.monotonic()`, the
clock asyncio's loops keep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic


class AttemptTimer:
    __slots__ = ("_loop", "_handle", "_by", "_span", "_since", "_due", "_excused")

    def __init__(self, due: Callable[[], None], excused: Callable[[], bool] | None = None) -> None:
        """`due`: called once the bound has passed; `excused`: while it says True, quiet
        is not silence (the upstream was paused because the client is not keeping up)."""
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._by: float | None = None
        self._span: float | None = None
        self._since = 0.0
        self._due = due
        self._excused = excused

    def set(self, *, by: float | None = None, quiet: float | None = None) -> None:
        """From now on: reads must go on until `by` (fixed), or no silence longer than
        `quiet` (each read starts it again); neither: no bound."""
        self.cancel()
        self._by, self._span = by, quiet
        if quiet is not None:
            self._since = monotonic()
            self._handle = self._loop.call_at(self._since + quiet, self._fire)
        elif by is not None:
            self._handle = self._loop.call_at(by, self._fire)

    def touch(self) -> None:
        """Something arrived: a quiet bound starts again from now."""
        self._since = monotonic()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        now = self._loop.time()
        if self._span is not None:
            due = self._since + self._span
            if now < due:
                self._handle = self._loop.call_at(due, self._fire)  # moved on since: re-arm
                return
            if self._excused is not None and self._excused():
                self._since = now  # the quiet period starts again once the client catches up
                self._handle = self._loop.call_at(now + self._span, self._fire)
                return
        elif self._by is None or now < self._by:
            if self._by is not None:
                self._handle = self._loop.call_at(self._by, self._fire)
            return
        self._due()


def loop_time(deadline: float | None) -> float | None:
    """A time.monotonic() deadline on the event loop's clock, for asyncio.timeout_at."""
    if deadline is None:
        return None
    return asyncio.get_running_loop().time() + (deadline - monotonic())
