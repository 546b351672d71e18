"""The Responses API over WebSocket: the same rule for each turn, without a relay.

mitmproxy relays WebSocket messages itself, so this addon works on its
`websocket_message` hook: a dropped message never reaches the other side and
`inject.websocket` sends one either way.  Each client `response.create` starts
a turn.  The server's lifecycle messages of a turn are held until its first
output (DESIGN §3, `openai-responses`), then sent in order, followed by
everything else.

A retryable failure before output in the *first* turn of a connection is
dropped, with what was held and the rest of that attempt, and the turn's
`response.create` is sent again on the same connection within the first
upstream's budget.  A WebSocket is bound to one upstream, so there is no next
upstream here.  Later turns may depend on state the server keeps for the
connection (`previous_response_id`), so they are never re-sent: their failures,
and any failure after output, are forwarded (capacity codes rewritten) and
`switchyard.failover_suppressed_after_semantic_output` is logged.

Ordering: a message injected from a hook is sent after the messages mitmproxy
is already relaying, so while injected messages are on their way to the
client, every server message is dropped and injected behind them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import ctx, http, websocket

from .. import observe
from ..observe import METADATA_KEY
from ..apis import Decision, ErrorInfo, ErrorPolicy, FrameKind
from ..apis.errors import CAPACITY_CODES, rewrite_capacity_codes
from ..apis.openai_responses import NAME as RESPONSES, ResponsesStream, error_event_payload
from ..redaction import redact, secret_values
from ..retry import plan_after_failure
from ..rules.loader import Route
from ..sse import SseEvent
from .destination import destination
from .rules_keeper import RulesKeeper

TRANSPORT = "websocket"
PASSED = "passed_through"  # a later turn's outcome: never held, never re-sent


def _response_ref(message: websocket.WebSocketMessage) -> tuple[str | None, str | None]:
    """The id of the response a message belongs to, when it names one, and the
    message's type: both from one parse."""
    if not message.is_text:
        return None, None
    try:
        obj = json.loads(message.content)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    response = obj.get("response")
    found = response.get("id") if isinstance(response, dict) else None
    kind = obj.get("type")
    return (found if isinstance(found, str) else None), (kind if isinstance(kind, str) else None)


def _message_type(message: websocket.WebSocketMessage) -> str | None:
    return _response_ref(message)[1]


def _response_id(message: websocket.WebSocketMessage) -> str | None:
    """Most server messages are deltas, which name no response: those are not parsed
    (their type, `"response.output_text.delta"`, holds `"response` but not the key)."""
    if not message.is_text or b'"response"' not in message.content:
        return None
    return _response_ref(message)[0]


_RESPONSE_ENDS = frozenset({"response.completed", "response.failed", "response.incomplete"})
UNNAMED = ""  # a timed-out response whose id was never seen


@dataclass
class _Turn:
    number: int
    create: bytes  # the client's response.create, exactly as sent
    started: float = field(default_factory=time.monotonic)
    attempt: int = 1
    stream: ResponsesStream = field(default_factory=ResponsesStream)
    held: list[tuple[bytes, bool]] = field(default_factory=list)  # (content, is_text)
    held_size: int = 0
    committed: bool = False  # output started or a failure was forwarded: pass through
    output: bool = False  # real output (or the staging bound) reached the client
    suppressing: bool = False  # failures from here on are forwarded, rewritten and logged
    discarding: bool = False  # dropping a failed attempt until the re-sent create goes out
    response_id: str | None = None  # the current attempt's response id, once the server names it
    failure: tuple[bytes, bool] | None = None  # the failure a pending retry replaced
    timer: asyncio.Task[None] | None = None
    story: dict[str, Any] = field(default_factory=dict)

    def new_attempt(self) -> None:
        self.attempt += 1
        self.started = time.monotonic()
        self.stream = ResponsesStream()
        self.held.clear()
        self.held_size = 0
        self.discarding = False
        self.response_id = None
        self.story["attempts"].append({"attempt": self.attempt, "outcome": "pending"})


@dataclass
class _Conn:
    flow: http.HTTPFlow
    route: Route
    turns: int = 0
    turn: _Turn | None = None
    to_client_in_flight: int = 0  # injected messages not yet relayed to the client
    # responses of failed attempts: never forwarded, also once the client has started another turn
    stale_ids: set[str] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    story: dict[str, Any] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # credential values of the handshake and the route, never logged
    # a timed-out response still running on the connection: its late messages (deltas name no
    # response) are dropped until it ends or the server names another response, whatever the turn
    draining: str | None = None  # its id; UNNAMED when it timed out before naming itself
    draining_turn: "_Turn | None" = None

    @property
    def upstream(self) -> str:
        """Who the turns go to: the server the client connected to.  That is the route's
        first upstream only when it is `url: original` (a WebSocket is not re-aimed)."""
        first = self.route.upstreams[0]
        return first.name if first.is_original else "original"

    @property
    def budget(self) -> int:
        first = self.route.upstreams[0]
        return first.retries if first.is_original else self.route.settings.retries


class WebSocketTurns:
    def __init__(self, keeper: RulesKeeper) -> None:
        self.keeper = keeper
        self._conns: dict[str, _Conn] = {}

    # --- hooks ----------------------------------------------------------------

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        rules = self.keeper.rules
        if rules is None:
            return
        route = rules.route_for(destination(flow)[0], flow.request.path, lambda: None)
        if route is None or route.api != RESPONSES:
            return
        conn = _Conn(flow, route, secrets=secret_values(flow.request.headers.items(multi=True), route.upstreams))
        conn.story = {"route": route.name, "api": route.api, "transport": TRANSPORT,
                      "upstream": conn.upstream, "turns": []}
        flow.metadata[METADATA_KEY] = conn.story
        self._conns[flow.id] = conn
        observe.emit(logging.INFO, "switchyard.websocket_tracked", route=route.name, upstream=conn.upstream,
                     transport=TRANSPORT)
        first = route.upstreams[0]
        if not first.is_original:
            observe.emit(logging.WARNING, "switchyard.websocket_stays_with_original", route=route.name,
                         upstream=first.name, transport=TRANSPORT,
                         note="a WebSocket goes to the server the client connected to; the route's upstreams "
                              "are used for HTTP only")

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        conn = self._conns.pop(flow.id, None)
        if conn is None:
            return
        if conn.to_client_in_flight:
            # mitmproxy drops injections still queued when the connection closes
            observe.emit(logging.WARNING, "switchyard.websocket_closed_with_pending", route=conn.route.name,
                         transport=TRANSPORT, messages=conn.to_client_in_flight)
        for task in list(conn.tasks):
            task.cancel()
        turn = conn.turn
        if turn is not None:
            self._cancel_timer(turn)
            attempt = turn.story["attempts"][-1]
            if attempt["outcome"] == "pending":
                attempt["outcome"] = "closed"

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        conn = self._conns.get(flow.id)
        if conn is None or flow.websocket is None or not flow.websocket.messages:
            return
        message = flow.websocket.messages[-1]
        if message.injected:
            self._injected(conn, message)
        elif message.from_client:
            self._from_client(conn, message)
        else:
            self._from_server(conn, message)

    # --- client side ----------------------------------------------------------

    def _injected(self, conn: _Conn, message: websocket.WebSocketMessage) -> None:
        if not message.from_client:
            conn.to_client_in_flight = max(0, conn.to_client_in_flight - 1)
            return
        turn = conn.turn
        if turn is not None and turn.discarding and message.content == turn.create:
            # the re-sent create goes out now: what the server sends from here is the new attempt's
            turn.new_attempt()
            self._arm_timer(conn, turn)

    def _from_client(self, conn: _Conn, message: websocket.WebSocketMessage) -> None:
        if _message_type(message) != "response.create":
            return
        previous = conn.turn
        if previous is not None:
            self._cancel_timer(previous)
            if previous.discarding and previous.failure is not None:
                # the client moved on during our backoff: it gets the failure it would have had
                previous.story["attempts"][-1]["outcome"] = "abandoned"
                self._inject_to_client(conn, *previous.failure)
            elif not previous.committed and previous.held:
                self._send_held(conn, previous)  # the client moved on: what was held is its own
        conn.turns += 1
        turn = _Turn(conn.turns, bytes(message.content))
        turn.story = {"turn": turn.number, "attempts": [{"attempt": 1, "outcome": "pending"}]}
        conn.story["turns"].append(turn.story)
        conn.turn = turn
        if turn.number > 1:
            # later turns are never re-sent, so holding their messages would buy nothing
            turn.committed = turn.suppressing = True
            turn.story["attempts"][-1]["outcome"] = PASSED
            return
        self._arm_timer(conn, turn)

    # --- server side ----------------------------------------------------------

    def _from_server(self, conn: _Conn, message: websocket.WebSocketMessage) -> None:
        if conn.draining is not None and self._drained(conn, message):
            return
        turn = conn.turn
        if turn is None:
            self._deliver(conn, message)
            return
        if turn.discarding or (conn.stale_ids and _response_id(message) in conn.stale_ids):
            message.drop()  # the rest of a failed attempt
            return
        if turn.response_id is None and not turn.committed:
            turn.response_id = _response_id(message)
        if turn.committed:
            self._after_commit(conn, turn, message)
            self._deliver(conn, message)
            return
        text = message.text if message.is_text else None
        if text is None:
            result_kind, result = FrameKind.OUTPUT, None  # binary: unknown, fail closed
        else:
            result = turn.stream.classify(SseEvent(data=text))
            result_kind = result.kind
        if result_kind in (FrameKind.FAILURE, FrameKind.EMPTY_END):
            assert result is not None
            info = result.error if result_kind is FrameKind.FAILURE else None
            info = info or ErrorInfo(message="empty answer", event_type=result.event_type, retryable_hint=True)
            self._failure(conn, turn, info, message=message)
            return
        if result_kind in (FrameKind.OUTPUT, FrameKind.TERMINAL):
            self._commit(conn, turn, message, result.event_type if result else "binary")
            return
        # keepalive-free lifecycle: hold it
        message.drop()
        turn.held.append((bytes(message.content), message.is_text))
        turn.held_size += len(message.content)
        if turn.held_size > conn.route.settings.staging_limit:
            self._commit(conn, turn, None, "staging_limit")

    def _drained(self, conn: _Conn, message: websocket.WebSocketMessage) -> bool:
        """Whether `message` was the timed-out response's, and dropped.

        Only a response's own events go: an `error` names no response and may be
        the next turn's (a create rejected with 429), so it passes, and ends the
        draining (the silent response may have died with one like it)."""
        rid, kind = _response_ref(message)
        if rid is not None and rid in conn.stale_ids:
            message.drop()  # an earlier failed attempt's straggler: neither the silent response nor a new one
            return True
        if rid is not None and rid != conn.draining:
            if conn.draining == UNNAMED and conn.turn is conn.draining_turn:
                conn.draining = rid  # no turn since the timeout: this can only be the silent response
            else:
                conn.draining = None  # the server moved on: from here it is the new turn's
                return False
        if rid is None and not (kind or "").startswith("response."):
            conn.draining = None
            return False
        if rid is not None and kind in _RESPONSE_ENDS:
            conn.draining = None  # its last message
        message.drop()
        return True

    def _after_commit(self, conn: _Conn, turn: _Turn, message: websocket.WebSocketMessage) -> None:
        """After output or a forwarded failure: look for failures, rewrite, log."""
        if not message.is_text or (turn.output and not turn.stream.worth_a_look(message.content)):
            return
        result = turn.stream.classify(SseEvent(data=message.text))
        if result.kind is FrameKind.OUTPUT:
            turn.output = True  # a later turn's output: failures from now on come after it
        if result.kind is not FrameKind.FAILURE or not turn.suppressing:
            return
        info = result.error
        first_failure = turn.story["attempts"][-1]["outcome"] == PASSED
        if turn.number > 1 and not turn.output and info is not None and first_failure:
            self._record_failure(conn, turn, info, "not_resent")  # a later turn: forwarded, never re-sent
        if conn.route.settings.rewrite_capacity_codes and info is not None and info.code in CAPACITY_CODES:
            message.content = rewrite_capacity_codes(message.content)
        self._log_suppressed(conn, turn, info, result.event_type)

    def _commit(self, conn: _Conn, turn: _Turn, message: websocket.WebSocketMessage | None,
                first_event: str | None) -> None:
        self._cancel_timer(turn)
        turn.committed = True
        turn.output = True
        turn.suppressing = True
        attempt = turn.story["attempts"][-1]
        attempt.update(outcome="committed", first_event=first_event)
        fields = dict(route=conn.route.name, upstream=conn.upstream, transport=TRANSPORT, turn=turn.number,
                      attempt=turn.attempt, first_event=first_event)
        if turn.attempt > 1:
            observe.emit(logging.INFO, "switchyard.retry_answered", **fields)
        else:
            observe.emit(logging.DEBUG, "switchyard.committed", **fields)
        self._send_held(conn, turn)
        if message is not None:
            self._deliver(conn, message)

    def _failure(self, conn: _Conn, turn: _Turn, info: ErrorInfo, *, message: websocket.WebSocketMessage | None,
                 timed_out: bool = False) -> None:
        settings = conn.route.settings
        decision = ErrorPolicy(settings.retry_on).decide(info)
        delay = 0.0
        if timed_out:
            # the silent response cannot be stopped on this connection, and its late
            # messages could not be told from a re-sent turn's: report, do not retry
            outcome = "give_up"
        elif turn.number == 1:
            plan = plan_after_failure(
                decision,
                tries_used=turn.attempt,
                budget=conn.budget,
                has_next=False,
                timed_out=False,
                retry_after=None,  # a WebSocket message carries no Retry-After header
                backoff_ms=settings.backoff_ms,
                max_backoff_ms=settings.max_backoff_ms,
            )
            outcome = "retry" if plan.action == "retry" else ("fatal" if decision is Decision.FATAL else "give_up")
            delay = plan.delay_s
        else:
            outcome = "not_resent"  # later turns may depend on the connection's state
        self._record_failure(conn, turn, info, outcome, delay if outcome == "retry" else None)
        if outcome == "retry":
            self._cancel_timer(turn)
            if message is not None:
                message.drop()
            turn.held.clear()
            turn.held_size = 0
            turn.discarding = True
            if turn.response_id is not None:
                conn.stale_ids.add(turn.response_id)
            if message is not None:
                turn.failure = (bytes(message.content), message.is_text)
            self._spawn(conn, self._resend(conn, turn, delay))
            return
        # forwarded as sent (first turn out of budget or fatal), or a later turn's failure
        self._cancel_timer(turn)
        turn.committed = True
        turn.suppressing = turn.number > 1
        if turn.suppressing:
            if message is not None and settings.rewrite_capacity_codes and info.code in CAPACITY_CODES:
                message.content = rewrite_capacity_codes(message.content)
            self._log_suppressed(conn, turn, info, info.event_type)
        self._send_held(conn, turn)
        if message is not None:
            self._deliver(conn, message)
        elif timed_out:
            self._inject_to_client(conn, error_event_payload(f"switchyard: {info.message}", "upstream_timeout"), True)
            turn.discarding = True  # the rest of the silent response, if it ever comes, is dropped
            turn.failure = None  # an earlier attempt's, replaced by the retry that went silent: told already
            # ... even once the client has started another turn
            conn.draining, conn.draining_turn = (turn.response_id or UNNAMED), turn

    def _record_failure(self, conn: _Conn, turn: _Turn, info: ErrorInfo, outcome: str,
                        delay_s: float | None = None) -> None:
        """The attempt's story in the flow's metadata, and its decision line in the log."""
        message = redact(info.message, conn.secrets)
        turn.story["attempts"][-1].update(outcome=outcome, event=info.event_type, status=info.status,
                                          code=info.code or info.type, message=message)
        observe.emit(
            logging.INFO if outcome == "retry" else logging.WARNING,
            "switchyard.attempt_failed",
            route=conn.route.name,
            upstream=conn.upstream,
            transport=TRANSPORT,
            turn=turn.number,
            attempt=turn.attempt,
            status=info.status,
            code=info.code,
            type=info.type,
            event=info.event_type,
            decision=outcome,
            delay_s=round(delay_s, 3) if delay_s is not None else None,
            message=message,
        )

    async def _resend(self, conn: _Conn, turn: _Turn, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        if conn.turn is turn and turn.discarding and conn.flow.id in self._conns:
            ctx.master.commands.call("inject.websocket", conn.flow, False, turn.create, True)

    # --- first-output timeout -------------------------------------------------

    def _arm_timer(self, conn: _Conn, turn: _Turn) -> None:
        limit = conn.route.settings.first_output_timeout_s
        if limit and limit > 0:
            turn.timer = self._spawn(conn, self._expire(conn, turn, turn.attempt, limit))

    def _cancel_timer(self, turn: _Turn) -> None:
        timer, turn.timer = turn.timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _expire(self, conn: _Conn, turn: _Turn, attempt: int, limit: float) -> None:
        await asyncio.sleep(limit)
        if conn.turn is not turn or turn.attempt != attempt or turn.committed or turn.discarding:
            return
        turn.timer = None
        info = ErrorInfo(status=504, message=f"no output within {limit:g}s", event_type="timeout",
                         retryable_hint=True)
        self._failure(conn, turn, info, message=None, timed_out=True)

    # --- delivery -------------------------------------------------------------

    def _deliver(self, conn: _Conn, message: websocket.WebSocketMessage) -> None:
        """Let a server message through, behind any injected messages still on their way."""
        if conn.to_client_in_flight:
            message.drop()
            self._inject_to_client(conn, bytes(message.content), message.is_text)

    def _send_held(self, conn: _Conn, turn: _Turn) -> None:
        held, turn.held = turn.held, []
        turn.held_size = 0
        for content, is_text in held:
            self._inject_to_client(conn, content, is_text)

    def _inject_to_client(self, conn: _Conn, content: bytes, is_text: bool) -> None:
        conn.to_client_in_flight += 1
        ctx.master.commands.call("inject.websocket", conn.flow, True, content, is_text)

    def _spawn(self, conn: _Conn, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)
        return task

    def _log_suppressed(self, conn: _Conn, turn: _Turn, info: ErrorInfo | None, event_type: str | None) -> None:
        conn.story["suppressed_failover"] = True
        observe.emit(
            logging.WARNING,
            observe.SUPPRESSED_AFTER_OUTPUT,
            route=conn.route.name,
            upstream=conn.upstream,
            api=conn.route.api,
            transport=TRANSPORT,
            turn=turn.number,
            after="output" if turn.output else "later_turn",
            event=event_type,
            status=info.status if info else None,
            code=(info.code or info.type) if info else None,
            message=redact(info.message, conn.secrets) if info else None,
        )
