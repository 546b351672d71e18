"""Routes matched flows through the loopback relay and shows mitmweb the truth.

`route` (the `request` hook, run from the end of mitmproxy's addon chain)
records the original request and re-aims the flow at the relay with a
single-use token.  `responseheaders` enables streaming for the relay's SSE
answer and puts back the URL of the upstream that answered; `response` does
it again (headers may have left before the winner was known) and writes the
flow's story into its metadata and comment (flow_story.py).  Flows that match
no route are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from mitmproxy import addonmanager, command, connection, ctx, hooks, http
from mitmproxy.http import Headers

from .. import observe
from ..exchange import Exchange, FlowAddress, OriginalRequest
from ..observe import METADATA_KEY
from ..apis.google_gemini import model_in_path
from ..relay import PROVISIONAL_HEADER, TOKEN_HEADER, Relay
from ..relay.connection import reason_phrase
from ..relay.mitmproxy_reader import relay_streams
from ..upstreams import UpstreamClient
from ..upstreams.messages import redact_query
from .destination import destination, named_url
from .flow_story import DisplayCopy, annotate, restore, show_attempts
from .heap import freeze_startup_heap
from .rules_keeper import RulesKeeper
from .streaming_note import StreamingNoteDeferral

UPSTREAM_OPTIONS = {"ssl_insecure", "ssl_verify_upstream_trusted_ca", "ssl_verify_upstream_trusted_confdir", "upstream_auth"}

# Routed flows not yet answered, by flow id.  Module-level, not the Router's: when
# mitmproxy reloads the script (its file changed) it makes a new Router, and the
# flows still streaming must still get their real head, their URL and their story.
# (mitmproxy re-imports the script file only, never this package.)
_LIVE: dict[str, Exchange] = {}
# The Routers of the scripts loaded now (a reload replaces one): a flow held in an
# intercept across a reload is routed by the current one, never by a finished one.
_RUNNING: list["Router"] = []


def _proxy_of(server: connection.Server) -> str | None:
    """The upstream proxy mitmproxy would send this flow through: its listener's
    upstream mode (each `--mode` is its own listener; regular and reverse ones have none)."""
    if server.via is None:
        return None
    scheme, (host, port) = server.via
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}"


class Router:
    def __init__(self, keeper: RulesKeeper) -> None:
        self.keeper = keeper
        self.relay: Relay | None = None
        self._live = _LIVE
        self.counters: Counter[str] = Counter()
        self._notes = StreamingNoteDeferral()
        self._start: asyncio.Task[Relay] | None = None  # the relay's start, from `running`
        self._direct = True
        self._last = LastInLine(self)

    # --- lifecycle ------------------------------------------------------------

    def load(self, loader: addonmanager.Loader) -> None:
        loader.add_option(
            name="switchyard_direct_relay",
            typespec=bool,
            default=True,
            help="Hand the relay's answers to mitmproxy in-process instead of through the loopback "
            "socket: the same bytes for less CPU. Off: every answer goes through the socket.",
        )

    def configure(self, updated: set[str]) -> None:
        if "switchyard_direct_relay" in updated:
            self._direct = ctx.options.switchyard_direct_relay
        if self.relay is not None and updated & UPSTREAM_OPTIONS:
            self.relay.replace_client(self._upstream_client())

    def _upstream_client(self) -> UpstreamClient:
        """The relay's upstream side honours mitmproxy's own upstream settings."""
        return UpstreamClient(
            verify=not ctx.options.ssl_insecure,
            ca_file=ctx.options.ssl_verify_upstream_trusted_ca,
            ca_dir=ctx.options.ssl_verify_upstream_trusted_confdir,
            # defined by mitmproxy's UpstreamAuth addon, absent where that is not loaded
            proxy_auth=ctx.options.upstream_auth if "upstream_auth" in ctx.options else None,
        )

    # `running` and `done` are synchronous: mitmproxy calls them so when it loads the
    # script into a running proxy or reloads it after an edit (an async one raises there)

    def running(self) -> None:
        if self not in _RUNNING:
            _RUNNING.append(self)
        self._notes.install()
        if self._last not in ctx.master.addons:
            ctx.master.addons.add(self._last)
        self._start = asyncio.get_running_loop().create_task(self._ensure_relay())
        self._start.add_done_callback(_report_start_failure)
        view = ctx.master.addons.get("view")  # mitmweb's and the console's flow list; mitmdump has none
        if freeze_startup_heap(view.store_count() if view is not None else 0):
            observe.emit(logging.DEBUG, "switchyard.startup_heap_frozen")

    def done(self) -> None:
        if self in _RUNNING:
            _RUNNING.remove(self)
        self._notes.uninstall()
        if self._last in ctx.master.addons:
            ctx.master.addons.remove(self._last)
        if self._start is not None:
            self._start.cancel()
            self._start = None
        if self.relay is not None:
            self.relay.retire()  # a reload: the streams in flight finish on it, new flows go to the next
            self.relay = None

    async def _ensure_relay(self) -> Relay:
        relay = self.relay
        if relay is None:
            relay = self.relay = Relay(self._upstream_client())
        await relay.start()  # `done` may run meanwhile (a reload): then it is stopped, see `route`
        return relay

    # --- hooks ------------------------------------------------------------------

    async def route(self, flow: http.HTTPFlow) -> None:
        """The `request` hook, from the end of the chain (see `LastInLine`)."""
        rules = self.keeper.rules
        if rules is None or flow.response is not None or flow.error is not None or flow.id in self._live:
            return
        if "websocket" in flow.request.headers.get("upgrade", "").lower():
            return  # a WebSocket handshake: mitmproxy relays its messages (WebSocketTurns), not the relay
        parsed: list[Any] = []  # the JSON body, parsed at most once, only if a route needs it

        def body() -> Any:
            if not parsed:
                parsed.append(_json_of(flow))
            return parsed[0]

        host, address = destination(flow)
        route = rules.route_for(host, flow.request.path, lambda: _requested_model(flow.request.path, body))
        if route is None:
            return
        request = flow.request
        if request.raw_content is None:  # streamed to the origin already (stream_large_bodies)
            observe.emit(logging.WARNING, "switchyard.not_routed", route=route.name,
                         reason="request body was streamed (stream_large_bodies); raise that option to route it")
            return
        relay = await self._ensure_relay()
        if relay.stopped:  # the script was reloaded while the relay started: the new Router routes it
            successor = _RUNNING[-1] if _RUNNING and _RUNNING[-1] is not self else None
            if successor is not None:
                await successor.route(flow)
            return
        assert relay.port is not None
        original = OriginalRequest.of(
            request.method,
            request.url if address is None else named_url(request, host),
            tuple(request.headers.items(multi=True)),
            request.raw_content,
            body(),
            address,
        )
        # HTTP/1 only: a client that leaves closes its connection, which mitmproxy
        # acts on even while a hook waits (an HTTP/2 stream reset is queued)
        exchange = relay.register(route, original, self.keeper.faults,
                                  provisional_head=request.http_version.startswith("HTTP/1"))
        self._live[flow.id] = exchange
        if self._direct:
            exchange.mitmproxy_streams = lambda: relay_streams(flow)
        flow.metadata[METADATA_KEY] = {"route": route.name, "api": route.api, "original_url": redact_query(original.url)}
        data = request.data
        exchange.flow_address = FlowAddress(data.scheme, data.host, data.port, data.authority, data.path, data.method)
        request.scheme = "http"
        request.host = "127.0.0.1"
        request.port = relay.port
        # the relay reads only the token, and whether an answer may have a body: a path or
        # method its strict parser refuses (a raw non-ASCII query, a lowercase or unknown
        # method), which mitmproxy accepts, must not cost the flow its answer
        data.path = b"/"
        data.method = b"HEAD" if data.method.upper() == b"HEAD" else b"POST"
        request.headers[TOKEN_HEADER] = exchange.token
        # mitmproxy picks the connection by the request's address and scheme and the
        # flow's `via` and transport: plain TCP to the relay, no upstream proxy in
        # between.  Where the flow's server says otherwise (upstream-proxy mode) it gets
        # a fresh one (`via` cannot be cleared on an open tunnel); only there, since
        # creating one is measurable on the first token
        server = flow.server_conn
        exchange.upstream_proxy = _proxy_of(server)
        if server.via is not None or server.transport_protocol != "tcp":
            flow.server_conn = connection.Server(address=("127.0.0.1", relay.port))
        self.counters["routed"] += 1
        relay.send_first(exchange)

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        exchange = self._live.get(flow.id)
        if exchange is None or flow.response is None:
            return
        # display first: once a provisional head's real one is decided, every step
        # delays the first token (a fallback's URL is shown at the end, in `response`)
        restore(flow, exchange)
        response = flow.response
        streamed = "text/event-stream" in response.headers.get("content-type", "").lower()
        if PROVISIONAL_HEADER in response.headers and exchange.head is not None:
            # the relay answered at once; the real head comes when the attempt loop decides
            head = await exchange.head
            response.status_code = head.status
            response.reason = reason_phrase(head.status)
            response.headers = Headers([(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
                                        for k, v in head.headers])
            streamed = head.streamed
            if streamed:  # mitmproxy sends the head now, and logs that it streams: after the first token
                self._notes.expect(flow.client_conn.peername)
        # the relay's connection is mitmproxy's own business; the client's need not
        # close: frame the body for it as the upstream would have
        response.headers.pop("connection", None)
        if streamed:
            response.stream = DisplayCopy()
            if flow.request.http_version == "HTTP/1.1" and "content-length" not in response.headers:
                response.headers["transfer-encoding"] = "chunked"  # (HTTP/1.0 has no chunks: the close ends it)

    def response(self, flow: http.HTTPFlow) -> None:
        exchange = self._live.pop(flow.id, None)
        if exchange is None or flow.response is None:
            return
        self._notes.forget(flow.client_conn.peername)
        if self.relay is not None:
            self.relay.forget(exchange.token)  # answered by someone else (another addon)
        restore(flow, exchange)
        stream = flow.response.stream
        if isinstance(stream, DisplayCopy) and not flow.response.raw_content:
            flow.response.content = b"".join(stream.chunks)
        annotate(flow, exchange, self.counters)
        show_attempts(flow, exchange)

    def error(self, flow: http.HTTPFlow) -> None:
        exchange = self._live.pop(flow.id, None)
        if exchange is not None:
            self._notes.forget(flow.client_conn.peername)
            if self.relay is not None:
                self.relay.forget(exchange.token)
            restore(flow, exchange)
            annotate(flow, exchange, self.counters)
            show_attempts(flow, exchange)

    # --- commands -------------------------------------------------------------

    @command.command("switchyard.status")
    def status(self) -> str:
        """Routes, upstreams (with whether their credentials are present) and counters."""
        rules = self.keeper.rules
        lines = [f"rules: {rules.source if rules else '(none loaded)'}"]
        for route in rules.routes if rules else ():
            strategies = route.settings.continue_after_cut
            lines.append(f"route {route.name} ({route.api})"
                         + (f"; continue_after_cut={','.join(strategies)}" if strategies else ""))
            for upstream in route.upstreams:
                where = "original destination" if upstream.is_original else upstream.display_url
                auth = "own auth set" if upstream.auth else ("client's credentials" if upstream.is_original else "no auth")
                lines.append(f"  upstream {upstream.name}: {where}; {auth}; retries={upstream.retries}"
                             + ("; prefill" if upstream.prefill else ""))
        for warning in rules.warnings if rules else ():
            lines.append(f"warning: {warning}")
        if self.keeper.faults is not None:
            lines.extend(f"fault: {line}" for line in self.keeper.faults.describe())
        counts = ", ".join(f"{k}={self.counters[k]}" for k in ("routed", "attempts", "failed_attempts", "retries_answered",
                                                             "fallbacks", "suppressed_failovers",
                                                             "continued_after_cut", "continuations_failed"))
        lines.append(f"counters: {counts}")
        if self.relay is not None:
            relay = self.relay
            lines.append(f"relay: 127.0.0.1:{relay.port}, in flight={relay.in_flight}, unused tokens={relay.pending}, "
                         f"answers={relay.answers} (in-process={relay.direct_answers})")
        text = "\n".join(lines)
        observe.log.info(text)
        return text


class LastInLine:
    """The Router's `request` hook, run after every other addon's.

    A script's addons sit where mitmproxy's script loader sits in the addon chain:
    before map-remote, modify-body, server replay and the interactive intercept,
    and before scripts loaded after this one.  A flow re-aimed at the relay there
    would reach those with the relay's URL, and what they changed would be lost.
    From the end of the chain the Router routes the request as it will be sent:
    an intercepted flow once the user has resumed it, with their edits."""

    name = "switchyard_route_last"  # mitmproxy's name for this addon; unique in the chain

    def __init__(self, router: Router) -> None:
        self.router = router

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.intercepted:
            # mitmproxy tells mitmweb and the console about a flow's state once every
            # addon's hook has returned; this one is about to wait: tell them now
            await ctx.master.addons.trigger_event(hooks.UpdateHook([flow]))
        while flow.intercepted:  # until resumed, or killed (a kill wakes no waiter: look again now and then)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):
                    await flow.wait_for_resume()
        router = self.router if self.router in _RUNNING else (_RUNNING[-1] if _RUNNING else None)
        if router is not None:  # None: the script was unloaded while the flow was held
            await router.route(flow)


def _report_start_failure(task: "asyncio.Task[Relay]") -> None:
    """A relay that cannot listen is said at once (the first routed flow tries again)."""
    if not task.cancelled() and task.exception() is not None:
        observe.emit(logging.ERROR, "switchyard.relay_failed", error=str(task.exception()))


def _json_of(flow: http.HTTPFlow) -> Any:
    request = flow.request
    try:
        body = request.raw_content if "content-encoding" not in request.headers else request.get_content(strict=False)
        return json.loads(body or b"")
    except (ValueError, RecursionError):
        return None


def _requested_model(path: str, body: Callable[[], Any]) -> str | None:
    """The model a request names: in its path for Gemini, else the JSON body's `model`."""
    in_path = model_in_path(path)
    if in_path is not None:
        return in_path
    found = body()
    model = found.get("model") if isinstance(found, dict) else None
    return model if isinstance(model, str) else None
