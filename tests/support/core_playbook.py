"""The attempt core driven by hand, without sockets or a driver, as mitmproxy tests its
layers with `Playbook` and h11 its state machine: events go in at chosen times, and
the test reads the commands that come out and what the client was sent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.attempts.commands import Command, Open
from switchyard_core.attempts.machine import ExchangeMachine
from switchyard_core.attempts.outages import Outages
from switchyard_core.attempts.turn_context import TurnContext
from switchyard_core.exchange import Exchange, OriginalRequest
from switchyard_core.faults import FaultPlan
from switchyard_core.rules import AttemptSettings, Route, Upstream

from tests.support.loop_playbook import RecordingSink

C = TypeVar("C", bound=Command)
SSE = {"Content-Type": "text/event-stream"}
JSON = {"Content-Type": "application/json"}
PATHS = {"openai-chat": "/v1/chat/completions", "openai-responses": "/v1/responses",
         "anthropic-messages": "/v1/messages"}


def upstream(name: str, *, retries: int = 0, prefill: bool = False, api: str = "openai-chat",
             websocket: bool | None = False) -> Upstream:
    return Upstream(name=name, url=f"https://{name}.example{PATHS[api]}", model=None, retries=retries, auth=None,
                    headers=(), prefill=prefill, websocket=websocket)


def body_for(api: str, stream: bool = True) -> dict[str, Any]:
    if api == "openai-responses":
        return {"model": "gpt-4o", "stream": stream, "input": "hi"}
    body: dict[str, Any] = {"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    if api == "anthropic-messages":
        body["max_tokens"] = 64
    return body


class Play:
    """One exchange of the core; `now` moves only when the test says so."""

    def __init__(self, *upstreams: Upstream, api: str = "openai-chat", stream: bool = True,
                 turn: TurnContext | None = None, faults: FaultPlan | None = None, outages: Outages | None = None,
                 start_at: float = 0.0, **settings: object) -> None:
        options: dict[str, object] = {"backoff_ms": 100, "pre_answer_keepalive_s": 0, **settings}
        self.route = Route(name="r", api=api, upstreams=tuple(upstreams),
                           settings=AttemptSettings(**options))  # type: ignore[arg-type]
        body = body_for(api, stream)
        self.request = OriginalRequest.of("POST", f"https://origin.example{PATHS[api]}",
                                          (("Content-Type", "application/json"),), json.dumps(body).encode(), body)
        self.exchange = Exchange(self.route, self.request)
        self.sink = RecordingSink()
        self.machine = ExchangeMachine(self.exchange, self.sink, faults=faults, turn=turn, outages=outages)
        self.now = 1000.0 + start_at

    def at(self, seconds: float) -> "Play":
        """`seconds` after the exchange began."""
        self.now = 1000.0 + seconds
        return self

    def start(self) -> list[Command]:
        return self.machine.start(self.now)

    def opened(self, number: int, status: int = 200, headers: dict[str, str] | None = None) -> list[Command]:
        return self.machine.opened(number, status, CIMultiDictProxy(CIMultiDict(SSE if headers is None else headers)),
                                   self.now)

    def data(self, number: int, *frames: bytes) -> list[Command]:
        return self.machine.data(number, b"".join(frames), self.now)

    def message(self, number: int, raw: bytes) -> list[Command]:
        return self.machine.message(number, raw, self.now)

    def ended(self, number: int, error: BaseException | None = None) -> list[Command]:
        return self.machine.ended(number, error, self.now)

    def read(self, number: int, body: bytes, *, complete: bool = True) -> list[Command]:
        return self.machine.body_read(number, body, complete, None, False, self.now)

    def timed_out(self, number: int) -> list[Command]:
        return self.machine.timed_out(number, self.now)

    def open_failed(self, number: int, why: str, error: BaseException | None = None) -> list[Command]:
        return self.machine.open_failed(number, why, error, self.now)

    def due(self, name: str) -> list[Command]:
        return self.machine.due(name, self.now)  # type: ignore[arg-type]

    @property
    def outcomes(self) -> list[tuple[str, str]]:
        return [(record.upstream, record.outcome) for record in self.exchange.attempts]


def only(commands: Sequence[Command], kind: type[C]) -> list[C]:
    return [command for command in commands if isinstance(command, kind)]


def opened_to(commands: Sequence[Command]) -> list[str]:
    """The hosts each `Open` among `commands` goes to."""
    return [command.request.url.split("/")[2].split(".")[0] for command in only(commands, Open)]
