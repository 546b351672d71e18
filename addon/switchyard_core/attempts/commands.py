"""What the attempt core asks its driver to do on the upstream side (commands out).

The core (`machine.py`) takes events and returns these; a driver (`driver.py`)
does the I/O each names and reports what came of it as the next event.  The
client's side needs no commands: its writes are synchronous calls on the
`ClientSink`, made in order as the core decides them (see docs/architecture.md,
"The attempt core").

Every attempt has a number (`attempt`), the same as its `AttemptRecord.attempt`;
events name it, so that a late event of an attempt the core is done with
(a hedge's loser, a timed-out answer) is recognised and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..rules.schema import FaultSpec
from ..upstreams.messages import UpstreamRequest

Over = Literal["http", "websocket"]
ReadKind = Literal["error", "whole"]
TimerName = Literal["keepalive", "backoff", "hedge"]


@dataclass(frozen=True, slots=True)
class Open:
    """Send `request`; report `Opened` when the answer's head came (or `Refused` for a
    WebSocket upgrade answered otherwise), `OpenFailed` if it never did.

    `head_by`: when the head must have come (monotonic; None: no bound);
    `connect_s`: the bound on making the connection alone."""

    attempt: int
    request: UpstreamRequest
    over: Over
    connect_s: float | None
    head_by: float | None


@dataclass(frozen=True, slots=True)
class Inject:
    """Put this fault between the attempt's real answer and the core, and report the
    answer's head again (the fault may replace it)."""

    attempt: int
    fault: FaultSpec
    api: str  # the API the attempt's upstream speaks: the fault's error is in its shape


@dataclass(frozen=True, slots=True)
class Read:
    """Read the answer's body up to `limit` bytes and report it whole (`BodyRead`):
    an error body within `span_s` of now, or a whole answer by `by` (monotonic)."""

    attempt: int
    kind: ReadKind
    limit: int
    span_s: float | None = None
    by: float | None = None


@dataclass(frozen=True, slots=True)
class Pipe:
    """From now on report each read of the body (`Data`) as it arrives, then `Ended`;
    for a WebSocket, send the turn and report each message (`Message`), then `Closed`."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Expect:
    """The attempt's reads must go on by a bound, else report `TimedOut`.

    `quiet`: a bound on silence (each read starts it again, and quiet while the
    client holds the answer back does not count); else `by` is a fixed time that
    nothing moves (monotonic).  None: no bound."""

    attempt: int
    by: float | None = None
    quiet: float | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """Done with this attempt's answer: close it (its connection is not reused unless
    the answer was read to its end) and report nothing more of it."""

    attempt: int
    drop: bool = False  # a WebSocket: its messages from now on must reach nobody; the socket goes


@dataclass(frozen=True, slots=True)
class Timer:
    """Report `Due(name)` at `at` (monotonic); None cancels it."""

    name: TimerName
    at: float | None


@dataclass(frozen=True, slots=True)
class UseHttp:
    """This upstream refused the WebSocket upgrade: the connection asks it over HTTP from now on."""

    upstream: str
    status: int


@dataclass(frozen=True, slots=True)
class CloseClient:
    """A WebSocket turn's upstream closed: the client's socket gets the close, after every message before it."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The exchange is over: nothing more will be asked."""


Command = Open | Inject | Read | Pipe | Expect | Stop | Timer | UseHttp | CloseClient | Finished
