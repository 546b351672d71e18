"""What the relay keeps of one routed flow, from the Router's hook to its answer.

A ticket is issued in the `request` hook (its token goes to the relay in a
header, once); an HTTP exchange's driver starts then, so that the first
upstream is already asked while mitmproxy passes the flow on.  When
mitmproxy's connection with the token arrives, the relay attaches that
connection's answer to the driver (relay/server.py).  One writer per fact:
the Router fills in what it knows before the ticket is issued; the relay
writes the head it answers with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..attempts.driver import Driver
from ..attempts.outages import Outages
from ..exchange import Exchange
from ..faults import FaultPlan
from .direct_line import FindClient

MitmproxyStreams = Callable[[], "tuple[asyncio.StreamReader, asyncio.StreamWriter] | None"]


@dataclass(frozen=True, slots=True)
class AnswerHead:
    """The head the client gets, as the attempt core decided it.  mitmproxy is first
    sent a provisional head by the relay (see relay/server.py); the Router's
    `responseheaders` hook waits for this one and puts it in its place."""

    status: int
    headers: tuple[tuple[str, str], ...]
    streamed: bool  # the body follows as it arrives; else it is whole (and has a Content-Length)


@dataclass(slots=True, eq=False)
class Ticket:
    token: str
    exchange: Exchange
    faults: FaultPlan | None = None
    outages: Outages | None = None  # what the rules it was routed on learnt of upstreams' outages
    upstream_proxy: str | None = None  # the upstream-mode proxy the flow's listener sends through, if any
    websocket: bool = False  # a WebSocket handshake: the relay terminates it (relay/websocket_session.py)
    # the relay may answer mitmproxy with a provisional head before the real one is known
    provisional_head: bool = False
    # mitmproxy's own reader and writer of the relay connection this exchange comes on,
    # if they can be found (then the answer goes to mitmproxy in-process: relay/direct_line.py)
    mitmproxy_streams: MitmproxyStreams | None = None
    story: dict[str, Any] | None = None  # a WebSocket's story, shown live in the flow's metadata
    driver: Driver | None = None  # an HTTP exchange's, running from the moment it was routed
    head: "asyncio.Future[AnswerHead] | None" = None  # set when the relay begins a provisional answer
    # how to reach the client without mitmproxy once it has the head (relay/direct_line.py):
    # set by the Router's `responseheaders` hook where that can be byte for byte the same
    client_end: "FindClient | None" = None
