"""A finished exchange leaves nothing for the cyclic garbage collector.

Whatever an exchange built is freed the moment it ends, by reference counting,
so long as none of it points back at itself.  What does, lives on as garbage
until a full collection walks it, and a full collection stops the event loop
for as long as it walks: every request in flight waits, before its first token
as much as after (docs/benchmarks.md, "Seventh pass").  These run exchanges with
the collector off and then ask it what it would have found of Switchyard's.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from switchyard_core.attempts.commands import Finished
from switchyard_core.relay import Relay
from switchyard_core.upstreams.client import UpstreamClient
from tests.support import wire
from tests.support.core_playbook import Play, only, upstream
from tests.support.scripted_server import LAST_CHUNK, Server, answering, chunk, chunked_head
from tests.test_relay import DONE, ask, content, read_answer, register

HELLO = [wire.CHAT_ROLE, wire.chat_chunk({"content": "Hello"})]
REST = [wire.chat_chunk({"content": " world"}), wire.chat_chunk({}, "stop"), wire.CHAT_DONE]


@contextmanager
def collector_off() -> Iterator[list[str]]:
    """The collector off while the body runs; afterwards, the types of Switchyard's
    objects it finds unreachable (what only it could have freed)."""
    found: list[str] = []
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found += sorted({type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage
                         if type(o).__module__.startswith("switchyard_core")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_continued_exchange_is_freed_as_soon_as_it_is_let_go() -> None:
    """The continuation's effort points back at its exchange's machine; once the
    exchange is finished, it lets go."""
    with collector_off():
        play = Play(upstream("a"), upstream("b", prefill=True), continue_after_cut=("prefill",))
        play.start()
        play.opened(1)
        play.data(1, *HELLO)
        play.at(1).ended(1, ConnectionResetError("reset"))
        play.opened(2)
        play.data(2, wire.chat_chunk({"role": "assistant", "content": ""}), *REST)
        assert only(play.ended(2), Finished)
        assert play.exchange.outcome == "continued"
        machine = weakref.ref(play.machine)
        del play
        assert machine() is None


async def _two_answers(answer: bytes) -> None:
    relay = Relay(UpstreamClient())
    await relay.start()
    try:
        async with Server(answering(answer, requests=2)) as up:
            for _ in range(2):
                ticket = register(relay, up)
                reader, writer = await ask(relay, ticket.token)
                head, body = await read_answer(reader)
                writer.close()
                await writer.wait_closed()
                assert (head.split(b"\r\n")[0], body) == (b"HTTP/1.1 200 OK", content("hi") + DONE)
                del ticket
            async with asyncio.timeout(5):
                while relay.connections:  # the relay has seen both relay connections close
                    await asyncio.sleep(0.01)
            assert up.accepts == 1 and len(up.requests) == 2
    finally:
        relay.stop()
    await asyncio.sleep(0)  # the pooled connection's `connection_lost`


async def test_answers_read_over_a_reused_upstream_connection_leave_no_garbage() -> None:
    """Two answers, one after the other over one pooled upstream connection, each
    through its own relay connection: the upstream's parser holds its reader's
    callbacks, the relay's parser its connection's, a piped body its reader's
    closures; each is let go when its part is over."""
    answer = chunked_head([("Content-Type", "text/event-stream")]) + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK
    await _two_answers(answer)  # what is built once per process (mitmproxy's framing request per method)
    with collector_off() as found:
        await _two_answers(answer)
    assert found == []
