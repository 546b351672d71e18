"""A client's Responses WebSocket, terminated in the relay.

The Router sends a matched upgrade to the relay like any routed request;
the relay answers 101 and this session takes the connection over: mitmproxy
then carries the client's messages to it and its messages to the client
(and shows them in the flow).  The session speaks WebSocket (wsproto) as a
server towards mitmproxy and as a client towards upstreams.

Each client `response.create` is a turn, run to its end before the next
(one response at a time, as a Responses WebSocket does): a `TurnLoop`
through the same attempt loop and gate as an HTTP stream.  A turn may be
re-sent while no earlier turn of the connection produced output; it then
goes to the connection's upstream first and on through the route's next ones.
Later turns go to the upstream that answered.  Everything the upstream sends
reaches the client in order, its close last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import observe
from ..apis.errors import rewrite_capacity_codes
from ..apis.openai_responses import error_event_payload
from ..attempts.carry import as_http_body, as_message, fold, is_warm_up, parse_create, with_answer
from ..attempts.faulty_messages import FaultStep, FaultyMessages
from ..attempts.turn import TRANSPORT, Turn, TurnLoop, narrowed
from ..exchange import Exchange, OriginalRequest
from ..redaction import env_secrets
from ..rules import Upstream
from ..upstreams.body import Body
from ..upstreams.client import UpstreamClient
from ..upstreams.messages import UpstreamRequest
from ..upstreams.websocket import Binary, Closed, UpstreamSocket, open_socket, redact_message
from .websocket_server import UNSENDABLE_CLOSE, ClientSocket

if TYPE_CHECKING:
    from .connection import RelayConnection

# the handshake's own headers, and what a turn's POST sets itself (the openai SDK's handshake
# carries a Content-Type: kept, the POST would have two)
_HANDSHAKE_ONLY = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                             "sec-websocket-protocol", "upgrade", "connection", "content-type", "content-length"})

# turns and other messages waiting for the one in progress: past this many, the client's side
# is not read until one is taken (Codex sends one turn at a time)
QUEUED_LIMIT = 16


def _header(headers: tuple[tuple[str, str], ...], name: str) -> str:
    return next((value for key, value in headers if key.lower() == name), "")


class WebSocketSession:
    def __init__(self, exchange: Exchange, connection: "RelayConnection", http: UpstreamClient,
                 counters: Counter[str]) -> None:
        self.exchange = exchange
        self.route = exchange.route
        self.connection = connection
        self.http = http
        self.counters = counters
        self.client = ClientSocket(self.route.name, self._from_client, self._client_closed, self._client_lost)
        self.client.paused = self._hold_upstream
        self._held: set[str] = set()  # why the client's side is not read now (see _hold_client)
        self._inbox: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()  # turns and messages, in order
        self._task: asyncio.Task[None] | None = None
        # the upstream side: the connection's upstream (index into the route's), its socket
        self._current = 0
        self._link: UpstreamSocket | None = None
        self._link_upstream: str | None = None
        self._secrets: tuple[bytes, ...] = ()  # what the socket's upstream's `${VAR}`s hold: never passed on
        self._turn_inbox: asyncio.Queue[bytes | Closed] | None = None
        self._fault: FaultyMessages | None = None  # the attempt's fault, until it fires (see receive)
        self._plain: Callable[[bytes], bool] | None = None  # see pass_plain_content
        self.last_passed = 0.0  # when the hot path last passed a message (the turn's idle bound counts it)
        self.held_for_client = False  # the client is not reading: the upstream is held (see _hold_upstream)
        self._producer: Body | None = None  # a turn's HTTP answer being passed on (see pace)
        self._sent: Callable[[bytes], None] | None = None  # told each message of the turn (see keep_sent)
        self._http_only: set[str] = set()
        self._rewrite = False  # what the last turn left is after output: capacity codes rewritten
        self._turns = 0
        self._had_output = False
        # output-less turns (warm-ups), by response id: their body and the socket they live on; and
        # turns whose answer a continuation finished, their answer in their input (on no socket)
        self._carried: dict[str, tuple[dict[str, Any], UpstreamSocket | None]] = {}
        self.story: dict[str, Any] = exchange.story if exchange.story is not None else {}
        self.story.setdefault("turns", [])
        # each turn's request: the handshake's headers (credentials included, for build_request
        # to keep or drop per upstream), as a JSON POST where a turn goes over HTTP
        self._turn_headers = (*((k, v) for k, v in exchange.request.headers if k.lower() not in _HANDSHAKE_ONLY),
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
                    self._hold_client("queued", False)
                kind, value = item
                if kind == "create":
                    await self._turn(*value)
                else:
                    self._forward(value)
        except asyncio.CancelledError:
            pass  # the client left
        finally:
            if self._link is not None:
                self._link.close(1000)
                self._link = None
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
        elif self._link is not None and self._link.open:
            self._forward(message)  # now, also during a turn
        else:
            self._inbox.put_nowait(("other", message))
        if self._inbox.qsize() >= QUEUED_LIMIT:
            self._hold_client("queued", True)

    def _hold_client(self, why: str, held: bool) -> None:
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
        if self._link is not None:
            self._link.close(code if code not in UNSENDABLE_CLOSE else 1000, reason)
            self._link = None
        self._client_lost()

    def _client_lost(self) -> None:
        self.connection.relay.connections.discard(self.connection)
        self._inbox.put_nowait(None)
        if self._task is not None and not self._task.done():
            self._task.cancel()  # a turn in progress is nobody's now

    def _hold_upstream(self, paused: bool) -> None:
        """While mitmproxy is not reading, neither is the upstream socket (and its quiet
        meanwhile is no stall: the turn's idle bound counts from when the client reads again)."""
        self.held_for_client = paused
        if not paused:
            self.last_passed = time.monotonic()
        if self._producer is not None:
            self._producer.hold(paused)
        link = self._link
        if link is not None and link.transport is not None and not link.transport.is_closing():
            if paused:
                link.transport.pause_reading()
            else:
                link.transport.resume_reading()

    def pace(self, producer: Body | None) -> None:
        """A turn's HTTP answer, held back while the client reads nothing (None: it ended)."""
        self._producer = producer
        if producer is not None and self.held_for_client:
            producer.hold(True)

    def _forward(self, message: str | bytes) -> None:
        """A client message that starts no turn: to the connection's upstream socket."""
        link = self._link
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

    async def _turn(self, text: str, body: dict[str, Any]) -> None:
        self._turns += 1
        upstreams = self.route.upstreams
        resendable = not self._had_output
        current = upstreams[self._current]
        turn = Turn(self._turns, text, body, resendable,
                    upstreams[self._current:] if resendable else (narrowed(current),))
        why = ("the connection's upstream" if self._current == 0 else "the upstream that answered the connection")
        why += ", and the next ones if it fails before output" if resendable else "; never re-sent after output"
        turn.story = {"turn": turn.number, "warm_up": is_warm_up(body), "resendable": resendable, "why": why}
        self.story["turns"].append(turn.story)
        folded = fold(body, {rid: carried for rid, (carried, _) in self._carried.items()})
        request = OriginalRequest.of("POST", self.exchange.request.url, self._turn_headers,
                                     as_http_body(folded), {"stream": True}, self.exchange.request.address)
        exchange = Exchange(token="", route=self.route, request=request, faults=self.exchange.faults)
        loop = TurnLoop(exchange, self.http, self, turn)
        self.counters["websocket_turns"] += 1
        try:
            await loop.run()
        except asyncio.CancelledError:
            exchange.outcome = "client_gone"
            raise
        except Exception as exc:  # a bug must cost one turn, never the proxy
            observe.log.exception(observe.format_event("switchyard.internal_error", route=self.route.name,
                                                       transport=TRANSPORT, turn=turn.number))
            exchange.outcome = "internal_error"
            loop.end.internal_error(type(exc).__name__)
        finally:
            self._after_turn(turn, exchange)
            loop.log.finished()

    def _after_turn(self, turn: Turn, exchange: Exchange) -> None:
        self._sent = None
        self._rewrite = self.route.settings.rewrite_capacity_codes and (turn.output or not turn.resendable)
        pending, self._turn_inbox, self._plain, self._fault = self._turn_inbox, None, None, None
        while pending is not None and not pending.empty():
            self._from_upstream(pending.get_nowait())  # what came after the turn's end, in order
        answered = exchange.answered_by
        names = [u.name for u in self.route.upstreams]
        if answered in names:
            self._current = names.index(answered)
            if self._link is not None and self._link_upstream != answered:
                self.drop(self._link)  # the connection's turns go elsewhere now (another upstream, or HTTP)
        if turn.output:
            self._had_output = True
            if turn.continued is not None:
                rid, answer = turn.continued
                self._carried[rid] = (with_answer(turn.body, answer), None)
        elif turn.response_id is not None and exchange.outcome == "committed":
            self._carried[turn.response_id] = (turn.body, turn.link)
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

    def _continuations(self, turn: Turn, exchange: Exchange) -> None:
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

    def keep_sent(self, sent: Callable[[bytes], None]) -> None:
        """Until the turn ends, `sent` is told each message the client gets (to keep
        what a continuation must not repeat)."""
        self._sent = sent

    # --- the upstream side (for TurnLoop) --------------------------------------------

    def speaks_websocket(self, upstream: Upstream) -> bool:
        """Over WebSocket unless the rules say not, it refused the upgrade before, or an
        upstream proxy is in between (only HTTP goes through one here)."""
        return upstream.websocket is not False and upstream.name not in self._http_only and not self.http.proxied

    def use_http(self, upstream: Upstream, status: int) -> None:
        self._http_only.add(upstream.name)
        observe.emit(logging.INFO, "switchyard.websocket_refused", route=self.route.name, upstream=upstream.name,
                     status=status, transport=TRANSPORT, note="asked over HTTP from now on")

    async def link(self, upstream: Upstream, request: UpstreamRequest) -> UpstreamSocket:
        """The connection's socket to `upstream`, opened if need be."""
        link = self._link
        if link is not None and link.open and self._link_upstream == upstream.name:
            return link
        if link is not None:
            self.drop(link)
        settings = self.route.settings
        link = await open_socket(request, self.http.tls_context, connect_timeout_s=settings.connect_timeout_s,
                                 handshake_timeout_s=settings.headers_timeout_s or None)
        self._link, self._link_upstream, self._secrets = link, upstream.name, env_secrets(upstream)
        link.listen(self._from_upstream_of(link))
        link.paused = self._upstream_paused_of(link)
        if self.held_for_client and link.transport is not None:
            link.transport.pause_reading()  # a retry's or fallback's socket, while the client reads nothing
        return link

    def _upstream_paused_of(self, link: UpstreamSocket) -> Callable[[bool], None]:
        def paused(held: bool) -> None:
            if link is self._link:
                self._hold_client("upstream", held)
        return paused

    def drop(self, link: UpstreamSocket, *, broken: bool = False) -> None:
        """Close a socket whose messages must reach nobody from now on (`broken`: break it off)."""
        link.listen(None)
        link.paused = None
        if broken:
            link.abort()
        else:
            link.close(1000)
        if self._link is link:
            self._link, self._link_upstream = None, None
            self._hold_client("upstream", False)

    def receive(self, fault: FaultyMessages | None = None) -> "asyncio.Queue[bytes | Closed]":
        """An attempt's own inbox: what the socket sends from now on (earlier leftovers are
        not its), through the attempt's fault if it has one."""
        self._plain = None
        self._fault = fault
        self._turn_inbox = asyncio.Queue()
        return self._turn_inbox

    def message_for(self, turn: Turn, link: UpstreamSocket) -> str:
        """The turn as this socket should get it: as the client sent it, or with the
        warm-ups that live on other connections folded in."""
        elsewhere = {rid: body for rid, (body, on) in self._carried.items() if on is not link}
        folded = fold(turn.body, elsewhere)
        return turn.text if folded is turn.body else as_message(folded)

    def _from_upstream_of(self, link: UpstreamSocket) -> Any:
        def receive(item: bytes | Closed) -> None:
            if link is not self._link:
                return
            fault = self._fault
            if fault is None:
                self._from_upstream(item)
            else:
                self._faulted(link, fault.feed(item))
        return receive

    def _faulted(self, link: UpstreamSocket, step: FaultStep) -> None:
        """A real item through the attempt's fault: at the fault point the real socket
        goes (its rest must reach nobody) and the fault's items take its place."""
        if step.cut is not None:
            self._fault = None
            self.drop(link, broken=step.cut == "abort")
        for item in step.items:
            self._from_upstream(item)

    def pass_plain_content(self, worth_a_look: "Callable[[bytes], bool] | None") -> None:
        """After a turn's output: its plain answer content (what `worth_a_look` lets
        by) goes to the client from the socket's own callback, as an HTTP stream's
        does, instead of waking the turn for each message.  None: every message
        goes to the turn again."""
        self._plain = worth_a_look
        self.last_passed = time.monotonic()

    def _from_upstream(self, item: bytes | Closed) -> None:
        inbox = self._turn_inbox
        if inbox is not None:
            look = self._plain
            if (look is not None and inbox.empty() and not isinstance(item, Closed | Binary)
                    and not look(item)):
                self.last_passed = time.monotonic()
                self.to_client(item)  # the hot path
                return
            inbox.put_nowait(item)
        elif isinstance(item, Closed):
            self.closed_in_turn(item)
        elif self._rewrite and isinstance(item, bytes) and not isinstance(item, Binary):
            self.to_client(rewrite_capacity_codes(item))  # between turns: what a turn left, after its output
        else:
            self.to_client(item)

    def closed_in_turn(self, closed: Closed) -> None:
        """The upstream closed: the client gets the close, after every message before it."""
        self._link, self._link_upstream = None, None
        self._hold_client("upstream", False)
        self.client.close(closed.code, closed.reason)
        self._inbox.put_nowait(None)

    # --- the client's side -----------------------------------------------------------

    def to_client(self, message: bytes) -> None:
        """A message for the client, text or binary; an upstream's own `${VAR}` values in
        it are redacted (a message is whole: no value is split across two)."""
        message = redact_message(message, self._secrets)
        self.client.send(message)
        if self._sent is not None:
            self._sent(message)

    def break_client(self, why: str) -> None:
        self.client.failed(why)
        self._inbox.put_nowait(None)
