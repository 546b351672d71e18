"""The attempt core's driver with scripted upstreams (tests/support/loop_playbook.py):
whatever goes wrong inside an attempt's I/O the exchange ends and the client hears
it, and a hedge's winner is the answer held back while the client cannot keep up."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.attempts import Driver, ExchangeMachine
from switchyard_core.attempts.commands import Command
from switchyard_core.exchange import Exchange, OriginalRequest
from switchyard_core.rules import AttemptSettings, Route
from switchyard_core.upstreams.body import Body
from switchyard_core.upstreams.messages import UpstreamRequest

from tests.support import wire
from tests.support.loop_playbook import RecordingSink, Scripted, ScriptedUpstreams, play, upstream

PRIMARY, BACKUP = "primary.example", "backup.example"


async def test_an_attempt_whose_io_raises_what_no_event_reports_still_ends_the_exchange() -> None:
    """A request that cannot be written (a header with a line break: `_request_head`'s
    ValueError) is no transport failure: it costs this exchange, told in the API's
    shape, instead of a client waiting for an event that never comes."""
    upstreams = ScriptedUpstreams({PRIMARY: [ValueError("header 'x-note' holds a line break or colon; not sent")]})
    exchange, client = await asyncio.wait_for(play(upstreams, upstream(PRIMARY), upstream(BACKUP)), 10)
    assert client.status == 502 and client.whole
    assert json.loads(client.body)["error"]["code"] == "switchyard_internal_error"
    assert exchange.outcome == "internal_error"


def chat_exchange(settings: AttemptSettings) -> Exchange:
    """A streamed Chat Completions request, routed to the primary then the backup."""
    route = Route(name="chat", api="openai-chat", upstreams=(upstream(PRIMARY), upstream(BACKUP)), settings=settings)
    body = {"model": "gpt-4o", "stream": True, "messages": []}
    return Exchange(route, OriginalRequest.of("POST", "https://api.openai.com/v1/chat/completions",
                                              (("Content-Type", "application/json"),), json.dumps(body).encode(), body))


class _OpenAnswer:
    """A stream whose body the test feeds as it goes."""

    def __init__(self) -> None:
        self.status = 200
        self.headers = CIMultiDictProxy(CIMultiDict({"Content-Type": "text/event-stream"}))
        self.body = Body()
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _OpenUpstreams:
    def __init__(self) -> None:
        self.answers: dict[str, _OpenAnswer] = {}
        self.asked: dict[str, asyncio.Event] = {PRIMARY: asyncio.Event(), BACKUP: asyncio.Event()}

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float | None,
                   sent: Callable[[bool], None] | None = None,
                   headed: Callable[[_OpenAnswer], None] | None = None) -> _OpenAnswer:
        """Never tells `headed`: the head comes to the driver as `open` returns it."""
        host = request.url.split("/")[2]
        answer = self.answers[host] = _OpenAnswer()
        self.asked[host].set()
        return answer


class _PacedClient(RecordingSink):
    """The relay's answer as far as pacing goes: the one answer it holds back while the client reads nothing."""

    producer: Body | None = None

    def pace(self, producer: Body | None) -> None:
        self.producer = producer


async def test_the_answer_that_wins_a_hedge_is_the_one_held_back_for_a_slow_client() -> None:
    """Both answers were piped (each registered for pacing); when the loser is stopped,
    the winner's must be the one paused while the client cannot keep up, or a slow
    client makes the relay buffer the whole answer."""
    upstreams = _OpenUpstreams()
    client = _PacedClient()
    exchange = chat_exchange(AttemptSettings(pre_answer_keepalive_s=0, hedge_after_s=0.01))
    run = asyncio.ensure_future(Driver(ExchangeMachine(exchange, client), upstreams).run())
    await asyncio.wait_for(upstreams.asked[BACKUP].wait(), 10)  # the hedge, beside a silent primary
    await asyncio.sleep(0)  # its head is read and its body piped
    primary, frames = upstreams.answers[PRIMARY], wire.chat_stream("answer from primary")
    primary.body.feed(b"".join(frames[:2]))  # the primary's first output wins
    assert upstreams.answers[BACKUP].closed
    assert client.producer is primary.body
    primary.body.feed(b"".join(frames[2:]))
    primary.body.end()
    await asyncio.wait_for(run, 10)
    assert client.body == b"".join(frames) and client.producer is None


class _HeadToldEarlyUpstreams(_OpenUpstreams):
    """Tells `headed` at once, as the relay's client does from the read that brought the
    head, but returns only after `returns` is set: the opening task wakes late."""

    def __init__(self) -> None:
        super().__init__()
        self.returns = asyncio.Event()

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float | None,
                   sent: Callable[[bool], None] | None = None,
                   headed: Callable[[_OpenAnswer], None] | None = None) -> _OpenAnswer:
        answer = await super().open(request, connect_timeout_s=connect_timeout_s, sent=sent)
        assert headed is not None
        headed(answer)
        await self.returns.wait()
        return answer


async def test_a_head_told_in_time_is_no_head_timeout_when_the_opening_task_wakes_past_the_deadline() -> None:
    """The head was told before `headers_timeout_s`; the task that opened the attempt
    wakes only after it, into the deadline's TimeoutError.  That is no missing head:
    the answer streams on, the backup is never asked."""
    upstreams = _HeadToldEarlyUpstreams()
    client = RecordingSink()
    exchange = chat_exchange(AttemptSettings(pre_answer_keepalive_s=0, headers_timeout_s=0.05))
    run = asyncio.ensure_future(Driver(ExchangeMachine(exchange, client), upstreams).run())
    await asyncio.wait_for(upstreams.asked[PRIMARY].wait(), 10)
    primary, frames = upstreams.answers[PRIMARY], wire.chat_stream("answer from primary")
    primary.body.feed(b"".join(frames[:2]))
    await asyncio.sleep(0.2)  # past the head's deadline, the opening task still asleep
    upstreams.returns.set()
    await asyncio.sleep(0.01)
    primary.body.feed(b"".join(frames[2:]))
    primary.body.end()
    await asyncio.wait_for(run, 10)
    assert client.status == 200 and client.body == b"".join(frames) and not client.cut
    assert not upstreams.asked[BACKUP].is_set()
    assert exchange.outcome == "committed" and [a.upstream for a in exchange.attempts] == ["primary"]


class _HeadCountingMachine(ExchangeMachine):
    """The real machine, counting the heads it was told of."""

    heads = 0

    def opened(self, *args: Any, **kwargs: Any) -> list[Command]:
        self.heads += 1
        return super().opened(*args, **kwargs)


async def test_a_head_told_before_open_returns_reaches_the_core_once() -> None:
    """The scripted upstream tells the head as the relay's client does, before `open`
    returns the same answer: the core hears of it once, and the client gets it once."""
    frames = wire.chat_stream("answer from primary")
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(pieces=[b"".join(frames)])]})
    client = RecordingSink()
    machine = _HeadCountingMachine(chat_exchange(AttemptSettings(pre_answer_keepalive_s=0)), client)
    await asyncio.wait_for(Driver(machine, upstreams).run(), 10)
    assert machine.heads == 1
    assert client.status == 200 and client.body == b"".join(frames)
