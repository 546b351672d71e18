"""The relay's cheap read deadline: one timer per quiet period, same semantics as a timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from switchyard_core.attempts.read_deadline import Silence


async def test_a_wait_that_ends_in_time_returns_its_value() -> None:
    silence = Silence()
    silence.expect_by(1.0)
    assert await silence.wait(asyncio.sleep(0.01, result="frame")) == "frame"
    silence.close()


async def test_a_wait_past_the_due_time_raises_timeout() -> None:
    silence = Silence()
    silence.expect_by(0.05)
    with pytest.raises(TimeoutError):
        await silence.wait(asyncio.sleep(5))
    silence.close()


async def test_each_read_moves_the_due_time_without_a_new_timer() -> None:
    silence = Silence()
    for _ in range(5):  # 5 x 0.04 s of reads, each within the 0.06 s bound
        silence.expect_by(0.06)
        await silence.wait(asyncio.sleep(0.04))
    silence.expect_by(0.06)
    with pytest.raises(TimeoutError):
        await silence.wait(asyncio.sleep(5))
    silence.close()


async def test_an_outside_cancellation_is_not_mistaken_for_a_timeout() -> None:
    async def reader() -> None:
        silence = Silence()
        silence.expect_by(10)
        try:
            await silence.wait(asyncio.sleep(5))
        finally:
            silence.close()

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_no_bound_waits_as_long_as_it_takes() -> None:
    silence = Silence()
    silence.expect_by(None)
    assert await silence.wait(asyncio.sleep(0.05, result=1)) == 1
    silence.close()


async def test_an_end_that_comes_in_the_same_pass_as_the_due_time_wins() -> None:
    """A busy loop runs the end of a stream and the deadline in one pass: the
    stream ended, it did not go silent."""
    loop = asyncio.get_running_loop()
    silence = Silence()
    silence.expect_by(0.05)
    ended: asyncio.Future[str] = loop.create_future()
    loop.call_later(0.049, ended.set_result, "ended")
    loop.call_later(0.01, time.sleep, 0.1)  # the loop is busy past both
    assert await silence.wait(ended) == "ended"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    silence.close()


async def test_quiet_while_excused_is_not_silence() -> None:
    held = [True]
    silence = Silence(excused=lambda: held[0])
    silence.expect_by(0.03)
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, held.__setitem__, 0, False)  # the client catches up after several bounds
    with pytest.raises(TimeoutError):
        await silence.wait(asyncio.sleep(5))
    assert held == [False]  # it fired only once the excuse had ended
    silence.close()
