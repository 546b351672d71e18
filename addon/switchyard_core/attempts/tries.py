"""Which upstreams one exchange asks, in which order, and what it tells the outage memory.

The order is the route's, less the upstreams an earlier request learnt are out
(attempts/outages.py: a stated delay, or unreachable); each skip is one log
line and part of the flow's story.  Attempts are tried along that order; a
hedge (`hedge_after_s`) asks the next upstream beside a slow one, so the
furthest upstream asked so far (the frontier) is where the order goes on from
when every attempt in flight has failed.  Pure: values in, values out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from .. import observe
from ..apis import Decision, ErrorInfo
from ..apis.errors import UNTRANSLATABLE
from ..retry import Plan, retry_after_s
from ..rules import Route, Upstream
from .outages import FailureKind, Outages, Visit
from .policy import UpstreamTry, first_try, next_try


class Tries:
    def __init__(self, route_name: str, upstreams: Sequence[Upstream], *, visit: Visit | None = None,
                 context: Mapping[str, object] | None = None) -> None:
        self.route = route_name
        self.visit = visit
        self.skipped: list[str] = []
        if visit is not None:
            # the memory's order, within the upstreams this exchange may ask (a WebSocket turn's are fewer)
            allowed = {upstream.name for upstream in upstreams}
            ordered = [upstream for upstream in visit.order.upstreams if upstream.name in allowed]
            for choice in visit.order.passed_over:
                if choice.upstream.name in allowed and choice.skip is not None:
                    self.skipped.append(f"{choice.upstream.name}: {choice.skip.describe()}")
                    observe.emit(logging.INFO, "switchyard.skipped", route=route_name, upstream=choice.upstream.name,
                                 why=choice.skip.why, left_s=round(choice.skip.left_s, 1), **(context or {}))
            upstreams = ordered or list(upstreams)
        self.upstreams: Sequence[Upstream] = tuple(upstreams)
        self.frontier: UpstreamTry | None = None  # the furthest upstream asked so far

    @classmethod
    def of(cls, outages: Outages | None, route: Route, upstreams: Sequence[Upstream], now: float, *,
           remember: bool, context: Mapping[str, object] | None = None) -> "Tries":
        """`remember`: this exchange may learn from and act on the memory (a WebSocket
        turn that may not be re-sent has one upstream, and nothing to choose)."""
        visit = outages.begin(route, now) if outages is not None and remember else None
        return cls(route.name, upstreams, visit=visit, context=context)

    def first(self) -> UpstreamTry:
        return first_try(self.upstreams)

    def opened(self, step: UpstreamTry) -> None:
        if self.frontier is None or step.index > self.frontier.index:
            self.frontier = step

    def after(self, step: UpstreamTry, plan: Plan) -> UpstreamTry | None:
        """What follows a failed attempt when nothing else is in flight: as the plan says,
        or, for an attempt behind the frontier (a hedge went further), past the frontier."""
        frontier = self.frontier
        if frontier is not None and step.index < frontier.index:
            if plan.action == "give_up":
                return None
            return next_try(self.upstreams, frontier, Plan("next_upstream"))
        return next_try(self.upstreams, step, plan)

    def hedge(self) -> UpstreamTry | None:
        """The upstream a hedge asks: the next one past the frontier, if there is one."""
        frontier = self.frontier
        if frontier is None or frontier.index + 1 >= len(self.upstreams):
            return None
        return next_try(self.upstreams, frontier, Plan("next_upstream"))

    # --- what the outage memory hears --------------------------------------------------

    def failed(self, upstream: str, info: ErrorInfo, decision: Decision, kind: FailureKind | None,
               headers: Mapping[str, str] | None, now: float) -> None:
        if self.visit is None:
            return
        if info.code == UNTRANSLATABLE:
            # not asked (the request cannot be carried into its API): nothing was learnt of it,
            # and its probe, if this request held it, goes to the next request
            self.visit.release(upstream)
            return
        stated = retry_after_s(headers)
        if stated is None:
            stated = info.retry_after_s
        kind = kind or FailureKind.of_answer(decision)
        if kind in (FailureKind.UNREACHABLE, FailureKind.NO_ANSWER):
            detail = info.message  # Switchyard's own words (no upstream said anything)
        else:  # what the upstream said, by status and code only: never its message
            detail = " ".join(str(part) for part in (info.status, info.code or info.type) if part)
        skip = self.visit.failed(upstream, kind, now, retry_after_s=stated, detail=detail or (info.event_type or ""))
        if skip is not None and not skip.probing:
            observe.emit(logging.INFO, "switchyard.remembered", route=self.route, upstream=upstream, why=skip.why,
                         skip_s=round(skip.left_s, 1))

    def succeeded(self, upstream: str, now: float) -> None:
        if self.visit is None:
            return
        ended = self.visit.succeeded(upstream, now)
        if ended is not None:
            observe.emit(logging.INFO, "switchyard.answers_again", route=self.route, upstream=upstream,
                         was=ended.why)

    def end(self) -> None:
        if self.visit is not None:
            self.visit.end()
