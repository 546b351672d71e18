"""A client's Responses WebSocket, terminated in the relay.

The Router sends a matched upgrade to the relay like any routed request;
the relay answers 101 and this session takes the connection over: mitmproxy
then carries the client's messages to it and its messages to the client
(and shows them in the flow).  The session speaks WebSocket (wsproto) as a
server towards mitmproxy and, through `UpstreamSockets`, as a client towards
upstreams.

Each client `response.create` is a turn, run to its end before the next
(one response at a time, as a Responses WebSocket does): an exchange of the
same attempt core as an HTTP stream (attempts/machine.py), driven over the
connection's upstream socket or over HTTP SSE.  A turn may be re-sent while no
earlier turn of the connection produced output; it then goes to the
connection's upstream first and on through the route's next ones.  Later turns
go to the upstream that answered.  Everything the upstream sends reaches the
client in order, its close last.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import observe
from ..apis.errors import rewrite_capacity_codes
from ..apis.openai_responses import error_event_payload, websocket_error
from ..attempts.carry import as_http_body, as_message, fold, is_warm_up, parse_create, with_answer
from ..attempts.driver import Driver
from ..attempts.machine import ExchangeMachine
from ..attempts.turn_context import TurnContext
from ..exchange import Exchange, OriginalRequest
from ..rules import Upstream
from ..sse import FrameSplitter
from ..upstreams.body import Body
from ..upstreams.client import UpstreamClient
from ..upstreams.websocket import UpstreamSocket
from ..ws_items import Binary, Closed, Item, redact_message
from .ticket import Ticket
from .upstream_sockets import UpstreamSockets
from .websocket_server import UNSENDABLE_CLOSE, ClientSocket

if TYPE_CHECKING:
    from .connection import RelayConnection

TRANSPORT = "websocket"
# the handshake's own headers, and what a turn's POST sets itself (the openai SDK's handshake
# carries a Content-Type: kept, the POST would have two)
_HANDSHAKE_ONLY = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                             "sec-websocket-protocol", "upgrade", "connection", "content-type", "content-length"})

# turns and other messages waiting for the one in progress: past this many, the client's side
# is not read until one is taken (Codex sends one turn at a time)
QUEUED_LIMIT = 16


def _header(headers: tuple[tuple[str, str], ...], name: str) -> str:
    return next((value for key, value in headers if key.lower() == name), "")


def narrowed(upstream: Upstream) -> Upstream:
    """An upstream tried once: a turn that may not be re-sent."""
    return replace(upstream, retries=0)


class TurnSink:
    """The core's `ClientSink` for a turn: whatever it writes as SSE reaches the
    client as messages, one per event (an HTTP answer's events, Switchyard's own
    in-band errors); a whole error body becomes an `error` message; a socket's
    messages pass as they are."""

    def __init__(self, session: "WebSocketSession", rewrite: bool) -> None:
        self.session = session
        self._splitter = FrameSplitter()
        self._started = False
        # a turn that may not be re-sent: its failures, forwarded as sent over HTTP, still
        # have their capacity codes rewritten (over WebSocket its gate does that)
        self._rewrite = rewrite

    @property
    def headers_sent(self) -> bool:
        return self._started

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._started = True

    def write(self, data: bytes) -> None:
        for frame in self._splitter.feed(data):
            event = frame.event
            if not event.comment_only and event.data is not None:
                message = event.data.encode()
                self.session.client.send(rewrite_capacity_codes(message) if self._rewrite else message)

    def message(self, data: bytes) -> None:
        self.session.client.send(data)

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._started = True
        self.session.client.send(websocket_error(status, body) if status >= 300 else body)

    def pace(self, producer: Body | None) -> None:
        """While the client reads nothing, the HTTP answer is held back as a socket's is."""
        self.session.pace(producer)

    def abort(self) -> None:
        self.session.break_client("upstream answer broke off")


class WebSocketSession:
    def __init__(self, ticket: Ticket, connection: "RelayConnection", http: UpstreamClient,
                 counters: Counter[str]) -> None:
        self.ticket = ticket
        self.exchange = ticket.exchange
        self.route = ticket.exchange.route
        self.connection = connection
        self.http = http
        self.counters = counters
        self.client = ClientSocket(self.route.name, self._from_client, self._client_closed, self._client_lost)
        self.client.paused = self._hold_upstream
        self.sockets = UpstreamSockets(self, http)
        self._held: set[str] = set()  # why the client's side is not read now (see hold_client)
        self._inbox: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()  # turns and messages, in order
        self._task: asyncio.Task[None] | None = None
        self._current = 0  # the connection's upstream (index into the route's)
        self._producer: Body | None = None  # a turn's HTTP answer being passed on (see pace)
        self._http_only: set[str] = set()
        self._rewrite = False  # what the last turn left is after output: capacity codes rewritten
        self._turn: TurnContext | None = None  # the turn in progress
        self._turns = 0
        self._had_output = False
        # output-less turns (warm-ups), by response id: their body and the socket they live on; and
        # turns whose answer a continuation finished, their answer in their input (on no socket)
        self._carried: dict[str, tuple[dict[str, Any], UpstreamSocket | None]] = {}
        self.story: dict[str, Any] = ticket.story if ticket.story is not None else {}
        self.story.setdefault("turns", [])
        # each turn's request: the handshake's headers (credentials included, for build_request
        # to keep or drop per upstream), as a JSON POST where a turn goes over HTTP
        self._turn_headers = (*((k, v) for k, v in self.exchange.request.headers if k.lower() not in _HANDSHAKE_ONLY),
                              ("Content-Type", "application/json"))

    # --- the connection's life -----------------------------------------------------

    async def run(self) -> None:
        transport = self.connection.transport
        assert transport is not None
        self._task = asyncio.current_task()
        self.client.take_over(transport, _header(self.exchange.request.headers, "sec-websocket-key"))
        self.counters["websocket_connections"] += 1
        observe.emit(logging.INFO, "switchyard.websocket_opened", route=self.route.name,
                     upstream=self.route.upstreams[0].name, transport=TRANSPORT)
        try:
            while True:
                item = await self._inbox.get()
                if item is None:
                    break
                if self._inbox.qsize() < QUEUED_LIMIT:
                    self.hold_client("queued", False)
                kind, value = item
                if kind == "create":
                    await self._run_turn(*value)
                else:
                    self._forward(value)
        except asyncio.CancelledError:
            pass  # the client left
        finally:
            self.sockets.close()
            self.client.close(1000, "")
            self.connection.relay.connections.discard(self.connection)
            turns = self.story["turns"]
            observe.emit(logging.INFO, "switchyard.websocket_closed", route=self.route.name, transport=TRANSPORT,
                         turns=len(turns), upstream=self.story.get("upstream"),
                         failed_attempts=sum(1 for t in turns for a in t.get("attempts", ())
                                             if a["outcome"] not in ("committed", "passed_through")
                                             and not a.get("continuation")))

    def _from_client(self, message: str | bytes) -> None:
        body = parse_create(message) if isinstance(message, str) else None
        if body is not None:
            self._inbox.put_nowait(("create", (message, body)))
        elif self.sockets.current is not None and self.sockets.current.open:
            self._forward(message)  # now, also during a turn
        else:
            self._inbox.put_nowait(("other", message))
        if self._inbox.qsize() >= QUEUED_LIMIT:
            self.hold_client("queued", True)

    def hold_client(self, why: str, held: bool) -> None:
        """The client's side is read only while nothing holds it: the upstream socket
        is writing what it has (it is not reading), or turns and messages wait queued.
        Each holds what the client can make Switchyard keep to a bound."""
        was = bool(self._held)
        if held:
            self._held.add(why)
        else:
            self._held.discard(why)
        transport = self.client.transport
        if was == bool(self._held) or transport is None or transport.is_closing():
            return
        if self._held:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _client_closed(self, code: int, reason: str) -> None:
        link = self.sockets.current
        if link is not None:
            link.close(code if code not in UNSENDABLE_CLOSE else 1000, reason)
            self.sockets.current = None
        self._client_lost()

    def _client_lost(self) -> None:
        self.connection.relay.connections.discard(self.connection)
        self._inbox.put_nowait(None)
        if self._task is not None and not self._task.done():
            self._task.cancel()  # a turn in progress is nobody's now

    def _hold_upstream(self, paused: bool) -> None:
        """While mitmproxy is not reading, neither is the upstream (and its quiet
        meanwhile is no stall: the turn's idle bound counts from when the client reads again)."""
        if self._producer is not None:
            self._producer.hold(paused)
        self.sockets.hold(paused)

    def pace(self, producer: Body | None) -> None:
        """A turn's HTTP answer, held back while the client reads nothing (None: it ended)."""
        self._producer = producer
        if producer is not None and self.sockets.held_for_client:
            producer.hold(True)

    def _forward(self, message: str | bytes) -> None:
        """A client message that starts no turn: to the connection's upstream socket."""
        link = self.sockets.current
        if link is None or not link.open:
            # never silently lost: the client hears that it went nowhere
            observe.emit(logging.WARNING, "switchyard.websocket_message_not_sent", route=self.route.name,
                         transport=TRANSPORT, reason="no upstream WebSocket is open for it")
            self.to_client(error_event_payload("switchyard: no upstream WebSocket is open for this message "
                                               "(only response.create starts a turn)", "no_upstream_connection",
                                               "invalid_request_error"))
            return
        if isinstance(message, str):
            link.send_text(message)
        else:
            link.send_bytes(message)

    # --- turns ---------------------------------------------------------------------

    async def _run_turn(self, text: str, body: dict[str, Any]) -> None:
        self._turns += 1
        upstreams = self.route.upstreams
        resendable = not self._had_output
        current = upstreams[self._current]
        turn = self._turn = TurnContext(self._turns, text, body, resendable,
                                        upstreams[self._current:] if resendable else (narrowed(current),),
                                        self.speaks_websocket)
        why = ("the connection's upstream" if self._current == 0 else "the upstream that answered the connection")
        why += ", and the next ones if it fails before output" if resendable else "; never re-sent after output"
        turn.story = {"turn": turn.number, "warm_up": is_warm_up(body), "resendable": resendable, "why": why}
        self.story["turns"].append(turn.story)
        folded = fold(body, {rid: carried for rid, (carried, _) in self._carried.items()})
        request = OriginalRequest.of("POST", self.exchange.request.url, self._turn_headers,
                                     as_http_body(folded), {"stream": True}, self.exchange.request.address)
        exchange = Exchange(self.route, request, listener=self.exchange.listener)  # shown live as the connection's
        rewrite = not resendable and self.route.settings.rewrite_capacity_codes
        machine = ExchangeMachine(exchange, TurnSink(self, rewrite), faults=self.ticket.faults, turn=turn,
                                  outages=self.ticket.outages)
        self.sockets.answered = None
        self.counters["websocket_turns"] += 1
        try:
            await Driver(machine, self.http, sockets=self.sockets).run()
        finally:
            self._after_turn(turn, exchange)
            machine.log.finished()

    def turn_message(self, link: UpstreamSocket) -> str:
        """The turn as this socket should get it: as the client sent it, or with the
        warm-ups that live on other connections folded in."""
        turn = self._turn
        assert turn is not None
        elsewhere = {rid: body for rid, (body, on) in self._carried.items() if on is not link}
        folded = fold(turn.body, elsewhere)
        return turn.text if folded is turn.body else as_message(folded)

    def turn_released(self) -> None:
        """The turn's attempt let go of the socket: what comes from now on is after its end."""
        turn = self._turn
        if turn is not None:
            self._rewrite = self.route.settings.rewrite_capacity_codes and (turn.output or not turn.resendable)

    def _after_turn(self, turn: TurnContext, exchange: Exchange) -> None:
        self._turn = None
        answered = exchange.answered_by
        names = [u.name for u in self.route.upstreams]
        if answered in names:
            self._current = names.index(answered)
            if self.sockets.current_upstream not in (None, answered):
                self.sockets.forget()  # the connection's turns go elsewhere now (another upstream, or HTTP)
        if turn.output:
            self._had_output = True
            if turn.continued is not None:
                rid, answer = turn.continued
                self._carried[rid] = (with_answer(turn.body, answer), None)
        elif turn.response_id is not None and exchange.outcome == "committed":
            link = self.sockets.answered if turn.socket_attempt is not None else None
            self._carried[turn.response_id] = (turn.body, link)
        attempts = exchange.attempts
        self.exchange.attempts.extend(attempts)
        self._continuations(turn, exchange)
        failed = [a for a in attempts
                  if a.outcome not in ("committed", "passed_through", "pending") and not a.continuation]
        if failed and exchange.outcome == "committed":
            first = failed[0]
            same = answered == first.upstream
            self.counters["websocket_retries_answered" if same else "websocket_fallbacks"] += 1
            what = f"{first.upstream} failed before output ({first.code or first.status or first.message})"
            turn.story["why"] = f"{what}: {'answered on retry' if same else f'{answered} answered'}"
        if exchange.suppressed_failover:
            self.counters["websocket_suppressed_failovers"] += 1
            self.story["suppressed_failover"] = True
        answering = [a for a in attempts if not a.continuation]
        over = "websocket" if answering and answering[-1].url.startswith("ws") else "http"
        turn.story.update(upstream=answered, transport=over, outcome=exchange.outcome,
                          attempts=[a.as_dict() for a in attempts])
        if answered is not None:
            self.story["upstream"] = answered

    def _continuations(self, turn: TurnContext, exchange: Exchange) -> None:
        """After a cut: who finished the turn's answer, or that nothing could (the
        story and counters an HTTP flow's say)."""
        tries = [a for a in exchange.attempts if a.continuation]
        if not tries:
            return
        cut = next((a for a in exchange.attempts if not a.continuation and a.outcome in ("committed", "passed_through")),
                   None)
        what = f"{cut.upstream}: {cut.message or 'cut after output'}" if cut else "cut after output"
        if exchange.outcome == "continued":
            self.counters["websocket_continued_after_cut"] += 1
            turn.story["why"] = f"{what} → {tries[-1].upstream} continued it ({tries[-1].continuation})"
        else:
            self.counters["websocket_continuations_failed"] += 1
            turn.story["why"] = f"{what} → {len(tries)} continuation(s) failed"

    # --- the upstream side -------------------------------------------------------------

    def speaks_websocket(self, upstream: Upstream) -> bool:
        """Over WebSocket unless the rules say not, it refused the upgrade before, or an
        upstream proxy is in between (only HTTP goes through one here)."""
        return upstream.websocket is not False and upstream.name not in self._http_only and not self.http.proxied

    def use_http(self, upstream: str, status: int) -> None:
        self._http_only.add(upstream)
        observe.emit(logging.INFO, "switchyard.websocket_refused", route=self.route.name, upstream=upstream,
                     status=status, transport=TRANSPORT, note="asked over HTTP from now on")

    def between_turns(self, item: Item) -> None:
        """What the socket sends while no turn's attempt reads it: what a turn left after its end."""
        if isinstance(item, Closed):
            self.closed_in_turn(item)
        elif self._rewrite and not isinstance(item, Binary):
            self.to_client(rewrite_capacity_codes(item))
        else:
            self.to_client(item)

    def closed_in_turn(self, closed: Closed) -> None:
        """The upstream closed: the client gets the close, after every message before it."""
        self.sockets.current, self.sockets.current_upstream = None, None
        self.hold_client("upstream", False)
        self.client.close(closed.code, closed.reason)
        self._inbox.put_nowait(None)

    # --- the client's side -----------------------------------------------------------

    def to_client(self, message: bytes) -> None:
        """A message for the client between turns; the socket's upstream's own `${VAR}`
        values in it are redacted (a message is whole: no value is split across two)."""
        self.client.send(redact_message(message, self.sockets.secrets))

    def break_client(self, why: str) -> None:
        self.client.failed(why)
        self._inbox.put_nowait(None)
