"""The WebSocket session's hold on its upstream socket while the client reads nothing,
with a real loopback upstream: a socket opened meanwhile (a retry's, a fallback's) is
held from its first byte, not only the one open when the hold began."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from switchyard_core.exchange import Exchange, OriginalRequest
from switchyard_core.relay.ticket import Ticket
from switchyard_core.relay.websocket_session import WebSocketSession
from switchyard_core.rules.loader import load_rules
from switchyard_core.upstreams.client import UpstreamClient
from switchyard_core.upstreams.messages import build_request

from tests.support.ws_provider import WsProvider


async def test_a_socket_opened_while_the_client_is_held_is_held_too(tmp_path: Path) -> None:
    provider = WsProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n"
                     "    upstreams: [{name: primary, url: original}]\n")
    route = load_rules(rules).routes[0]
    request = OriginalRequest(method="GET", url=provider.http_url, headers=(("Host", f"127.0.0.1:{provider.port}"),),
                              body=b"")
    connection: Any = SimpleNamespace()  # the relay connection: only `run` uses it
    session = WebSocketSession(Ticket("", Exchange(route, request)), connection, UpstreamClient(), Counter())
    try:
        session.client.pause_writing()  # mitmproxy stopped reading the client's answer
        await session.sockets.open(1, "primary", build_request(request, route.upstreams[0]), 10)
        link = session.sockets.current
        assert link is not None and link.transport is not None and not link.transport.is_reading()
        session.client.resume_writing()
        assert link.transport.is_reading()
        session.sockets.drop(link)
    finally:
        provider.stop()
