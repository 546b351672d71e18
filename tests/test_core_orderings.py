"""Any order of events a driver can report, against the attempt core (hypothesis).

The core is driven as its driver would: an attempt's head only after its `Open`, its
reads only after `Pipe`, a body after `Read`, a timeout after `Expect`, a timer after
`Timer`; the client may leave and a bug may strike at any time, and now and then a
stopped attempt's late read arrives.  Up to three upstreams (each answer's bytes name
it), hedges, retries, keepalives, outage probes, WebSocket turns and continuations.
Whatever the order: the exchange is `Finished` exactly once, nothing is asked of an
attempt after its `Stop` nor written to the client after the end, the client gets
at most one upstream's bytes (a continuation excepted), and no probe is left held."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.attempts.commands import (Command, Expect, Finished, Inject, Open, Pipe, Read, Stop, Timer,
                                               TimerName)
from switchyard_core.attempts.outages import FailureKind, Outages
from switchyard_core.attempts.turn_context import TurnContext
from switchyard_core.rules import AttemptSettings, Route
from switchyard_core.ws_items import Closed

from tests.support import wire
from tests.support.core_playbook import Play, upstream

HEADS = {"sse": {"Content-Type": "text/event-stream"}, "json": {"Content-Type": "application/json"},
         "said_wait": {"Content-Type": "application/json", "Retry-After": "30"}, "ws": {}}


def _chat(name: str) -> dict[str, bytes]:
    tag = f"<{name}>"
    return {"lifecycle": wire.chat_chunk({"role": "assistant", "content": ""}, cid=tag),
            "output": wire.chat_chunk({"content": tag}, cid=tag), "end": wire.chat_chunk({}, "stop", cid=tag),
            "done": wire.CHAT_DONE, "overloaded": wire.chat_error(503, f"overloaded {tag}"),
            "fatal": wire.data({"error": {"message": f"bad {tag}", "type": "invalid_request_error", "code": "bad"}}),
            "partial": f'data: {{"id": "{tag}"'.encode()}


def _responses(name: str) -> dict[str, bytes]:
    tag = f"<{name}>"
    return {kind: json.dumps(message).encode() for kind, message in {
        "created": {"type": "response.created", "response": {"id": tag}},
        "progress": {"type": "response.in_progress", "response": {"id": tag}},
        "output": {"type": "response.output_text.delta", "item_id": tag, "delta": tag},
        "completed": {"type": "response.completed", "response": {"id": tag, "status": "completed"}},
        "error": {"type": "error", "error": {"type": "server_error", "code": "server_error", "message": tag}},
        "failed": {"type": "response.failed", "response": {"id": tag, "error": {"code": "server_error", "message": tag}}},
        "fatal": {"type": "error", "error": {"type": "invalid_request_error", "code": "bad", "message": tag}},
    }.items()}


@dataclass(frozen=True)
class Event:
    """One event the driver reports: its kind, the attempt, and what it carries."""

    kind: str
    attempt: int = 0
    what: str = ""  # the head's kind, a frame's, how a body ended, a timer's name
    status: int = 0


class Driven:
    """The core, and what its commands so far make possible."""

    def __init__(self, names: Sequence[str], *, socket: bool | None, probes: int, retries: int,
                 **options: object) -> None:
        self.socket = socket  # None: HTTP; else a WebSocket turn, True when it may be re-sent
        api = "openai-chat" if socket is None else "openai-responses"
        upstreams = [upstream(name, retries=retries if i == 0 else 0, api=api, websocket=None if socket else False)
                     for i, name in enumerate(names)]
        self.outages = Outages()
        if probes:  # an earlier request could not reach the first ones: this one probes them
            visit = self.outages.begin(Route(name="r", api=api, upstreams=tuple(upstreams),
                                             settings=AttemptSettings(unreachable_skip_s=10)), 900.0)
            for missing in upstreams[:probes]:
                visit.failed(missing.name, FailureKind.UNREACHABLE, 900.0)
        turn = None
        if socket is not None:
            create = {"type": "response.create", "model": "gpt-4o", "input": "hi"}
            turn = TurnContext(1, json.dumps(create), create, socket, tuple(upstreams) if socket else upstreams[:1],
                               lambda u: True)
            options["pre_answer_keepalive_s"] = 0
        self.play = Play(*upstreams, api=api, turn=turn, outages=self.outages, unreachable_skip_s=10, **options)
        self.opening: set[int] = set()
        self.reading: dict[int, Read] = {}
        self.piped: set[int] = set()
        self.bounded: set[int] = set()
        self.timers: set[TimerName] = set()
        self.stopped: set[int] = set()
        self.upstream_of: dict[int, str] = {}
        self.finished = 0
        self.at_end: tuple[bytes, int | None] | None = None
        self.clock = 0.0

    def take(self, commands: list[Command]) -> None:
        sink = self.play.sink
        if self.finished:
            assert all(isinstance(c, Timer) for c in commands), commands
            assert (sink.body, sink.status) == self.at_end, "written after the end"
        for command in commands:
            number = getattr(command, "attempt", None)
            if isinstance(command, Open | Read | Pipe | Expect | Inject):
                assert number not in self.stopped, f"{command} after its Stop"
            if isinstance(command, Open):
                assert number not in self.opening and number not in self.piped, f"{command}: a live attempt's number"
                self.opening.add(command.attempt)
                self.upstream_of[command.attempt] = command.request.url.split("/")[2].split(".")[0]
            elif isinstance(command, Read):
                self.reading[command.attempt] = command
            elif isinstance(command, Pipe):
                self.piped.add(command.attempt)
            elif isinstance(command, Expect):
                self.bounded.add(command.attempt)
            elif isinstance(command, Stop):
                self.stopped.add(command.attempt)
                for held in (self.opening, self.piped, self.bounded):
                    held.discard(command.attempt)
                self.reading.pop(command.attempt, None)
            elif isinstance(command, Timer):
                if command.at is not None:
                    self.timers.add(command.name)
                else:
                    self.timers.discard(command.name)
            elif isinstance(command, Finished):
                self.finished += 1
                self.at_end = (sink.body, sink.status)

    def possible(self) -> list[Event]:
        events: list[Event] = []
        for n in sorted(self.opening):
            if self.socket is None:
                events += [Event("opened", n, head, status) for head in ("sse", "json", "said_wait")
                           for status in (200, 400, 429, 503)]
            else:
                events += [Event("opened", n, "ws", 101), *(Event("refused", n, status=s) for s in (405, 500))]
            events += [Event("open_failed", n, why) for why in ("transport", "head_timeout")]
        events += [Event("read", n) for n in sorted(self.reading)]
        frames = _chat("a") if self.socket is None else _responses("a")
        events += [Event("data", n, kind) for n in sorted(self.piped) for kind in frames]
        events += [Event("ended", n, how) for n in sorted(self.piped) for how in ("clean", "broke")]
        events += [Event("timed_out", n) for n in sorted(self.bounded)]
        events += [Event("due", what=name) for name in sorted(self.timers)]
        return events + [Event("late", n) for n in sorted(self.stopped)] + [Event("client_gone"), Event("crashed")]

    def happen(self, event: Event) -> None:
        self.clock += 0.5
        machine, now, n = self.play.machine, 1000.0 + self.clock, event.attempt
        if event.kind == "opened":
            self.opening.discard(n)
            self.take(machine.opened(n, event.status, CIMultiDictProxy(CIMultiDict(HEADS[event.what])), now))
        elif event.kind == "open_failed":
            self.opening.discard(n)
            refused = ConnectionRefusedError("refused") if event.what == "transport" else None
            self.take(machine.open_failed(n, event.what, refused, now))
        elif event.kind == "refused":
            self.opening.discard(n)
            self.take(machine.refused(n, event.status, [], f"<{self.upstream_of[n]}>".encode(), now))
        elif event.kind == "read":
            read, name = self.reading.pop(n), self.upstream_of[n]
            body = (json.dumps({"error": {"message": f"<{name}>", "type": "rate_limit_error"}}) if read.kind == "error"
                    else json.dumps(wire.chat_completion(f"<{name}>"))).encode()
            self.take(machine.body_read(n, body, True, None, False, now))
        elif event.kind in ("data", "late"):
            raw = (_chat if self.socket is None else _responses)(self.upstream_of[n])[event.what or "output"]
            self.take(machine.data(n, raw, now) if self.socket is None else machine.message(n, raw, now))
            if event.kind == "late":
                self.take(machine.ended(n, None, now))
                self.take(machine.timed_out(n, now))
        elif event.kind == "ended":
            self.piped.discard(n)
            error: BaseException | Closed | None = None
            if event.what == "broke":
                error = Closed(1011, "") if self.socket is not None else ConnectionResetError()
            self.take(machine.ended(n, error, now))
        elif event.kind == "timed_out":
            self.bounded.discard(n)
            self.take(machine.timed_out(n, now))
        elif event.kind == "due":
            self.timers.discard(event.what)
            self.take(machine.due(cast(TimerName, event.what), now))
        elif event.kind == "client_gone":
            self.take(machine.client_gone())
        else:
            self.take(machine.crashed("Bug"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), upstreams=st.integers(2, 3), hedge=st.sampled_from([0, 2]), keepalive=st.sampled_from([0, 1]),
       retries=st.integers(0, 1), socket=st.sampled_from([None, True, False]), continued=st.booleans(),
       probes=st.integers(0, 2), stream=st.booleans())
def test_any_order_of_events_ends_once_with_at_most_one_upstreams_bytes(
        data: st.DataObject, upstreams: int, hedge: float, keepalive: float, retries: int, socket: bool | None,
        continued: bool, probes: int, stream: bool) -> None:
    continuing = continued and socket is None
    driven = Driven("abc"[:upstreams], socket=socket, probes=probes, retries=retries, hedge_after_s=hedge,
                    pre_answer_keepalive_s=keepalive, stream=stream or socket is not None,
                    continue_after_cut=["regenerate"] if continuing else [])
    driven.take(driven.play.start())
    for _ in range(30):
        if driven.finished:
            break
        by_kind: dict[tuple[str, int], list[Event]] = {}
        for event in driven.possible():
            by_kind.setdefault((event.kind, event.attempt), []).append(event)  # each kind as likely as another
        driven.happen(data.draw(st.sampled_from(by_kind[data.draw(st.sampled_from(sorted(by_kind)))])))
    if not driven.finished:
        driven.take(driven.play.machine.client_gone())
    assert driven.finished == 1
    whose = set(re.findall(rb"<([abc])>", driven.play.sink.body))
    assert len(whose) <= 1 or continuing, driven.play.sink.body
    assert not any(entry.skip.probing for entry in driven.outages.remembered(2000.0))
