"""A routed flow in mitmweb while its answer streams: each attempt that fails is
shown as it ends, and the client's flow says who is answering once one commits.

The attempt core is sans-io and knows nothing of mitmweb: the exchange record
tells its listener each attempt's end (exchange.py, `AttemptListener`), inside
the core's step.  `LiveStory` is that listener for one flow.  It only notes the
record there, and shows what it noted a moment later, from the event loop: a
commit's display then never delays the first token, and an answer's tokens
never notify anyone (only failures and commits do).  It exists only where
someone sees flows (mitmweb, the console); mitmdump routes without one.

Display only: whatever goes wrong here is logged and costs nobody an answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mitmproxy import ctx, hooks, http

from .. import observe
from ..exchange import AttemptRecord, Exchange
from .attempt_flows import Clock, attempt_flow, shows_a_flow, what
from .flow_story import FlowView, annotate, restore

# how long after an attempt's end it is shown: long after a commit's first token has
# left (the display's work must not delay it), short for a person watching
SHOW_AFTER_S = 0.05


class LiveStory:
    """The `AttemptListener` of one routed flow's exchange (and, on a WebSocket, of
    each turn's): attempt flows added to mitmweb's view as they end, the client's
    flow re-aimed, commented and marked at a commit."""

    def __init__(self, flow: http.HTTPFlow, view: Any, display: FlowView | None) -> None:
        self.flow: http.HTTPFlow | None = flow
        # the flow's exchange (a WebSocket's: its handshake's, whose route and credentials its turns share)
        self.exchange: Exchange | None = None
        self.view = view  # mitmproxy's View addon
        self.display = display  # how the client's flow is shown (None: a WebSocket, which keeps its own URL)
        self._ended: list[AttemptRecord] = []  # noted, not yet shown
        self._shown: set[int] = set()  # id()s of the records whose flows were added (their exchange keeps them)
        self._committed: AttemptRecord | None = None
        self._turn_failed: list[AttemptRecord] = []  # a WebSocket turn's failed attempts, until it commits
        self._timer: asyncio.TimerHandle | None = None

    def follow(self, exchange: Exchange) -> None:
        """The exchange made with this listener (the relay makes it, and may start it, at once)."""
        self.exchange = exchange

    # --- the listener: inside the attempt core's step --------------------------------------

    def __call__(self, record: AttemptRecord) -> None:
        try:
            if self.flow is None or self.exchange is None:
                return
            if shows_a_flow(record):
                self._ended.append(record)
            elif record.outcome == "committed" and (record.attempt > 1 or self._moved()):
                self._committed = record
            else:
                return  # the first try answered, or a later WebSocket turn passed through: nothing new to say
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(SHOW_AFTER_S, self.show)
        except Exception as exc:  # noqa: BLE001 -- display only: never the exchange's failure
            self._failed(exc)

    # --- from the event loop -----------------------------------------------------------

    def show(self) -> None:
        """What was noted since the last time: attempt flows added, the client's flow updated."""
        self._timer = None
        flow, exchange = self.flow, self.exchange
        if flow is None or exchange is None:
            return
        try:
            ended, self._ended = self._ended, []
            committed, self._committed = self._committed, None
            self._add(ended)
            if self.display is None:
                self._describe_turn(flow, ended, committed)
            elif ended or committed is not None:
                if committed is not None:
                    restore(flow, exchange, self.display)  # the upstream that answers, instead of the first
                annotate(flow, exchange)
            ctx.master.addons.trigger(hooks.UpdateHook([flow]))  # as mitmproxy's own commands tell mitmweb
        except Exception as exc:  # noqa: BLE001 -- display only
            self._failed(exc)

    def finish(self, exchange: Exchange) -> None:
        """The flow has ended (`exchange`: the whole story, a WebSocket's every turn): what
        is still to show is shown now, and the listener lets go of the flow."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            pending = [*self._ended, *(r for r in exchange.attempts if shows_a_flow(r))]
            self._ended = []
            self._add(pending)
        except Exception as exc:  # noqa: BLE001 -- display only
            self._failed(exc)
        self.flow = None  # (records hold this listener: nothing of the flow stays reachable from them)
        self._committed = None
        self._turn_failed = []

    # --- inside -----------------------------------------------------------------------------

    def _moved(self) -> bool:
        """The first try answered, but not at the flow's own URL: an upstream was skipped (outages)."""
        return self.display is not None and self.exchange is not None and bool(self.exchange.skipped)

    def _add(self, records: list[AttemptRecord]) -> None:
        """Each record's flow, once."""
        flow, exchange = self.flow, self.exchange
        if flow is None or exchange is None:
            return
        clock = Clock()
        flows = []
        for record in records:
            if id(record) in self._shown:
                continue
            self._shown.add(id(record))
            try:
                flows.append(attempt_flow(flow, exchange, record, clock))
            except ValueError as exc:  # one attempt's odd value: the others are still shown
                self._failed(exc)
        if flows:
            self.view.add(flows)

    def _describe_turn(self, flow: http.HTTPFlow, ended: list[AttemptRecord], committed: AttemptRecord | None) -> None:
        """A WebSocket: the turn that failed before output and then committed is named
        in the flow's comment at once (the connection's story says the rest at its end)."""
        self._turn_failed.extend(r for r in ended if not r.continuation and r.outcome != "hedge_lost")
        if committed is None:
            return
        failed, self._turn_failed = self._turn_failed, []
        if not failed:
            return
        first = failed[0]
        turns = flow.metadata.get(observe.METADATA_KEY, {}).get("turns") or [{}]
        number = turns[-1].get("turn", "?") if isinstance(turns[-1], dict) else "?"
        answered = "answered on retry" if committed.upstream == first.upstream else f"{committed.upstream} answered"
        note = f"turn {number}: {first.upstream} failed before output ({what(first) or first.outcome}): {answered}"
        flow.comment = f"{flow.comment}; {note}" if flow.comment else note
        flow.marked = ":arrows_counterclockwise:"

    def _failed(self, exc: Exception) -> None:
        observe.emit(logging.WARNING, "switchyard.display_failed",
                     route=self.exchange.route.name if self.exchange is not None else None,
                     error=f"{type(exc).__name__}: {exc}")
