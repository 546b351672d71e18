"""Routes matched flows through the loopback relay and shows mitmweb the truth.

`route` (the `request` hook, run from the end of mitmproxy's addon chain)
records the original request and re-aims the flow at the relay with a
single-use token.  `responseheaders` enables streaming for the relay's SSE
answer and puts back the URL of the upstream that answered; `response` does
it again (headers may have left before the winner was known) and writes the
flow's story into its metadata and comment (flow_story.py).  Where flows are
seen, each attempt and the commit are shown as they happen (live_story.py).
Flows that match no route are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Any, NamedTuple

from mitmproxy import addonmanager, command, connection, ctx, hooks, http
from mitmproxy.http import Headers

from .. import observe
from ..exchange import OriginalRequest
from ..observe import METADATA_KEY
from ..apis.openai_responses import NAME as RESPONSES
from ..relay import PROVISIONAL_HEADER, TOKEN_HEADER, Relay, mitmproxy_reader
from ..relay.ticket import Ticket
from ..relay.connection import reason_phrase
from ..upstreams import UpstreamClient
from ..upstreams.client import ConnectHook
from ..upstreams.messages import redact_query
from .destination import destination, named_url, upstream_proxy_of
from .request_body import RequestBody, not_routed_too_large, read_body, requested_model
from .flow_story import DisplayCopy, FlowAddress, FlowView, annotate, lean_relay_request, restore
from .live_story import LiveStory
from . import chunked_reading, hook_dispatch
from .rules_keeper import RulesKeeper
from .status import status_text
from .streaming_note import StreamingNoteDeferral, unusable as streaming_note_unusable

UPSTREAM_OPTIONS = {"ssl_insecure", "ssl_verify_upstream_trusted_ca", "ssl_verify_upstream_trusted_confdir", "upstream_auth",
                    "http_connect_send_host_header"}

# Routed flows not yet answered, by flow id.  Module-level, not the Router's: when
# mitmproxy reloads the script (its file changed) it makes a new Router, and the
# flows still streaming must still get their real head, their URL and their story.
# (mitmproxy re-imports the script file only, never this package.)
_LIVE: dict[str, "Routed"] = {}
# The Routers of the scripts loaded now (a reload replaces one): a flow held in an
# intercept across a reload is routed by the current one, never by a finished one.
_RUNNING: list["Router"] = []


def _connect_upstream_hook() -> ConnectHook:
    hook = hooks.all_hooks["http_connect_upstream"]

    async def run(flow: http.HTTPFlow) -> None:
        """mitmproxy's own `http_connect_upstream`: its UpstreamAuth addon (or any
        other addon) sets the CONNECT's credentials, as for mitmproxy's own tunnels."""
        await ctx.master.addons.handle_lifecycle(hook(flow))

    return run


class Router:
    def __init__(self, keeper: RulesKeeper) -> None:
        self.keeper = keeper
        self.relay: Relay | None = None
        self._live = _LIVE
        self.counters: Counter[str] = Counter()
        self._notes = StreamingNoteDeferral()
        self._start: asyncio.Task[Relay] | None = None  # the relay's start, from `running`
        self._direct = True  # the option
        self._reader_reachable = False  # mitmproxy's readers can be reached (checked in `running`)
        self._last = LastInLine(self)
        self._websockets: dict[str, Routed] = {}  # terminated WebSockets still open, by flow id

    # --- lifecycle ------------------------------------------------------------

    def load(self, loader: addonmanager.Loader) -> None:
        loader.add_option(
            name="switchyard_direct_relay",
            typespec=bool,
            default=True,
            help="Hand the relay's answers to mitmproxy in-process instead of through the loopback socket, "
            "a held head to the client with the first content behind it, and a plain HTTP/1.1 client's streamed "
            "body straight to it once mitmproxy has sent the head: the same bytes, sooner. Off: the socket.",
        )

    def configure(self, updated: set[str]) -> None:
        if "switchyard_direct_relay" in updated:
            self._direct = ctx.options.switchyard_direct_relay
        if updated & UPSTREAM_OPTIONS:
            client = self._upstream_client()  # a malformed upstream_auth is refused here (OptionsError)
            if self.relay is not None:
                self.relay.replace_client(client)
            else:
                client.close()

    def _upstream_client(self) -> UpstreamClient:
        """The relay's upstream side honours mitmproxy's own upstream settings."""
        return UpstreamClient(
            verify=not ctx.options.ssl_insecure,
            ca_file=ctx.options.ssl_verify_upstream_trusted_ca,
            ca_dir=ctx.options.ssl_verify_upstream_trusted_confdir,
            # defined by mitmproxy's UpstreamAuth addon, absent where that is not loaded
            proxy_auth=ctx.options.upstream_auth if "upstream_auth" in ctx.options else None,
            connect_hook=_connect_upstream_hook(),
            connect_host_header=ctx.options.http_connect_send_host_header,
        )

    # `running` and `done` are synchronous: mitmproxy calls them so when it loads the
    # script into a running proxy or reloads it after an edit (an async one raises there)

    def running(self) -> None:
        if self not in _RUNNING:
            _RUNNING.append(self)
        self._check_mitmproxy_parts()
        if self._last not in ctx.master.addons:
            ctx.master.addons.add(self._last)
        self._start = asyncio.get_running_loop().create_task(self._ensure_relay())
        self._start.add_done_callback(_report_start_failure)

    def done(self) -> None:
        if self in _RUNNING:
            _RUNNING.remove(self)
        if not _RUNNING:
            chunked_reading.uninstall()
            hook_dispatch.uninstall()
        self._notes.uninstall()
        if self._last in ctx.master.addons:
            ctx.master.addons.remove(self._last)
        if self._start is not None:
            self._start.cancel()
            self._start = None
        if self.relay is not None:
            self.relay.retire()  # a reload: the streams in flight finish on it, new flows go to the next
            self.relay = None

    def _check_mitmproxy_parts(self) -> None:
        """What Switchyard takes from mitmproxy's private parts, checked once: each
        only saves time, and one that is not there costs that saving, never an answer."""
        direct_line = mitmproxy_reader.unusable(ctx.master)
        self._reader_reachable = direct_line is None
        note = streaming_note_unusable()
        if note is None:
            self._notes.install()
        hook_filter = None if observe.HOOK_HANDLERS else "mitmproxy.log has no LegacyLogEvents"
        parts = {"direct_line": direct_line, "streaming_note": note, "log_hook_filter": hook_filter,
                 "chunked_reader": chunked_reading.install(), "hook_dispatch": hook_dispatch.install()}
        observe.emit(logging.DEBUG if not any(parts.values()) else logging.INFO, "switchyard.mitmproxy_parts",
                     **{name: "active" if why is None else f"inactive: {why}" for name, why in parts.items()})

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
        if rules is None or not flow.live or flow.response is not None or flow.error is not None or flow.id in self._live:
            return  # (a flow read from a file, or replayed from one, is not live: never sent anywhere by us)
        websocket = "websocket" in flow.request.headers.get("upgrade", "").lower()
        parsed: list[RequestBody] = []  # the body, read at most once, only if a route needs it

        def body() -> RequestBody:
            if not parsed:
                parsed.append(read_body(flow.request))
            return parsed[0]

        host, address = destination(flow)
        route = rules.route_for(host, flow.request.path,
                                lambda: None if websocket else requested_model(flow.request.path, lambda: body().json))
        if route is None or (websocket and route.api != RESPONSES):
            if parsed and parsed[0].too_large:  # a route asked for its model: it could not be read
                not_routed_too_large(None)
            return  # (a WebSocket of another API: mitmproxy relays it as it is)
        request = flow.request
        if request.raw_content is None:  # streamed to the origin already (stream_large_bodies)
            observe.emit(logging.WARNING, "switchyard.not_routed", route=route.name,
                         reason="request body was streamed (stream_large_bodies); raise that option to route it")
            return
        content = body()
        if content.too_large:
            not_routed_too_large(route.name)
            return
        relay = await self._ensure_relay()
        if relay.stopped:  # the script was reloaded while the relay started: the new Router routes it
            successor = _RUNNING[-1] if _RUNNING and _RUNNING[-1] is not self else None
            if successor is not None:
                await successor.route(flow)
            return
        assert relay.port is not None
        headers = tuple(request.headers.items(multi=True))
        if content.decoded:  # upstreams get it as it was read: decoded (a `model:` rewrite needs it so)
            headers = tuple((name, value) for name, value in headers if name.lower() != "content-encoding")
        original = OriginalRequest.of(
            request.method,
            request.url if address is None else named_url(request, host),
            headers,
            content.raw,
            None if websocket else content.json,
            address,
        )
        story: dict[str, Any] = {"route": route.name, "api": route.api, "original_url": redact_query(original.url)}
        if websocket:
            # terminated in the relay, which tells each turn's story here as it goes
            story = {**story, "transport": "websocket", "turns": []}
        flow.metadata[METADATA_KEY] = story
        data = request.data
        display = FlowView(FlowAddress(data.scheme, data.host, data.port, data.authority, data.path, data.method))
        # where flows are seen (mitmweb, the console; mitmdump has no view), each attempt is shown as it ends
        view = ctx.master.addons.get("view")
        live = LiveStory(flow, view, None if websocket else display) if view is not None else None
        # mitmproxy picks the connection by the request's address and scheme and the
        # flow's `via` and transport: plain TCP to the relay, no upstream proxy in
        # between.  Where the flow's server says otherwise (upstream-proxy mode) it gets
        # a fresh one (`via` cannot be cleared on an open tunnel); only there, since
        # creating one is measurable on the first token
        server = flow.server_conn
        # HTTP/1 only: a client that leaves closes its connection, which mitmproxy
        # acts on even while a hook waits (an HTTP/2 stream reset is queued)
        provisional = request.http_version.startswith("HTTP/1") and not websocket
        ticket = relay.register(
            route, original, self.keeper.faults, outages=self.keeper.outages,
            provisional_head=provisional,
            websocket=websocket, upstream_proxy=upstream_proxy_of(server),
            mitmproxy_streams=(lambda: mitmproxy_reader.relay_streams(flow)) if self._direct and self._reader_reachable
            and not websocket else None,
            story=story if websocket else None, listener=live)
        if live is not None:
            live.follow(ticket.exchange)
        if provisional and data.method.upper() != b"HEAD":  # answered (and so put back) at once: ask with the token only
            display.address = lean_relay_request(request, display.address, ticket.token)
        else:
            request.headers[TOKEN_HEADER] = ticket.token
        self._live[flow.id] = Routed(ticket, display, live)
        request.scheme = "http"
        request.host = "127.0.0.1"
        request.port = relay.port
        # the relay reads only the token, and whether an answer may have a body: a path or
        # method its strict parser refuses (a raw non-ASCII query, a lowercase or unknown
        # method), which mitmproxy accepts, must not cost the flow its answer
        data.path = b"/"
        if not websocket:
            data.method = b"HEAD" if data.method.upper() == b"HEAD" else b"POST"
        if server.via is not None or server.transport_protocol != "tcp":
            flow.server_conn = connection.Server(address=("127.0.0.1", relay.port))
        self.counters["routed"] += 1

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        routed = self._live.get(flow.id)
        if routed is None or flow.response is None:
            return
        ticket = routed.ticket
        # display first: once a provisional head's real one is decided, every step
        # delays the first token (a fallback's URL is shown at the end, in `response`)
        restore(flow, ticket.exchange, routed.view)
        if ticket.websocket:
            return  # the relay's 101: the session answers from here on
        response = flow.response
        streamed = "text/event-stream" in response.headers.get("content-type", "").lower()
        if PROVISIONAL_HEADER in response.headers and ticket.head is not None:
            # the relay answered at once; the real head comes when the attempt core decides
            head = await ticket.head
            response.status_code = head.status
            response.reason = reason_phrase(head.status)
            response.headers = Headers([(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
                                        for k, v in head.headers])
            streamed = head.streamed
            if streamed:  # mitmproxy sends the head now, and logs that it streams: after the first token
                self._notes.expect(flow.client_conn.peername)
                if self._direct and self._reader_reachable:  # the first token is behind it already
                    mitmproxy_reader.head_with_first_content(flow)
        # the relay's connection is mitmproxy's own business; the client's need not
        # close: frame the body for it as the upstream would have
        response.headers.pop("connection", None)
        if streamed:
            copy = response.stream = DisplayCopy()
            if flow.request.http_version == "HTTP/1.1" and "content-length" not in response.headers:
                response.headers["transfer-encoding"] = "chunked"  # (HTTP/1.0 has no chunks: the close ends it)
                if self._direct and self._reader_reachable and not flow.client_conn.tls:
                    # once mitmproxy has sent this head, the body may skip it (relay/direct_line.py)
                    ticket.client_end = lambda fed: mitmproxy_reader.client_end(flow, copy) if copy.seen == fed else None

    def response(self, flow: http.HTTPFlow) -> None:
        routed = self._live.pop(flow.id, None)
        if routed is None or flow.response is None:
            return
        ticket, exchange = routed.ticket, routed.ticket.exchange
        self._notes.forget(flow.client_conn.peername)
        if self.relay is not None:
            self.relay.forget(ticket.token)  # answered by someone else (another addon)
        restore(flow, exchange, routed.view)
        if ticket.websocket:
            self._websockets[flow.id] = routed  # its story goes on until the WebSocket ends
            return
        stream = flow.response.stream
        if isinstance(stream, DisplayCopy):
            if not flow.response.raw_content:
                flow.response.content = b"".join(stream.chunks)
            stream.chunks = []  # held once: mitmweb keeps its flows, and this one keeps its stream callback
        annotate(flow, exchange, self.counters)
        if routed.live is not None:
            routed.live.finish(exchange)  # the attempts not shown yet

    def error(self, flow: http.HTTPFlow) -> None:
        routed = self._live.pop(flow.id, None)
        if routed is not None:
            exchange = routed.ticket.exchange
            self._notes.forget(flow.client_conn.peername)
            if self.relay is not None:
                self.relay.forget(routed.ticket.token)
            restore(flow, exchange, routed.view)
            annotate(flow, exchange, self.counters)
            if routed.live is not None:
                routed.live.finish(exchange)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        routed = self._websockets.pop(flow.id, None)
        if routed is None:
            return
        ticket = routed.ticket
        if routed.live is not None:
            routed.live.finish(ticket.exchange)  # each failed attempt of each turn not shown yet
        # the comment names each turn that needed more than one attempt, and why
        story = ticket.story or {}
        turns = story.get("turns", ())
        moved = [f"turn {turn['turn']}: {turn['why']}" for turn in turns if len(turn.get("attempts", ())) > 1]
        if moved:
            flow.comment = "; ".join(moved)
            # a cut that no continuation finished is a warning, as on an HTTP flow
            unfinished = any(turn.get("outcome") != "continued" and any(a.get("continuation") for a in turn["attempts"])
                             for turn in turns if turn.get("attempts"))
            flow.marked = ":warning:" if unfinished else ":arrows_counterclockwise:"
        elif story.get("suppressed_failover"):
            flow.marked = ":warning:"

    # --- commands -------------------------------------------------------------

    @command.command("switchyard.status")
    def status(self) -> str:
        """Routes, upstreams (with whether their credentials are present) and counters."""
        text = status_text(self.keeper, self.counters, self.relay, time.monotonic())
        observe.log.info(observe.printable(text))
        return text


class Routed(NamedTuple):
    """A routed flow until it is answered: the relay's ticket, how mitmweb shows the
    flow, and who shows its attempts as they end (None where no one sees flows)."""

    ticket: Ticket
    view: FlowView
    live: LiveStory | None = None


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
