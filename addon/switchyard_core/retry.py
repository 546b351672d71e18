"""What follows a failed attempt: pure policy over budgets, backoff and Retry-After."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from .apis import Decision
from .delays import delay_in_text, stated_delay_s


PlanAction = Literal["retry", "next_upstream", "give_up"]
"""After a failure: the same upstream again (after `delay_s`), the next one, or none."""


@dataclass(frozen=True, slots=True)
class Plan:
    action: PlanAction
    delay_s: float = 0.0


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """`retry-after-ms`, then `retry-after` (seconds or an HTTP date), as the SDKs read them;
    a value that is no delay is ignored, a huge one cut (delays.py)."""
    if not headers:
        return None
    from_ms = delay_in_text(headers.get("retry-after-ms"), scale=0.001)
    if from_ms is not None:
        return from_ms
    raw = headers.get("retry-after")
    if not raw:
        return None
    seconds = delay_in_text(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
        return stated_delay_s(max(0.0, when.timestamp() - time.time()))
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def plan_after_failure(
    decision: Decision,
    *,
    tries_used: int,
    budget: int,
    has_next: bool,
    timed_out: bool,
    retry_after: float | None,
    backoff_ms: int,
    max_backoff_ms: int,
    jitter: Callable[[], float] = random.random,
) -> Plan:
    """The same upstream within budget (with backoff), then the next, else give up.

    A `Retry-After` longer than `max_backoff_ms` moves on instead of waiting; a
    timeout moves on at once when there is somewhere to go, because retrying a
    silent provider only multiplies the wait.
    """
    move_on = Plan("next_upstream") if has_next else Plan("give_up")
    if decision is Decision.FATAL:
        return Plan("give_up")
    if decision is Decision.NEXT_UPSTREAM:
        return move_on
    if timed_out and has_next:
        return move_on
    if tries_used > budget:
        return move_on
    retry_after = stated_delay_s(retry_after)  # whoever read it: never NaN, never negative
    if retry_after is not None:
        if retry_after * 1000 > max_backoff_ms:
            return move_on
        return Plan("retry", retry_after)
    base_ms = min(max_backoff_ms, backoff_ms * 2 ** (tries_used - 1))
    return Plan("retry", base_ms * (1 - 0.25 * jitter()) / 1000)
