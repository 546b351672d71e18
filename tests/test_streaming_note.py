"""mitmproxy's "Streaming response from …" line for a relayed flow: logged one
loop pass late, unchanged, and only for the client it was expected for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from switchyard_core.addons.streaming_note import LOGGER, StreamingNoteDeferral

CLIENT = ("127.0.0.1", 50000)
OTHER = ("127.0.0.1", 50001)
Seen = list[tuple[str, object]]  # (message, client) as logged


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: Seen = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), getattr(record, "client", None)))


@pytest.fixture
def lines() -> Iterator[tuple[StreamingNoteDeferral, Seen]]:
    logger = logging.getLogger(LOGGER)
    handler = Lines()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    notes = StreamingNoteDeferral()
    notes.install()
    try:
        yield notes, handler.lines
    finally:
        notes.uninstall()
        logger.removeHandler(handler)
        logger.setLevel(level)


def log(message: str, client: object) -> None:
    logging.getLogger(LOGGER).info(message, extra={"client": client})


async def test_the_expected_clients_note_comes_after_what_was_already_queued(lines: tuple[StreamingNoteDeferral, Seen]) -> None:
    notes, seen = lines
    notes.expect(CLIENT)
    order: list[str] = []
    log("Streaming response from api.openai.com.", CLIENT)
    asyncio.get_running_loop().call_soon(lambda: order.append(f"queued, {len(seen)} lines"))
    assert seen == []
    for _ in range(3):
        await asyncio.sleep(0)
    assert order == ["queued, 0 lines"]  # mitmproxy's queued work (the first token) went first
    assert seen == [("Streaming response from api.openai.com.", CLIENT)]


async def test_other_lines_and_other_clients_are_logged_at_once(lines: tuple[StreamingNoteDeferral, Seen]) -> None:
    notes, seen = lines
    notes.expect(CLIENT)
    log("Streaming response from api.openai.com.", OTHER)
    log("server connect 127.0.0.1:443", CLIENT)
    assert seen == [("Streaming response from api.openai.com.", OTHER), ("server connect 127.0.0.1:443", CLIENT)]


async def test_only_the_next_note_is_deferred_and_a_forgotten_client_none(lines: tuple[StreamingNoteDeferral, Seen]) -> None:
    notes, seen = lines
    notes.expect(CLIENT)
    log("Streaming response from a.", CLIENT)
    log("Streaming response from b.", CLIENT)
    assert seen == [("Streaming response from b.", CLIENT)]
    notes.expect(OTHER)
    notes.forget(OTHER)
    log("Streaming response from c.", OTHER)
    assert seen[-1] == ("Streaming response from c.", OTHER)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [line for line, _ in seen] == ["Streaming response from b.", "Streaming response from c.",
                                          "Streaming response from a."]
