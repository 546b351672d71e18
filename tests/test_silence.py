"""The relay's cheap read deadline: one timer per quiet period, same semantics as a timeout."""

from __future__ import annotations

import asyncio

import pytest

from switchyard_core.relay.silence import Silence


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
