"""A terminated WebSocket's upstream side: the connection's socket, and what its
items reach.

One socket at a time is the connection's (`current`), to the upstream that
answers its turns.  While a turn's attempt converses on it, its items go to
that attempt (through the attempt's fault, if one was injected); between turns
they go to the client as they come (what a turn left after its end), the
close included.  A socket whose later messages must reach nobody is dropped.
This is the session's `SocketSide` (attempts/driver.py): the attempt core never
holds a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..attempts.faulty_messages import FaultyMessages
from ..faults import FaultSpec
from ..redaction import env_secrets
from ..rules import Route, Upstream
from ..upstreams.client import UpstreamClient
from ..upstreams.messages import UpstreamRequest
from ..upstreams.websocket import UpstreamSocket, open_socket
from ..ws_items import Closed, Item


class Session(Protocol):
    """What the sockets need of the session they serve (websocket_session.py)."""

    route: Route

    def turn_message(self, link: UpstreamSocket) -> str:
        """The turn in progress as this socket should get it."""
        ...

    def turn_released(self) -> None: ...

    def use_http(self, upstream: str, status: int) -> None: ...

    def closed_in_turn(self, closed: Closed) -> None: ...

    def hold_client(self, why: str, held: bool) -> None: ...

    def between_turns(self, item: Item) -> None: ...


class UpstreamSockets:
    def __init__(self, session: Session, http: UpstreamClient) -> None:
        self.session = session
        self.http = http
        self.current: UpstreamSocket | None = None
        self.current_upstream: str | None = None
        self.secrets: tuple[bytes, ...] = ()  # what the current socket's upstream's `${VAR}`s hold
        self.held_for_client = False  # the client is not reading: the upstream is held
        self._by_attempt: dict[int, UpstreamSocket] = {}  # the current turn's attempts' sockets
        # the sockets a turn's attempt converses on: where their items go, through which fault
        self._talks: dict[UpstreamSocket, tuple[Callable[[Item], None], FaultyMessages | None]] = {}
        self._upstream_of: dict[UpstreamSocket, str] = {}
        self.answered: UpstreamSocket | None = None  # the socket whose attempt the current turn kept

    # --- the attempt core's SocketSide -------------------------------------------------

    async def open(self, attempt: int, upstream: str, request: UpstreamRequest, connect_s: float | None) -> None:
        link = self.current
        if link is None or not link.open or self.current_upstream != upstream or link in self._talks:
            if link is not None and link not in self._talks:
                self.drop(link)  # the turns go elsewhere: what it still sends must reach nobody
            # a fresh socket: to another upstream, or beside one a live attempt converses on (a hedge)
            link = await open_socket(request, self.http.tls_context, connect_timeout_s=connect_s or 0,
                                     handshake_timeout_s=None)  # (the driver bounds the handshake)
            self._upstream_of[link] = upstream
            link.listen(self._from_upstream_of(link))
            link.paused = self._upstream_paused_of(link)
            if self.held_for_client and link.transport is not None:
                link.transport.pause_reading()  # a retry's or fallback's socket, while the client reads nothing
            if self.current is None or not self.current.open:
                self._make_current(link)
        self._by_attempt[attempt] = link

    def converse(self, attempt: int, receive: Callable[[Item], None], fault: FaultSpec | None) -> None:
        link = self._by_attempt.get(attempt)
        if link is None:
            return
        self._talks[link] = (receive, FaultyMessages(fault, self.session.route.api) if fault is not None else None)
        link.send_text(self.session.turn_message(link))  # the real message, fault or not

    def release(self, attempt: int, drop: bool) -> None:
        link = self._by_attempt.pop(attempt, None)
        if link is None:
            return
        self._talks.pop(link, None)
        if not self._talks:
            self.session.turn_released()
        if drop or not link.open or (self._talks and link is not self.current):
            # (a hedge that failed beside an attempt still answering the turn: its socket
            # is not the turn's, and must not take the place of the one still answering)
            self.drop(link)
            return
        if link is not self.current:  # the turn was answered on it: the connection's socket from now on
            if self.current is not None:
                self.drop(self.current)
            self._make_current(link)
        self.answered = link

    def use_http(self, upstream: str, status: int) -> None:
        self.session.use_http(upstream, status)

    def close_client(self, code: int, reason: str) -> None:
        self.session.closed_in_turn(Closed(code, reason))

    # --- the sockets ----------------------------------------------------------------------

    def _make_current(self, link: UpstreamSocket) -> None:
        upstream = self._upstream_of.get(link)
        found = next((u for u in self.session.route.upstreams if u.name == upstream), None)
        self.current, self.current_upstream = link, upstream
        self.secrets = env_secrets(found) if found is not None else ()

    def drop(self, link: UpstreamSocket, *, broken: bool = False) -> None:
        """Close a socket whose messages must reach nobody from now on (`broken`: break it off)."""
        link.listen(None)
        link.paused = None
        self._talks.pop(link, None)
        self._upstream_of.pop(link, None)
        if broken:
            link.abort()
        else:
            link.close(1000)
        if self.current is link:
            self.current, self.current_upstream = None, None
            self.session.hold_client("upstream", False)
        if self.answered is link:
            self.answered = None

    def forget(self) -> None:
        """The connection's turns go elsewhere now (another upstream, or HTTP)."""
        if self.current is not None:
            self.drop(self.current)

    def close(self) -> None:
        for link in [*self._talks, *([self.current] if self.current is not None else [])]:
            link.close(1000)
        self._talks.clear()
        self.current = None

    def hold(self, paused: bool) -> None:
        """While mitmproxy is not reading, neither are the upstream sockets."""
        self.held_for_client = paused
        for link in {*self._talks, *([self.current] if self.current is not None else [])}:
            if link.transport is not None and not link.transport.is_closing():
                if paused:
                    link.transport.pause_reading()
                else:
                    link.transport.resume_reading()

    def _upstream_paused_of(self, link: UpstreamSocket) -> Callable[[bool], None]:
        def paused(held: bool) -> None:
            if link is self.current or link in self._talks:
                self.session.hold_client("upstream", held)
        return paused

    def _from_upstream_of(self, link: UpstreamSocket) -> Callable[[Item], None]:
        def receive(item: Item) -> None:
            talk = self._talks.get(link)
            if talk is None:
                if link is self.current:
                    self.session.between_turns(item)  # what a turn left after its end
                return
            deliver, fault = talk
            if fault is None:
                deliver(item)
                return
            step = fault.feed(item)
            if step.cut is not None:
                # the fault point: the real socket goes (its rest must reach nobody) and
                # the fault's items take its place
                self.drop(link, broken=step.cut == "abort")
            for faulted in step.items:
                deliver(faulted)
        return receive
