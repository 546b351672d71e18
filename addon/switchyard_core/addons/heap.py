"""The garbage collector, kept off the first token's path.

CPython's cyclic collector walks every tracked object of the generations it
collects, and a full collection walks them all while the event loop stands
still: every request in flight waits for it, before its first token as much
as after.  Two things keep those pauses short and out of the way:

- **The start-up heap frozen.**  mitmproxy's process holds about a hundred
  thousand objects from start-up alone (its own modules and addons, and with
  Switchyard pydantic's schemas, httptools, the rules).  Frozen once, after
  start-up, they are never walked again, and a full collection costs only what
  is alive in the flows.  (An object frozen here that later became cyclic
  garbage would never be collected: that is why it is done once, when mitmproxy
  has just started and holds no flows.)

- **Full collections where no flow waits for its head.**  Streamed flows move
  their objects into the oldest generation as they outlive younger collections,
  so under a burst CPython's own schedule brings a full collection along in the
  middle of it (docs/benchmarks.md, "Seventh pass").  `QuietCollections` lets
  CPython wait a few times longer for one, and runs it itself as soon as it is
  due and no flow in the process is between its request and its answer's head
  (for a held, streamed answer: its first content): the pause then falls
  between tokens of answers already under way, where a client does not wait
  on it.  Under load that never leaves such a moment, CPython's own schedule
  (`DEFERRAL` times longer) still collects.

Exchanges themselves leave no cycles behind (tests/test_cyclic_garbage.py), so
what a full collection finds is mitmproxy's own, and what is alive.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from typing import Protocol

from mitmproxy import ctx, http

from .. import observe

DEFERRAL = 4  # how many times longer than its own schedule CPython waits for a full collection
WAIT_LIMIT_S = 600.0  # a flow counted as waiting for longer is not waited for (its end went unseen)

_frozen = False  # per process: a reloaded script imports this package's modules once
_deferring: "QuietCollections | None" = None  # the one that moved CPython's schedule, per process


def freeze_startup_heap(flows_held: int) -> bool:
    """Collect what start-up left behind, then freeze the rest; once per process,
    and only while no flows are held (mitmweb's list, a script loaded late)."""
    global _frozen
    if _frozen or flows_held or not gc.isenabled():
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True


class Collector(Protocol):
    """What is used of the `gc` module (a test gives its own)."""

    def isenabled(self) -> bool: ...

    def get_threshold(self) -> tuple[int, int, int]: ...

    def set_threshold(self, threshold0: int, threshold1: int = ..., threshold2: int = ..., /) -> None: ...

    def get_count(self) -> tuple[int, int, int]: ...

    def collect(self, generation: int = 2) -> int: ...


def unusable(collector: Collector) -> str | None:
    """Why full collections cannot be moved here, if they cannot."""
    if sys.version_info >= (3, 14):
        return "CPython 3.14's incremental collector schedules its own"  # (thresholds mean other things)
    if not collector.isenabled():
        return "the garbage collector is disabled"
    if collector.get_threshold()[2] <= 0:
        return "full collections are switched off"
    return None


class QuietCollections:
    """Freezes the start-up heap; then runs each full collection once it is due and
    no flow waits for its head (see above)."""

    def __init__(self, collector: Collector = gc) -> None:
        self.collector = collector
        self.collections = 0  # run here, between heads
        self._waiting: dict[str, float] = {}  # flow id -> when its request came, oldest first
        self._due_after: int | None = None  # CPython's own threshold for a full collection, while deferred
        self._scheduled = False

    def running(self) -> None:
        view = ctx.master.addons.get("view")  # mitmweb's and the console's flow list; mitmdump has none
        frozen = freeze_startup_heap(view.store_count() if view is not None else 0)
        why = self.defer()
        observe.emit(logging.DEBUG if why is None else logging.INFO, "switchyard.heap",
                     startup_heap="frozen" if frozen else "as it was",
                     quiet_collections="active" if why is None else f"inactive: {why}")

    def done(self) -> None:
        self.restore()

    def defer(self) -> str | None:
        """Let CPython wait longer for full collections; None once done, else why not."""
        global _deferring
        if self._due_after is not None:
            return None
        if _deferring is not None:  # (two Switchyard scripts loaded at once: deferred once, not twice)
            return "another Switchyard script's QuietCollections moves them"
        why = unusable(self.collector)
        if why is None:
            first, second, third = self.collector.get_threshold()
            self.collector.set_threshold(first, second, third * DEFERRAL)
            self._due_after = third
            _deferring = self
        return why

    def restore(self) -> None:
        """CPython's own schedule again, unless something changed it since."""
        global _deferring
        due_after = self._due_after
        if due_after is not None:
            self._due_after = None
            _deferring = None
            first, second, third = self.collector.get_threshold()
            if third == due_after * DEFERRAL:
                self.collector.set_threshold(first, second, due_after)
        self._waiting.clear()

    # --- hooks ------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self._due_after is not None and flow.live:
            self._waiting[flow.id] = time.monotonic()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._head_went(flow.id)

    def response(self, flow: http.HTTPFlow) -> None:  # answered without a `responseheaders` (by an addon)
        self._head_went(flow.id)

    def error(self, flow: http.HTTPFlow) -> None:
        self._head_went(flow.id)

    # --- inside -----------------------------------------------------------------------

    def _head_went(self, flow_id: str) -> None:
        """This flow waits no more; if none does and a full collection is due, it runs
        in the loop's next pass, after what this one writes."""
        waiting = self._waiting
        if waiting.pop(flow_id, None) is None or self._scheduled or not self._quiet():
            return
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._collect)

    def _quiet(self) -> bool:
        waiting = self._waiting
        stale = time.monotonic() - WAIT_LIMIT_S
        while waiting:  # oldest first: it stops at the first that still counts
            flow_id, since = next(iter(waiting.items()))
            if since > stale:
                return False
            del waiting[flow_id]
        return self._due()

    def _due(self) -> bool:
        # as CPython decides it: more collections of the middle generation than its threshold
        return self._due_after is not None and self.collector.get_count()[2] > self._due_after

    def _collect(self) -> None:
        self._scheduled = False
        if not self._waiting and self._due():  # (a request may have come meanwhile)
            self.collector.collect(2)
            self.collections += 1
