"""A real loopback HTTP server that speaks like an LLM provider and fails on demand.

Every upstream of a test is a path prefix (`/primary/...`, `/backup/...`) on
one of two ports, so a test can put a backup on another origin.  A test
scripts the replies each upstream gives, in order; an upstream with no
script left answers with a normal stream for the API its path names.  Every
request is recorded (upstream, port, method, path, headers, body) so tests
can assert who was called, how often, and with which credentials.

Requests a real provider answers outside its streaming APIs are answered in
their own shape and never take a scripted reply: `HEAD` (Claude Code's
preflight) gets headers without a body, `GET .../models` a model list,
`POST .../count_tokens` a token count, a `GET` of a streaming API's path (a
WebSocket upgrade too) a 405.  A script is for the answers a test
means to fail; a client's side requests must not use it up.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from . import gemini_wire, wire

RESET = "reset"  # abort the connection (TCP RST) at this point


@dataclass
class Reply:
    """One scripted answer: status, headers, then body pieces.

    A piece is bytes (written and flushed), a float (sleep that many seconds)
    or RESET.
    """

    status: int = 200
    pieces: list[bytes | float | str] = field(default_factory=list)
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)
    delay_headers_s: float = 0.0

    @classmethod
    def sse(cls, *frames: bytes | float | str, headers: dict[str, str] | None = None) -> "Reply":
        return cls(200, list(frames), headers=headers or {})

    @classmethod
    def json(cls, status: int, body: object, headers: dict[str, str] | None = None) -> "Reply":
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return cls(status, [raw], content_type="application/json", headers=headers or {})


NORMAL = Reply(status=200)  # scripted "answer normally", for mixing with failures


def paced(pieces: list[bytes | float | str], pause_s: float) -> list[bytes | float | str]:
    """The pieces with a pause before each frame after the first."""
    out: list[bytes | float | str] = []
    for index, piece in enumerate(pieces):
        if index and isinstance(piece, bytes):
            out.append(pause_s)
        out.append(piece)
    return out


def _wants_stream(body: bytes) -> bool:
    try:
        return json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        return True  # not a JSON object: answer as most tests ask, streaming


STREAMING_PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


def side_reply(method: str, path: str, headers: Mapping[str, str]) -> "Reply | None":
    """The answer to a request outside the streaming APIs, or None for an API request."""
    if method == "HEAD":
        return Reply(200, [], content_type="application/json")
    if method == "GET" and path.endswith("/models"):
        anthropic = "anthropic-version" in headers or "x-api-key" in headers
        return Reply.json(200, wire.models_list(anthropic))
    if method == "POST" and path.endswith("/count_tokens"):
        return Reply.json(200, {"input_tokens": 12})
    if method == "GET" and path.endswith(STREAMING_PATHS):
        # what a provider answers a GET there, a WebSocket upgrade included (this one
        # speaks no WebSocket: a client that asks for one must be able to tell, and
        # Switchyard's `websocket: auto` then takes HTTP)
        return Reply.json(405, wire.method_not_allowed(wire.api_of(path), method, path), headers={"Allow": "POST"})
    return None


FAILURES = ("sse_503", "sse_429", "sse_529", "lifecycle_error", "response_failed", "overload_message", "http_503",
            "http_429", "http_529", "reset", "lifecycle_reset", "stall", "lifecycle_stall")
STALL_S = 3600.0


def failing_reply(kind: str, api: str) -> Reply:
    """A provider failure before any output, in the API's own shape.

    `sse_*`: HTTP 200, then an error as the first frame; `lifecycle_*`: the lifecycle
    frames first (role chunk, `response.created`, `message_start`, Gemini's empty
    text), then an error, a
    reset or silence; `response_failed`: `response.failed` (server_is_overloaded) on
    the Responses API, the API's in-stream error elsewhere; `stall`: headers, then
    silence.
    """
    lifecycle = wire.lifecycle_frames(api)
    if kind.startswith("sse_"):
        return Reply.sse(wire.stream_error(api, int(kind[4:]), "provider overloaded"))
    if kind.startswith("http_"):
        status = int(kind[5:]) if api != wire.GEMINI else gemini_wire.status_of(int(kind[5:]))[0]
        return Reply.json(status, wire.error_body(api, status, "provider overloaded"))
    if kind == "lifecycle_error":
        return Reply.sse(*lifecycle, wire.stream_error(api, 503, "provider overloaded"))
    if kind == "response_failed":
        if api == "openai-responses":
            return Reply.sse(*lifecycle, wire.responses_failed("server_is_overloaded", wire.OVERLOADED))
        return Reply.sse(wire.stream_error(api, 503, wire.OVERLOADED))
    if kind == "overload_message":
        if api == wire.GEMINI:  # Google's SDKs need a code beside the text
            return Reply.sse(gemini_wire.error_frame(400, "INVALID_ARGUMENT", wire.OVERLOADED))
        if api == "openai-chat":
            return Reply.sse(wire.data({"error": {"message": wire.OVERLOADED}}))
        if api == "anthropic-messages":
            return Reply.sse(b"event: error\n" + wire.data({"type": "error", "error": {"message": wire.OVERLOADED}}))
        return Reply.sse(wire.event("error", {"type": "error", "code": None, "message": wire.OVERLOADED, "param": None,
                                              "sequence_number": 0}))
    if kind == "reset":
        return Reply.sse(RESET)
    if kind == "lifecycle_reset":
        return Reply.sse(*lifecycle, 0.05, RESET)
    if kind == "stall":
        return Reply.sse(STALL_S)
    if kind == "lifecycle_stall":
        return Reply.sse(*lifecycle, STALL_S)
    raise ValueError(f"unknown failure {kind!r}; one of {', '.join(FAILURES)}")


def _nonce(body: bytes) -> str | None:
    try:
        metadata = json.loads(body).get("metadata") or {}
    except (ValueError, AttributeError):
        return None
    nonce = metadata.get("nonce") if isinstance(metadata, dict) else None
    return nonce if isinstance(nonce, str) else None


@dataclass(frozen=True)
class Call:
    upstream: str
    port: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""  # as sent (Gemini's `alt=sse` and `key` live there)
    raw_path: str = ""  # the request target as sent, query included (`path` is decoded)

    def json(self) -> object:
        return json.loads(self.body)


class FakeProvider:
    def __init__(self) -> None:
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._lock = threading.Lock()
        self.calls: list[Call] = []
        self.ports: list[int] = []
        self.finished = 0  # replies written to the end
        self.cancelled = 0  # replies whose client went away first
        self._in_flight = 0  # replies being played now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.pace_s = 0.0  # a pause between the frames of a normal streamed answer, like a model's

    # --- scripting (from the test thread) ---------------------------------------

    def script(self, upstream: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts[upstream].extend(replies)

    def reset(self, settle_s: float = 5.0) -> None:
        """Forget scripts, calls and counters, once the replies still being played have
        ended (bounded): a reply of the last test must not count in the next one."""
        deadline = time.monotonic() + settle_s
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            self._scripts.clear()
            self.calls.clear()
            self.finished = 0
            self.cancelled = 0

    def calls_to(self, upstream: str) -> list[Call]:
        with self._lock:
            return [call for call in self.calls if call.upstream == upstream]

    def url(self, upstream: str, path: str, *, port_index: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[port_index]}/{upstream}{path}"

    # --- serving ----------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        upstream, _, rest = request.path.lstrip("/").partition("/")
        body = await request.read()
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        side = side_reply(request.method, "/" + rest, request.headers)
        with self._lock:
            self.calls.append(Call(upstream, port, request.method, "/" + rest, dict(request.headers), body,
                                   request.query_string, request.raw_path))
            queue = self._scripts.get(upstream) if side is None else None
            reply = side or (queue.popleft() if queue else None)
            self._in_flight += 1
        if reply is None or reply is NORMAL:
            reply = wire.normal_reply("/" + rest, upstream, _nonce(body), stream=_wants_stream(body), request=body)
            if self.pace_s and reply.content_type == "text/event-stream":
                reply = Reply.sse(*paced(reply.pieces, self.pace_s))
        try:
            return await self._play(request, reply)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        except ConnectionResetError:  # the client left while we were writing
            self.cancelled += 1
            return web.Response(status=499)
        finally:
            with self._lock:
                self._in_flight -= 1

    async def _play(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        if reply.delay_headers_s:
            await asyncio.sleep(reply.delay_headers_s)
        if reply.pieces and reply.pieces[0] == RESET:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=204)
        response = web.StreamResponse(status=reply.status)
        response.content_type = reply.content_type
        for name, value in reply.headers.items():
            response.headers[name] = value
        if request.method == "HEAD":
            response.content_length = 0  # a HEAD answer's head only: mitmproxy reads no body
            await response.prepare(request)
            await response.write_eof()
            self.finished += 1
            return response
        await response.prepare(request)
        for piece in reply.pieces:
            if isinstance(piece, float | int) and not isinstance(piece, bool):
                await asyncio.sleep(float(piece))
            elif piece == RESET:
                assert request.transport is not None
                request.transport.abort()
                return response
            else:
                assert isinstance(piece, bytes)
                await response.write(piece)
        await response.write_eof()
        self.finished += 1
        return response

    def start(self, ports: list[int] | None = None, ssl_context: ssl.SSLContext | None = None) -> "FakeProvider":
        """Listen on 127.0.0.1 at `ports` (0: any free port); two origins by default.

        With `ssl_context`, one more port speaks HTTPS (its number is last in `ports`).
        """
        wanted = ports or [0, 0]
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def up() -> None:
                app = web.Application(client_max_size=64 * 1024 * 1024)
                app.router.add_route("*", "/{tail:.*}", self._handle)
                self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
                await self._runner.setup()
                for port in wanted:
                    site = web.TCPSite(self._runner, "127.0.0.1", port)
                    await site.start()
                    self.ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
                if ssl_context is not None:
                    site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
                    await site.start()
                    self.ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

            loop.run_until_complete(up())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-provider", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake provider did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def down() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None


def is_api_request(method: str, path: str) -> bool:
    """A request a scripted failure is for: a POST to a streaming API's path (Gemini's:
    `:streamGenerateContent`; its `:generateContent`, such as Gemini CLI's model router
    asks first, is answered)."""
    return method == "POST" and (path.endswith(STREAMING_PATHS) or path.endswith(":streamGenerateContent"))


class ScriptedByApi(FakeProvider):
    """Fails each named upstream's first COUNT API requests, shaped by the API each
    request's path names; its other requests are answered normally."""

    def __init__(self, failures: dict[str, tuple[str, int]]) -> None:
        super().__init__()
        self.failures = {name: [kind, count] for name, (kind, count) in failures.items()}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        upstream, _, rest = request.path.lstrip("/").partition("/")
        plan = self.failures.get(upstream)
        if plan and plan[1] != 0 and is_api_request(request.method, "/" + rest):
            if plan[1] > 0:
                plan[1] -= 1
            self.script(upstream, failing_reply(str(plan[0]), wire.api_of("/" + rest)))
        return await super()._handle(request)
