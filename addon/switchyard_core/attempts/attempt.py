"""One attempt as the core sees it, and what an attempt may ask of the core.

An attempt is one request to one upstream: the first answer, a retry, a
fallback, a hedge, or a continuation of a cut answer.  Each kind reads its
answer its own way (`answer.py` an HTTP answer, `socket_turn.py` a WebSocket
turn's messages, `continuing.py` a continuation), as values: the events of its
answer go in, and it tells the core (`Core`) what came of them.  What follows a
failure, a commit or a cut is the core's decision, taken in one place for every
kind (docs/architecture.md, "The attempt core").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from ..apis import Api, Classification, ErrorInfo
from ..exchange import AttemptRecord, Exchange
from ..gate import GateStep
from ..rules import AttemptSettings, Route, Upstream
from ..upstreams.messages import transport_failure, unreachable
from ..ws_items import Closed
from .client_stream import ClientStream
from .commands import Command, Open
from .deadlines import Deadlines
from .endings import Endings
from .log import AttemptLog
from .outages import FailureKind
from .policy import UpstreamTry
from .turn_context import TurnContext

Cut = Literal["stream_cut", "stream_stalled"]


class Core(Protocol):
    """What an attempt may ask of the exchange's core (`machine.ExchangeMachine`)."""

    exchange: Exchange
    route: Route
    settings: AttemptSettings
    api: Api
    client: ClientStream
    end: Endings
    log: AttemptLog
    turn: TurnContext | None  # a WebSocket turn's, None for an HTTP exchange

    def out(self, *commands: Command) -> None:
        """Ask the driver for this (see commands.py)."""
        ...

    def failed(self, attempt: "Attempt", info: ErrorInfo, now: float, *, timed_out: bool = False,
               headers: Mapping[str, str] | None = None, forward: Callable[[], None] | None = None,
               kind: FailureKind | None = None) -> None:
        """A failure before output: judged, logged, and acted on: the same upstream
        again, the next one, or the exchange's end.  At the end, `forward` (if the
        attempt has an answer to forward) gives the client the failure as it was sent;
        else every upstream is exhausted.  `kind`: what the outage memory hears, where
        it is not an answer's failure (no connection, no head)."""
        ...

    def output(self, attempt: "Attempt", step: GateStep) -> None:
        """A gate step of an attempt: its first commit, failures after output, the bytes."""
        ...

    def commit(self, attempt: "Attempt", first_event: str) -> None:
        """The first output: this attempt's answer is the client's from now on."""
        ...

    def commit_whole(self, attempt: "Attempt", first_event: str) -> None:
        """A whole answer is the client's (the attempt writes it): others stopped, memory told."""
        ...

    def stop(self, attempt: "Attempt") -> None:
        """Done with this attempt's answer (read to its end, or given up on)."""
        ...

    def open_attempt(self, attempt: "Attempt", request_over: Open) -> None:
        """Another kind's attempt (a continuation) joins the exchange."""
        ...

    def reopen_over_http(self, attempt: "Attempt", now: float) -> None:
        """A refused WebSocket upgrade: the same try over HTTP, and no attempt of its own."""
        ...

    def cut_ends(self, record: AttemptRecord, message: str, code: Cut, closed: Closed | None) -> None:
        """A cut answer that nothing finished ends with the cut."""
        ...

    def cut(self, attempt: "Attempt", message: str, code: Cut, now: float, closed: Closed | None = None) -> None:
        """A committed answer broke off: a continuation finishes it where the route asks, else the cut ends it."""
        ...

    def finish(self) -> None:
        """The client's answer is over."""
        ...


@dataclass(slots=True, eq=False)
class Attempt:
    """What every attempt has: its number, which try of which upstream, its record
    (what mitmweb and the log show), its time bounds and its upstream's secrets."""

    step: UpstreamTry
    record: AttemptRecord
    deadlines: Deadlines
    # what the upstream's `${VAR}`s hold: never passed on, should it echo them
    secrets: tuple[bytes, ...] = ()

    takes_faults = True  # a fault of the rules may replace its answer (a continuation's never)

    @property
    def number(self) -> int:
        return self.record.attempt

    @property
    def upstream(self) -> Upstream:
        return self.step.upstream

    @property
    def drops_on_stop(self) -> bool:
        """Whether stopping it also ends its connection for others (a WebSocket's, whose
        late messages must reach nobody); an HTTP answer's connection goes with it anyway."""
        return False

    def head_for_client(self) -> tuple[int, Mapping[str, str]]:
        """The status and headers the client's answer starts with, if this one commits it."""
        return 200, {}

    def committed(self, core: Core, first_event: str) -> None:
        """It committed (the core has started the client's answer)."""

    def failed_after_output(self, core: Core, failure: Classification) -> None:
        """A failure after output: forwarded, never replayed; logged (the first is the attempt's story)."""
        core.log.suppressed(self.record, failure.error, failure.event_type)

    def open_failed(self, core: Core, why: str, error: BaseException | None, now: float) -> None:
        """No head came: a connection not made in time, no head in time, or a transport failure."""
        if why == "connect_timeout":
            core.failed(self, self.deadlines.no_connection(), now, timed_out=True, kind=FailureKind.UNREACHABLE)
        elif why == "head_timeout":
            core.failed(self, self.head_timeout(core), now, timed_out=True, kind=FailureKind.NO_ANSWER)
        else:
            broke = error or ConnectionError()
            kind = FailureKind.UNREACHABLE if unreachable(broke) else FailureKind.ANSWERED
            core.failed(self, transport_failure(broke), now, kind=kind)

    def lose(self) -> None:
        """Another attempt hedged against it produced output first: it is stopped."""

    def head_timeout(self, core: Core) -> ErrorInfo:
        return self.deadlines.no_head()

    # --- events (each kind handles those its answer can have) --------------------------

    def opened(self, core: Core, status: int, headers: Mapping[str, str], now: float) -> None:
        raise NotImplementedError

    def body_read(self, core: Core, body: bytes, complete: bool, error: BaseException | None, timed_out: bool,
                  now: float) -> None:
        raise NotImplementedError

    def data(self, core: Core, chunk: bytes, now: float) -> None:
        raise NotImplementedError

    def ended(self, core: Core, error: BaseException | None, now: float) -> None:
        raise NotImplementedError

    def timed_out(self, core: Core, now: float) -> None:
        raise NotImplementedError

    def passes(self, chunk: bytes) -> bool:
        """Whether a read is plain answer content that goes to the client as it came
        (the hot path: the driver writes it without another event)."""
        return False

