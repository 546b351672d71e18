"""The one driver of the attempt core: it does the I/O each command names and
reports what came of it as the next event.

It decides nothing.  Every attempt of an exchange is sent from here, the first
one too (it starts as soon as the exchange is routed, before mitmproxy has
passed the flow to the relay: the answer's sink is attached when it arrives).
An HTTP answer is read with the relay's upstream client; a WebSocket turn's
attempt over the upstream's socket goes through the session's `SocketSide`.
After a commit, plain answer content is written from the upstream
connection's own read callback, without another event (`Attempt.passes`): the
hot path every token takes (docs/architecture.md, "Speed").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from .. import observe
from ..faults import FaultSpec
from ..upstreams.body import Body
from ..upstreams.messages import Answer, ConnectTimeout, Upstreams, UpstreamRequest, read_bounded
from ..upstreams.websocket import Refused
from ..ws_items import Closed, Item
from .client_stream import ClientSink, HeldSink
from .commands import CloseClient, Command, Expect, Finished, Inject, Open, Pipe, Read, Stop, Timer, TimerName, UseHttp
from .faulty_answer import FaultyAnswer
from .machine import ExchangeMachine
from .timers import AttemptTimer, loop_time

now = time.monotonic


class SocketSide(Protocol):
    """A WebSocket session's upstream sockets, as a turn's attempts use them."""

    @property
    def held_for_client(self) -> bool:
        """The client reads nothing now: quiet meanwhile is no stall."""
        ...

    async def open(self, attempt: int, upstream: str, request: UpstreamRequest, connect_s: float | None) -> None:
        """The socket for this attempt (the connection's own, if it is to that upstream):
        raises `ConnectTimeout`, `Refused` or an `OSError`."""
        ...

    def converse(self, attempt: int, receive: Callable[[Item], None], fault: FaultSpec | None) -> None:
        """Send the turn on the attempt's socket; each item it delivers from now on goes to `receive`."""
        ...

    def release(self, attempt: int, drop: bool) -> None:
        """Nothing more of the attempt's socket goes to it; `drop`: its later messages must reach nobody."""
        ...

    def use_http(self, upstream: str, status: int) -> None: ...

    def close_client(self, code: int, reason: str) -> None: ...


class _Reading:
    """One attempt's I/O in progress."""

    __slots__ = ("answer", "task", "timer", "fault", "body")

    def __init__(self) -> None:
        self.answer: Answer | None = None
        self.task: asyncio.Task[None] | None = None
        self.timer: AttemptTimer | None = None
        self.fault: FaultSpec | None = None  # a WebSocket attempt's, applied to its messages
        self.body: Body | None = None  # being piped (and paced)


class Driver:
    def __init__(self, machine: ExchangeMachine, http: Upstreams, *, sockets: SocketSide | None = None) -> None:
        self.machine = machine
        self.http = http
        self.sockets = sockets
        self._reading: dict[int, _Reading] = {}
        self._timers: dict[TimerName, asyncio.TimerHandle] = {}
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._started = False

    # --- the exchange's life ----------------------------------------------------------------

    def start(self) -> None:
        """Send the first attempt now (before `run`, when the exchange is routed)."""
        if not self._started:
            self._started = True
            self._event(lambda: self.machine.start(now()))

    def attach(self, sink: ClientSink) -> None:
        """The client's answer goes here from now on (the relay's answer has arrived)."""
        client = self.machine.client
        held = client.sink
        client.sink = sink
        if isinstance(held, HeldSink):
            held.replay(sink)

    async def run(self) -> None:
        """Until the exchange is over; cancelled: the client left."""
        self.start()
        try:
            await asyncio.shield(self._done)
        except asyncio.CancelledError:
            if not self._done.done():
                self._event(self.machine.client_gone)
            raise
        finally:
            self._close()

    def crashed(self, what: str) -> None:
        """A bug around the exchange (not in the core): it costs this exchange's answer."""
        self._event(lambda: self.machine.crashed(what))

    def cancel(self) -> None:
        """Nobody will read this exchange's answer (the flow never reached the relay)."""
        if not self._done.done():
            self._event(self.machine.client_gone)
        self._close()

    @property
    def done(self) -> bool:
        return self._done.done()

    def _close(self) -> None:
        for number in list(self._reading):
            self._stop(number, drop=False)
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    # --- events in, commands out -------------------------------------------------------------

    def _event(self, happened: Callable[[], list[Command]]) -> None:
        try:
            commands = happened()
        except Exception as exc:  # a bug must cost one exchange, never the proxy
            observe.log.exception(observe.format_event("switchyard.internal_error", route=self.machine.route.name,
                                                       **self.machine.log.context))
            try:
                commands = self.machine.crashed(type(exc).__name__)
            except Exception:  # noqa: BLE001 -- the ending itself failed: end without it
                commands = [Finished()]
        self._do(commands)

    def _do(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, Open):
                self._open(command)
            elif isinstance(command, Pipe):
                self._pipe(command.attempt)
            elif isinstance(command, Expect):
                self._expect(command)
            elif isinstance(command, Read):
                self._task(command.attempt, self._read(command))
            elif isinstance(command, Stop):
                self._stop(command.attempt, command.drop)
            elif isinstance(command, Timer):
                self._timer(command.name, command.at)
            elif isinstance(command, Inject):
                self._inject(command.attempt, command.fault, command.api)
            elif isinstance(command, UseHttp):
                assert self.sockets is not None
                self.sockets.use_http(command.upstream, command.status)
            elif isinstance(command, CloseClient):
                assert self.sockets is not None
                self.sockets.close_client(command.code, command.reason)
            elif isinstance(command, Finished) and not self._done.done():
                self._done.set_result(None)

    def _task(self, number: int, work: "asyncio._CoroutineLike[None]") -> None:
        reading = self._reading.setdefault(number, _Reading())
        task = reading.task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        """An exception no event reports (a bug, a request that cannot be written) costs
        this exchange: never a client waiting for an event that never comes."""
        failure = None if task.cancelled() else task.exception()
        if failure is not None and not self._done.done():
            self._event(lambda: _reraise(failure))

    # --- opening ----------------------------------------------------------------------------------

    def _open(self, command: Open) -> None:
        if command.over == "websocket":
            self._task(command.attempt, self._open_socket(command))
        else:
            self._task(command.attempt, self._open_http(command))

    async def _open_http(self, command: Open) -> None:
        number = command.attempt
        machine = self.machine
        headed: list[Answer] = []  # told from the connection's read of the head, a loop pass before this task wakes

        def head(answer: Answer) -> None:
            headed.append(answer)
            try:
                self._headed(number, answer)
            except Exception as exc:  # noqa: BLE001 -- as in a task (`_task_done`): this exchange's, not the read's
                if not self._done.done():
                    self._event(lambda: _reraise(exc))

        try:
            async with asyncio.timeout_at(loop_time(command.head_by)):
                answer = await self.http.open(command.request, connect_timeout_s=command.connect_s,
                                              sent=lambda on_connection: machine.sent(number, on_connection, now()),
                                              headed=head)
        except (ConnectTimeout, TimeoutError, OSError) as exc:  # OSError: refused, unreachable, TLS, reset, not HTTP
            if not headed:  # (a head told already was in time: the deadline fell before this task woke)
                self._no_head(number, exc)
            return
        if not headed:
            self._headed(number, answer)

    def _headed(self, number: int, answer: Answer) -> None:
        reading = self._reading.get(number)
        if reading is None or self.machine.attempt(number) is None:
            answer.close()  # stopped meanwhile
            return
        reading.answer = answer
        self._event(lambda: self.machine.opened(number, answer.status, answer.headers, now()))

    async def _open_socket(self, command: Open) -> None:
        number = command.attempt
        machine = self.machine
        assert self.sockets is not None
        upstream = machine.attempt(number)
        name = upstream.upstream.name if upstream is not None else ""
        try:
            async with asyncio.timeout_at(loop_time(command.head_by)):
                await self.sockets.open(number, name, command.request, command.connect_s)
        except Refused as exc:
            refused: Refused = exc
            self._event(lambda: machine.refused(number, refused.status, refused.headers, refused.body, now()))
            return
        except (ConnectTimeout, TimeoutError, OSError) as exc:
            self._no_head(number, exc)
            return
        self._event(lambda: machine.opened(number, 101, {}, now()))

    def _no_head(self, number: int, failure: BaseException) -> None:
        """An open that brought no head (no connection in time, no head in time, a failure)."""
        if isinstance(failure, ConnectTimeout):
            self._event(lambda: self.machine.open_failed(number, "connect_timeout", None, now()))
        elif isinstance(failure, TimeoutError):
            self._event(lambda: self.machine.open_failed(number, "head_timeout", None, now()))
        else:
            self._event(lambda: self.machine.open_failed(number, "transport", failure, now()))

    def _inject(self, number: int, fault: FaultSpec, api: str) -> None:
        reading = self._reading.get(number)
        if reading is None:
            return
        if reading.answer is None:  # a WebSocket's: its messages are read through the fault
            reading.fault = fault
            return
        answer = reading.answer = FaultyAnswer(reading.answer, fault, api)
        self._event(lambda: self.machine.opened(number, answer.status, answer.headers, now(), faulted=True))

    # --- reading ----------------------------------------------------------------------------------

    async def _read(self, command: Read) -> None:
        number = command.attempt
        reading = self._reading.get(number)
        answer = reading.answer if reading is not None else None
        if answer is None:
            return
        if command.kind == "error":
            body, complete = await read_bounded(answer, command.limit, command.span_s)
            self._event(lambda: self.machine.body_read(number, body, complete, None, False, now()))
            return
        chunks: list[bytes] = []
        size = 0
        error: BaseException | None = None
        complete = timed_out = False
        try:
            async with asyncio.timeout_at(loop_time(command.by)):
                while True:
                    chunk, error = await answer.body.read_some()
                    if error is not None:
                        break
                    if not chunk:
                        complete = True
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > command.limit:
                        break  # too large to hold: the core passes the rest through
        except TimeoutError:
            timed_out = True
        body = b"".join(chunks)
        self._event(lambda: self.machine.body_read(number, body, complete, error, timed_out, now()))

    def _pipe(self, number: int) -> None:
        reading = self._reading.get(number)
        attempt = self.machine.attempt(number)
        if reading is None or attempt is None:
            return
        machine = self.machine
        timer = self._attempt_timer(number, reading)
        touch = timer.touch
        passes = attempt.passes
        client = machine.client
        if reading.answer is None:  # a WebSocket's messages
            assert self.sockets is not None

            def receive(item: Item) -> None:
                touch()
                if isinstance(item, Closed):
                    self._event(lambda: machine.ended(number, item, now()))
                elif passes(item):
                    client.message(item)  # the hot path
                else:
                    self._event(lambda: machine.message(number, item, now()))

            self.sockets.converse(number, receive, reading.fault)
            return
        body = reading.body = reading.answer.body
        write = client.write

        def through(chunk: bytes) -> None:
            touch()
            if passes(chunk):  # committed, and plain answer content: the hot path
                write(chunk)
            else:
                self._event(lambda: machine.data(number, chunk, now()))

        client.sink.pace(body)
        piped = body.pipe(through)
        piped.add_done_callback(lambda done: self._piped(number, done))

    def _piped(self, number: int, done: "asyncio.Future[BaseException | None]") -> None:
        reading = self._reading.get(number)
        if reading is None or done.cancelled():
            return  # stopped: the core is done with it
        if reading.body is not None:
            self._unpace(reading)
        failure = done.exception()
        if failure is not None:  # raised in the read callback: a bug
            self._event(lambda: _reraise(failure))
            return
        error = done.result()
        self._event(lambda: self.machine.ended(number, error, now()))

    def _attempt_timer(self, number: int, reading: _Reading) -> AttemptTimer:
        if reading.timer is None:
            excused: Callable[[], bool]
            if reading.answer is not None:
                body = reading.answer.body
                excused = lambda: body.paused_for_client  # noqa: E731
            else:
                sockets = self.sockets
                excused = lambda: sockets is not None and sockets.held_for_client  # noqa: E731
            reading.timer = AttemptTimer(lambda: self._event(lambda: self.machine.timed_out(number, now())), excused)
        return reading.timer

    def _expect(self, command: Expect) -> None:
        reading = self._reading.setdefault(command.attempt, _Reading())
        self._attempt_timer(command.attempt, reading).set(by=command.by, quiet=command.quiet)

    def _stop(self, number: int, drop: bool) -> None:
        reading = self._reading.pop(number, None)
        if reading is None:
            return
        if reading.timer is not None:
            reading.timer.cancel()
        if reading.task is not None and not reading.task.done() and reading.task is not asyncio.current_task():
            reading.task.cancel()
        if reading.body is not None:
            reading.body.stop()
            self._unpace(reading)
        if reading.answer is not None:
            reading.answer.close()
        elif self.sockets is not None:
            self.sockets.release(number, drop)

    def _unpace(self, reading: _Reading) -> None:
        """Its body is piped no more: the client's pace goes to the body still piped (a
        hedge's winner, piped before this one), else to none."""
        reading.body = None
        self.machine.client.sink.pace(next((r.body for r in self._reading.values() if r.body is not None), None))

    def _timer(self, name: TimerName, at: float | None) -> None:
        handle = self._timers.pop(name, None)
        if handle is not None:
            handle.cancel()
        if at is not None:
            self._timers[name] = asyncio.get_running_loop().call_at(
                loop_time(at) or 0.0, lambda: self._event(lambda: self.machine.due(name, now())))


def _reraise(failure: BaseException) -> list[Command]:
    """An exception raised where no event could say it, raised again inside `_event`."""
    raise failure
