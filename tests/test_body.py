"""Body (switchyard_core/body.py) on its own: no network, a recording producer.

What is pinned: bytes that arrived before a break are read before the break;
`pipe` hands over buffered bytes first and reports the end (or the sink's
exception) through its future; and the producer is paused and resumed exactly
when the buffer fills / empties or the consumer holds / releases, never twice.
"""

from __future__ import annotations

import asyncio

import pytest

from switchyard_core.upstreams.body import BUFFER_LIMIT, Body


class Producer:
    """Records pause_reading / resume_reading calls, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


async def read_some(body: Body) -> tuple[bytes, BaseException | None]:
    async with asyncio.timeout(2):
        return await body.read_some()


# ---------------------------------------------------------------------------
# read_some


async def test_data_before_error() -> None:
    body = Body()
    error = ConnectionResetError("cut")
    body.feed(b"abc")
    body.feed(b"def")
    body.end(error)
    assert await read_some(body) == (b"abcdef", None)
    assert await read_some(body) == (b"", error)
    assert await read_some(body) == (b"", error)


async def test_clean_end_and_nothing_after_it() -> None:
    body = Body()
    body.feed(b"x")
    body.end()
    body.feed(b"late")  # ignored
    body.end(RuntimeError("late"))  # ignored
    assert body.ended
    assert await read_some(body) == (b"x", None)
    assert await read_some(body) == (b"", None)


async def test_read_some_waits_for_the_next_bytes() -> None:
    body = Body()
    reader = asyncio.ensure_future(read_some(body))
    await asyncio.sleep(0)
    assert not reader.done()
    body.feed(b"later")
    assert await reader == (b"later", None)
    reader = asyncio.ensure_future(read_some(body))
    await asyncio.sleep(0)
    body.end()
    assert await reader == (b"", None)


async def test_empty_feed_is_not_an_end() -> None:
    body = Body()
    body.feed(b"")
    reader = asyncio.ensure_future(read_some(body))
    await asyncio.sleep(0)
    assert not reader.done()
    body.feed(b"real")
    assert await reader == (b"real", None)


# ---------------------------------------------------------------------------
# pipe


async def test_pipe_flushes_buffered_bytes_first_then_passes_each_feed() -> None:
    body = Body()
    body.feed(b"one ")
    body.feed(b"two ")
    received: list[bytes] = []
    finished = body.pipe(received.append)
    assert received == [b"one two "]  # synchronously, before anything newer
    body.feed(b"three")
    assert received == [b"one two ", b"three"]
    assert not finished.done()
    body.end()
    assert finished.done() and finished.result() is None


async def test_pipe_after_a_break_reports_it_after_the_bytes() -> None:
    body = Body()
    error = ConnectionResetError("cut")
    body.feed(b"partial")
    body.end(error)
    received: list[bytes] = []
    finished = body.pipe(received.append)
    assert received == [b"partial"]
    assert finished.done() and finished.result() is error


async def test_pipe_sink_error_on_flush() -> None:
    body = Body()
    body.feed(b"buffered")

    def sink(data: bytes) -> None:
        raise ValueError("no room")

    finished = body.pipe(sink)
    with pytest.raises(ValueError, match="no room"):
        await finished


async def test_pipe_sink_error_on_feed_stops_the_piping() -> None:
    body = Body()
    calls: list[bytes] = []

    def sink(data: bytes) -> None:
        calls.append(data)
        raise ValueError("no room")

    finished = body.pipe(sink)
    body.feed(b"first")
    body.feed(b"second")  # dropped: the sink failed already
    body.end()
    assert calls == [b"first"]
    with pytest.raises(ValueError, match="no room"):
        await finished


async def test_pipe_cancelled_drops_the_rest() -> None:
    body = Body()
    received: list[bytes] = []
    finished = body.pipe(received.append)
    finished.cancel()
    body.feed(b"unwanted")
    body.end()
    assert received == []


# ---------------------------------------------------------------------------
# flow control


def test_hold_pauses_and_release_resumes_once_each() -> None:
    producer = Producer()
    body = Body(producer)
    body.hold(True)
    body.hold(True)
    assert producer.calls == ["pause"]
    body.hold(False)
    body.hold(False)
    assert producer.calls == ["pause", "resume"]


async def test_a_full_buffer_pauses_until_read() -> None:
    producer = Producer()
    body = Body(producer)
    body.feed(b"x" * BUFFER_LIMIT)
    assert producer.calls == []  # at the limit, not over it
    body.feed(b"y")
    body.feed(b"z")
    assert producer.calls == ["pause"]
    assert await read_some(body) == (b"x" * BUFFER_LIMIT + b"yz", None)
    assert producer.calls == ["pause", "resume"]


async def test_a_held_body_stays_paused_when_its_buffer_is_read() -> None:
    producer = Producer()
    body = Body(producer)
    body.feed(b"x" * (BUFFER_LIMIT + 1))
    body.hold(True)
    assert producer.calls == ["pause"]
    await read_some(body)
    assert producer.calls == ["pause"]  # the buffer emptied, but the consumer still holds
    body.hold(False)
    assert producer.calls == ["pause", "resume"]


async def test_a_released_hold_stays_paused_while_the_buffer_is_full() -> None:
    producer = Producer()
    body = Body(producer)
    body.hold(True)
    body.feed(b"x" * (BUFFER_LIMIT + 1))
    body.hold(False)
    assert producer.calls == ["pause"]  # still nobody read the buffer
    await read_some(body)
    assert producer.calls == ["pause", "resume"]


async def test_pipe_empties_a_full_buffer_and_resumes() -> None:
    producer = Producer()
    body = Body(producer)
    body.feed(b"x" * (BUFFER_LIMIT + 1))
    received: list[bytes] = []
    body.pipe(received.append)
    assert producer.calls == ["pause", "resume"]
    assert b"".join(received) == b"x" * (BUFFER_LIMIT + 1)


def test_no_flow_control_after_the_end() -> None:
    producer = Producer()
    body = Body(producer)
    body.end()
    body.hold(True)
    body.hold(False)
    assert producer.calls == []
