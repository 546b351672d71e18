"""The attempt core: one machine per exchange that decides everything and does no I/O.

Events go in (an answer's head, a read, a message, its end, a timeout, a timer,
the client gone), each with the time it happened; commands come out (open this
upstream, read, pipe, expect by, stop, set a timer: `commands.py`), and the
client's answer is written through the `ClientSink` as it is decided.  Every
transport is a thin driver of the same machine (`driver.py`): an HTTP stream,
a WebSocket turn, and a continuation after a cut are kinds of attempt
(`answer.py`, `socket_turn.py`, `continuing.py`), not loops of their own.  What
follows a failure (the same upstream again, the next one, the end) is decided
once, here, for all of them (docs/architecture.md, "The attempt core").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial

from .. import observe
from ..apis import APIS, Decision, ErrorInfo, ErrorPolicy
from ..translate.request import Untranslatable
from ..exchange import AttemptRecord, Exchange
from ..faults import FaultPlan
from ..gate import GateStep
from ..upstreams.messages import (forwarded_response_headers)
from ..ws_items import Closed
from .attempt import Attempt, Cut
from .client_stream import ClientSink, ClientStream
from .commands import CloseClient, Command, Finished, Inject, Open, Stop, Timer, TimerName
from .continuing import Continuing
from .answer import in_client_shape
from .endings import Answered, Endings
from .log import AttemptLog
from .outages import FailureKind, Outages
from .policy import UpstreamTry, judge
from .opening import new_attempt, speaks_websocket, untranslatable
from .socket_turn import SocketAttempt, warm_up_here
from .tries import Tries
from .turn_context import TurnContext


class ExchangeMachine:
    """One exchange's attempts, from the first upstream's to its ending."""

    def __init__(self, exchange: Exchange, sink: ClientSink, *, faults: FaultPlan | None = None,
                 turn: TurnContext | None = None, outages: Outages | None = None) -> None:
        self.exchange = exchange
        self.route = exchange.route
        self.settings = exchange.route.settings
        self.api = APIS[exchange.route.api]
        self.policy = ErrorPolicy(self.settings.retry_on)
        self.client = ClientStream(sink, self.api)
        self.log = AttemptLog(exchange)
        self.end = Endings(exchange, self.client, self.log)
        self.faults = faults
        self.turn = turn
        self.outages = outages
        self.tries = Tries(self.route.name, turn.upstreams if turn is not None else self.route.upstreams)
        self.continuing = Continuing(self) if self.settings.continue_after_cut and exchange.request.wants_stream \
            else None
        if self.continuing is not None:
            self.client.keep_transcript(self.settings.staging_limit)
        self.done = False
        self._live: dict[int, Attempt] = {}
        self._outbox: list[Command] = []
        self._after_backoff: UpstreamTry | None = None
        self._hedge_s = self.settings.hedge_after_s
        self._hedged_from: int | None = None  # the attempt the hedge timer runs for
        self._committed = False
        self._keepalive_s = self.settings.pre_answer_keepalive_s \
            if exchange.request.wants_stream and turn is None else 0.0
        if turn is not None:
            self.log.context = {"transport": "websocket", "turn": turn.number}

    # --- events -------------------------------------------------------------------------

    def start(self, now: float) -> list[Command]:
        turn = self.turn
        self.tries = Tries.of(self.outages, self.route, self.tries.upstreams, now,
                              remember=turn is None or turn.resendable, context=self.log.context)
        self.exchange.skipped = self.tries.skipped
        self._open(self.tries.first(), now)  # first: the driver sends it before it sets any timer
        if self._keepalive_s > 0 and not self.done:
            self.out(Timer("keepalive", now + self._keepalive_s))
        return self._take()

    def attempt(self, number: int) -> Attempt | None:
        """The attempt with this number, while the core still reads its answer."""
        return self._live.get(number)

    def sent(self, number: int, on_connection: bool, now: float) -> None:
        """The request is on a connection (or, False, moving to a fresh one)."""
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.record.request_sent(on_connection, now)

    def opened(self, number: int, status: int, headers: Mapping[str, str], now: float, *,
               faulted: bool = False) -> list[Command]:
        attempt = self._live.get(number)
        if attempt is not None:
            if not faulted and attempt.takes_faults and self._fault(attempt):
                if not isinstance(attempt, SocketAttempt):
                    return self._take()  # the driver reports the head again, through the fault
            attempt.opened(self, status, headers, now)
        return self._take()

    def refused(self, number: int, status: int, headers: list[tuple[str, str]], body: bytes,
                now: float) -> list[Command]:
        """A WebSocket upgrade answered with something other than 101."""
        attempt = self._live.get(number)
        if isinstance(attempt, SocketAttempt):
            attempt.refused(self, status, headers, body, now)
        return self._take()

    def open_failed(self, number: int, why: str, error: BaseException | None, now: float) -> list[Command]:
        """No head: `why` is connect_timeout, head_timeout or transport (`error` says which)."""
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.open_failed(self, why, error, now)
        return self._take()

    def body_read(self, number: int, body: bytes, complete: bool, error: BaseException | None, timed_out: bool,
                  now: float) -> list[Command]:
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.body_read(self, body, complete, error, timed_out, now)
        return self._take()

    def data(self, number: int, chunk: bytes, now: float) -> list[Command]:
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.data(self, chunk, now)
        return self._take()

    def message(self, number: int, raw: bytes, now: float) -> list[Command]:
        """A WebSocket message: one whole frame of the answer."""
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.data(self, raw, now)
        return self._take()

    def ended(self, number: int, error: BaseException | Closed | None, now: float) -> list[Command]:
        """The answer's body ended (None: cleanly), broke off, or its socket closed."""
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.ended(self, error, now)  # type: ignore[arg-type]
        return self._take()

    def timed_out(self, number: int, now: float) -> list[Command]:
        attempt = self._live.get(number)
        if attempt is not None:
            attempt.timed_out(self, now)
        return self._take()

    def due(self, name: TimerName, now: float) -> list[Command]:
        if self.done:
            return self._take()
        if name == "keepalive":
            if not self.client.answered:
                self.client.keepalive()
                self.out(Timer("keepalive", now + self._keepalive_s))
        elif name == "backoff" and self._after_backoff is not None:
            step, self._after_backoff = self._after_backoff, None
            self._open(step, now)
        elif name == "hedge":
            self._hedge(now)
        return self._take()

    def client_gone(self) -> list[Command]:
        """The client left: nothing more is written, every answer is stopped."""
        if not self.done:
            self.end.client_gone()
            self._finish(release=False)
        return self._take()

    def crashed(self, what: str) -> list[Command]:
        """A bug: it costs this exchange, told to the client in the API's shape."""
        if not self.done:
            self.end.internal_error(what)
            self.finish()
        return self._take()

    # --- what attempts ask of the core (attempt.Core) -------------------------------------

    def out(self, *commands: Command) -> None:
        self._outbox.extend(commands)

    def failed(self, attempt: Attempt, info: ErrorInfo, now: float, *, timed_out: bool = False,
               headers: Mapping[str, str] | None = None, forward: Callable[[], None] | None = None,
               kind: FailureKind | None = None) -> None:
        verdict = judge(info, attempt.step, self.settings, self.policy, timed_out=timed_out, headers=headers)
        plan = verdict.plan
        self.log.failed(attempt.record, info, verdict.outcome, plan.delay_s if plan.action == "retry" else None)
        self.tries.failed(attempt.upstream.name, info, verdict.decision, kind, headers, now)
        if len(self._live) > 1 and (verdict.decision is not Decision.FATAL or self._asked_before(attempt)):
            # the attempt hedged against it carries on; a hedge's fatal failure (a backup's
            # wrong key) must not cost the answer of the upstream asked before it, which
            # without the hedge would have been the client's: kept for the end, should that fail
            self._drop(attempt)
            return
        if plan.action == "give_up" and forward is not None:
            for other in [a for a in self._live.values() if a is not attempt]:
                self._lost(other)
            self._answer_chosen()  # the client's answer is this failure: no hedge may follow it
            forward()  # the attempt goes on, passing the rest as it comes (or it finished the exchange)
            return
        self._drop(attempt)
        step = self.tries.after(attempt.step, plan)
        if step is None:
            self.end.exhausted(info.message, timed_out)
            self.finish()
        elif plan.action == "retry" and step.index == attempt.step.index:
            self._after_backoff = step
            self.out(Timer("backoff", now + plan.delay_s))
        else:
            self._open(step, now)

    def output(self, attempt: Attempt, step: GateStep) -> None:
        if step.committed:
            self.commit(attempt, step.first_event or "output")
        for failure in step.failures_after_output:
            attempt.failed_after_output(self, failure)
        if step.emit:
            self.client.write(step.emit)

    def commit(self, attempt: Attempt, first_event: str) -> None:
        """The first output: this attempt's answer is the client's from now on (one
        hedged against it is stopped before any of its bytes reach the client)."""
        self.commit_whole(attempt, first_event)
        if self.turn is not None:
            self.turn.committed(first_event)
        self.out(Timer("keepalive", None))
        self.client.passing_from(attempt.secrets)
        if self.client.headers_sent:
            self.client.announce(attempt.upstream.name)
        else:
            status, headers = attempt.head_for_client()
            self.client.start(status, forwarded_response_headers(headers), attempt.upstream.name)
        attempt.committed(self, first_event)

    def commit_whole(self, attempt: Attempt, first_event: str) -> None:
        """This attempt's answer is the client's, which the attempt writes itself (a whole
        answer; `commit` for a stream): an attempt hedged against it lost, and the outage
        memory hears that its upstream answered."""
        for other in [a for a in self._live.values() if a is not attempt]:
            self._lost(other)
        self._answer_chosen()
        self.tries.succeeded(attempt.upstream.name, attempt.record.started)
        self.end.committed(attempt.record, first_event)

    def cut(self, attempt: Attempt, message: str, code: Cut, now: float, closed: Closed | None = None) -> None:
        self._drop(attempt)  # given up on: it must not go on generating while another finishes the answer
        self.client.release()  # the client's bytes are what a continuation must not repeat
        if self.continuing is not None and self.continuing.begin(attempt, message, code, closed, now):
            return
        self.cut_ends(attempt.record, message, code, closed)

    def cut_ends(self, record: AttemptRecord, message: str, code: Cut, closed: Closed | None) -> None:
        """A cut answer that nothing finished ends with the cut: an in-band error, or
        (a WebSocket turn whose upstream closed) the close."""
        if closed is not None:
            self.end.settled()
            self.out(CloseClient(closed.code, closed.reason))
        else:
            self.end.cut(record, message, code)
        self.finish()

    def open_attempt(self, attempt: Attempt, request_over: Open) -> None:
        """Another kind's attempt (a continuation) joins the exchange."""
        self._live[attempt.number] = attempt
        self.client.attempts = len(self.exchange.attempts)
        self.out(request_over)

    def finish(self) -> None:
        self._finish(release=True)

    def stop(self, attempt: Attempt) -> None:
        """Done with this attempt's answer (read to its end, or given up on)."""
        self._drop(attempt)

    # --- inside -----------------------------------------------------------------------------

    def _take(self) -> list[Command]:
        commands, self._outbox = self._outbox, []
        return commands

    def _drop(self, attempt: Attempt) -> None:
        if self._live.pop(attempt.number, None) is not None:
            self.out(Stop(attempt.number, drop=attempt.drops_on_stop))
        if self._hedged_from == attempt.number:
            self._hedged_from = None
            self.out(Timer("hedge", None))

    def _asked_before(self, attempt: Attempt) -> bool:
        """Whether an upstream before this one in the order is still being asked (this
        one is a hedge against it)."""
        return any(other.step.index < attempt.step.index for other in self._live.values() if other is not attempt)

    def _answer_chosen(self) -> None:
        """The client's answer is one attempt's from now on (its output, or its failure
        forwarded as sent): no other upstream is asked beside it."""
        self._committed = True
        if self._hedged_from is not None:
            self._hedged_from = None
            self.out(Timer("hedge", None))

    def _lost(self, attempt: Attempt) -> None:
        """Of two attempts hedged against each other, the other produced output first."""
        attempt.lose()
        attempt.record.lost_hedge()
        observe.emit(logging.INFO, "switchyard.hedge_lost", route=self.route.name, upstream=attempt.upstream.name,
                     attempt=attempt.number, **self.log.context)
        self._drop(attempt)

    def _hedge(self, now: float) -> None:
        """The attempt the timer ran for has produced no output yet: the next upstream is asked beside it."""
        slow = self._live.get(self._hedged_from) if self._hedged_from is not None else None
        self._hedged_from = None
        step = self.tries.hedge()
        if slow is None or self._committed or len(self._live) != 1 or step is None:
            return
        observe.emit(logging.INFO, "switchyard.hedged", route=self.route.name, upstream=slow.upstream.name,
                     attempt=slow.number, also=step.upstream.name, after_s=self._hedge_s, **self.log.context)
        self._open(step, now, hedge=True)

    def _finish(self, *, release: bool) -> None:
        if self.done:
            return
        self.done = True
        if release:
            self.client.release()
        for attempt in list(self._live.values()):
            self._drop(attempt)
        self.tries.end()
        # it points back here: a cycle that only a full collection would free, which
        # stops the loop for all it walks (addons/heap.py); a done exchange needs it no more
        self.continuing = None
        self.out(Timer("keepalive", None), Timer("backoff", None), Timer("hedge", None), Finished())

    def _fault(self, attempt: Attempt) -> bool:
        """This attempt's fault, if one is due: one pick per attempt, once its upstream
        answered (a fault never invents one), marked on its record and logged."""
        faults = self.faults
        fault = faults.pick(self.route.name, attempt.record.upstream) if faults is not None else None
        if fault is None:
            return False
        record = attempt.record
        record.injected(fault.kind)
        observe.emit(logging.INFO, "switchyard.fault_injected", route=self.route.name, upstream=record.upstream,
                     attempt=record.attempt, kind=fault.kind, after_frames=fault.after_frames, **self.log.context)
        speaks = attempt.upstream.api if attempt.upstream.api is not None else self.api.name
        self.out(Inject(record.attempt, fault, speaks))
        return True

    def _open(self, step: UpstreamTry, now: float, *, over_http: bool = False, hedge: bool = False,
              replacing: AttemptRecord | None = None) -> None:
        turn = self.turn
        if turn is not None and turn.warm_up and not (not over_http and speaks_websocket(self, step.upstream)):
            if replacing is not None:
                self.exchange.attempts.remove(replacing)
            warm_up_here(self, turn, step, now)
            return
        made = new_attempt(self, step, now, over_http=over_http, hedge=hedge, replacing=replacing)
        if isinstance(made, Untranslatable):
            # not asked: the route goes on as after a failure before output (docs/translation.md)
            attempt, info = untranslatable(self, step, now, made)
            self._live[attempt.number] = attempt
            # with no upstream left after it, the client hears this reason in its own API, not an earlier failure
            told = in_client_shape(self.api.name, info, attempt.record)
            self.failed(attempt, info, now, forward=partial(self._tell, told, info))
            return
        attempt, command = made
        self._live[attempt.number] = attempt
        self.client.attempts = len(self.exchange.attempts)
        self.tries.opened(step)
        self.out(command)
        if self._hedge_s > 0 and len(self._live) == 1 and self.tries.hedge() is not None:
            self._hedged_from = attempt.number
            self.out(Timer("hedge", now + self._hedge_s))

    def _tell(self, told: Answered, info: ErrorInfo) -> None:
        self.end.forward(told, info)
        self.finish()

    def reopen_over_http(self, attempt: Attempt, now: float) -> None:
        """A WebSocket upgrade refused by an upstream that speaks HTTP: the same try,
        over HTTP; the refused upgrade was no attempt of the turn.  The new attempt takes
        its place and number: a hedge opened meanwhile has the next one, and must keep it."""
        self._live.pop(attempt.number, None)
        self._open(attempt.step, now, over_http=True, hedge=attempt.record.hedge, replacing=attempt.record)
