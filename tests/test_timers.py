"""An attempt's read bound: one timer per quiet period, a fixed bound no read moves,
and quiet while the client holds the answer back is no silence."""

from __future__ import annotations

import asyncio

from switchyard_core.attempts.timers import AttemptTimer


async def _due_within(event: asyncio.Event, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def test_a_quiet_bound_is_due_once_nothing_arrived_for_its_span() -> None:
    event = asyncio.Event()
    timer = AttemptTimer(event.set)
    timer.set(quiet=0.05)
    assert await _due_within(event, 2.0)


async def test_each_read_starts_a_quiet_bound_again() -> None:
    event = asyncio.Event()
    timer = AttemptTimer(event.set)
    timer.set(quiet=0.08)
    for _ in range(5):  # reads every 0.03 s: never 0.08 s of quiet
        await asyncio.sleep(0.03)
        timer.touch()
        assert not event.is_set()
    assert await _due_within(event, 2.0)


async def test_a_fixed_bound_is_not_moved_by_reads() -> None:
    event = asyncio.Event()
    timer = AttemptTimer(event.set)
    loop = asyncio.get_running_loop()
    timer.set(by=loop.time() + 0.1)
    for _ in range(10):  # an upstream sending `: ping` forever must not hold the request
        timer.touch()
        await asyncio.sleep(0.02)
        if event.is_set():
            break
    assert await _due_within(event, 2.0)


async def test_quiet_while_the_client_holds_the_answer_back_is_no_silence() -> None:
    event = asyncio.Event()
    held = [True]
    timer = AttemptTimer(event.set, excused=lambda: held[0])
    timer.set(quiet=0.03)
    assert not await _due_within(event, 0.2)  # excused every time it came due
    held[0] = False
    assert await _due_within(event, 2.0)


async def test_a_cancelled_or_replaced_bound_never_fires() -> None:
    event = asyncio.Event()
    timer = AttemptTimer(event.set)
    timer.set(quiet=0.03)
    timer.cancel()
    assert not await _due_within(event, 0.15)
    timer.set(quiet=0.03)
    timer.set(quiet=None)  # no bound
    assert not await _due_within(event, 0.15)
