"""The attempt core and its driver without sockets, in the spirit of mitmproxy's
`Playbook`: scripted upstream answers go in, and what the client was sent comes
out, recorded.

`ScriptedUpstreams` stands in for the relay's `UpstreamClient` (each upstream's
answers in order, or an exception for a transport failure); `RecordingSink` stands
in for the relay connection (the core's `ClientSink`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.attempts import Driver, ExchangeMachine
from switchyard_core.exchange import Exchange, OriginalRequest
from switchyard_core.rules import AttemptSettings, Route, Upstream
from switchyard_core.upstreams.body import Body
from switchyard_core.upstreams.messages import UpstreamRequest

SSE = (("Content-Type", "text/event-stream"),)
JSON = (("Content-Type", "application/json"),)


@dataclass
class Scripted:
    """One answer as an upstream sends it: its head, its body's pieces, and how the body ends."""

    status: int = 200
    headers: Sequence[tuple[str, str]] = SSE
    pieces: Sequence[bytes] = ()
    broken: BaseException | None = None  # the body breaks off (a reset) after its pieces


class _Answer:
    def __init__(self, scripted: Scripted) -> None:
        self.status = scripted.status
        self.headers = CIMultiDictProxy(CIMultiDict(scripted.headers))
        self.body = Body()
        for piece in scripted.pieces:
            self.body.feed(piece)
        self.body.end(scripted.broken)
        self.closed = False

    def close(self) -> None:
        self.closed = True


@dataclass
class ScriptedUpstreams:
    """Each upstream's answers, by the upstream's host, one per attempt."""

    script: dict[str, list[Scripted | BaseException]]
    calls: list[str] = field(default_factory=list)  # hosts, in the order they were asked
    requests: list[UpstreamRequest] = field(default_factory=list)

    async def open(self, request: UpstreamRequest, *, connect_timeout_s: float | None,
                   sent: Callable[[bool], None] | None = None,
                   headed: Callable[[_Answer], None] | None = None) -> _Answer:
        """`headed` is told of each answer before it is returned, as the relay's client
        tells it from the read that brought the head."""
        host = request.url.split("/")[2]
        self.calls.append(host)
        self.requests.append(request)
        reply = self.script[host].pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if sent is not None:
            sent(True)
        answer = _Answer(reply)
        if headed is not None:
            headed(answer)
        return answer


class RecordingSink:
    """What the client was sent: the head, the body's bytes, and how it ended."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.whole = False  # sent with a length, in one piece
        self.cut = False  # ended without a clean end

    @property
    def headers_sent(self) -> bool:
        return self.status is not None

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status, self.headers = status, headers

    def write(self, data: bytes) -> None:
        assert not self.cut, "a write after the cut"
        self.body += data

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.headers, self.body, self.whole = status, headers, body, True

    def pace(self, producer: Body | None) -> None:
        pass

    def abort(self) -> None:
        self.cut = True

    def message(self, data: bytes) -> None:
        self.body += data + b"\n"


def upstream(host: str, retries: int = 0) -> Upstream:
    return Upstream(name=host.split(".")[0], url=f"https://{host}/v1/chat/completions", model=None, retries=retries,
                    auth=None, headers=())


async def play(upstreams: ScriptedUpstreams, *route_upstreams: Upstream, stream: bool = True,
               **settings: object) -> tuple[Exchange, RecordingSink]:
    """One exchange through the attempt loop: what was recorded, and what the client got."""
    options: dict[str, object] = {"backoff_ms": 1, "pre_answer_keepalive_s": 0, **settings}
    route = Route(name="chat", api="openai-chat", upstreams=route_upstreams,
                  settings=AttemptSettings(**options))  # type: ignore[arg-type]
    body = {"model": "gpt-4o", "stream": stream, "messages": []}
    request = OriginalRequest.of("POST", "https://api.openai.com/v1/chat/completions",
                                 (("Content-Type", "application/json"), ("Authorization", "Bearer sk-client")),
                                 json.dumps(body).encode(), body)
    exchange = Exchange(route, request)
    sink = RecordingSink()
    machine = ExchangeMachine(exchange, sink)
    await Driver(machine, upstreams).run()
    machine.log.finished()
    return exchange, sink
