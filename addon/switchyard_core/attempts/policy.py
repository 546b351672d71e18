"""The attempt core's decisions on failures, as values: which upstream is tried
next, and what a failure before output leads to.  `machine.py` acts on these."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..apis import Decision, ErrorInfo, ErrorPolicy
from ..exchange import AttemptOutcome
from ..retry import Plan, plan_after_failure, retry_after_s
from ..rules import AttemptSettings, Upstream


@dataclass(frozen=True, slots=True)
class UpstreamTry:
    """An attempt to come: which upstream, its how-manyth try, and whether another upstream follows."""

    index: int
    upstream: Upstream
    tries: int
    has_next: bool


def first_try(upstreams: Sequence[Upstream]) -> UpstreamTry:
    return UpstreamTry(0, upstreams[0], 1, len(upstreams) > 1)


def next_try(upstreams: Sequence[Upstream], current: UpstreamTry, plan: Plan) -> UpstreamTry | None:
    """After a failed attempt: the same upstream again, the next one, or none (the exchange is over)."""
    if plan.action == "retry":
        return UpstreamTry(current.index, current.upstream, current.tries + 1, current.has_next)
    if plan.action == "next_upstream" and current.index + 1 < len(upstreams):
        index = current.index + 1
        return UpstreamTry(index, upstreams[index], 1, index + 1 < len(upstreams))
    return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a failure before output is worth, and what follows it."""

    decision: Decision
    plan: Plan

    @property
    def outcome(self) -> AttemptOutcome:
        return "fatal" if self.decision is Decision.FATAL else self.plan.action


def judge(info: ErrorInfo, turn: UpstreamTry, settings: AttemptSettings, policy: ErrorPolicy, *, timed_out: bool = False,
          headers: Mapping[str, str] | None = None, jitter: Callable[[], float] = random.random) -> Verdict:
    """The error policy's decision on `info` (and the answer's `x-should-retry`), then the plan
    within the upstream's budget, its backoff and the answer's Retry-After (or the delay
    its body asks for, as Gemini's RetryInfo does)."""
    decision = policy.decide(info, headers.get("x-should-retry") if headers else None)
    plan = plan_after_failure(
        decision,
        tries_used=turn.tries,
        budget=turn.upstream.retries,
        has_next=turn.has_next,
        timed_out=timed_out,
        retry_after=_first_set(retry_after_s(headers), info.retry_after_s),
        backoff_ms=settings.backoff_ms,
        max_backoff_ms=settings.max_backoff_ms,
        jitter=jitter,
    )
    return Verdict(decision, plan)


def _first_set(header: float | None, body: float | None) -> float | None:
    """A Retry-After header wins over a delay the body asks for (Gemini's RetryInfo)."""
    return header if header is not None else body
