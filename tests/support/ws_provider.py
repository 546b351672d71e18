"""A loopback server that speaks the Responses API over WebSocket and over HTTP SSE, and fails on demand.

Each client `response.create` (a WebSocket message) or `POST /v1/responses`
takes the next scripted turn (a list of message texts, sent back to back; a
number in it is a pause in seconds; `CLOSE` closes the WebSocket there (a `Close` with its
code and reason), `PING` pings, `HOLD` reads and sends nothing until `release()`) from the
queue the test filled; with none left it answers a normal turn.  Over HTTP the
same texts go as SSE events.  Every `response.create` received is recorded
exactly, every POST body too, with the headers of each handshake and POST.
`websocket=False` makes it refuse upgrades with `refusal` (404 unless a test sets
another; `refusal_text` and `refusal_headers` its body and headers), as an HTTP-only
upstream does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
import threading
from collections import deque
from dataclasses import dataclass

from aiohttp import WSMsgType, web
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request

from tests.support.mitm import free_port


def event(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def answer_turn(rid: str, text: str = "Hello there") -> list[str]:
    """A normal turn: lifecycle events, two deltas, the end."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    item = {"id": f"msg_{rid}", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    half = len(text) // 2
    return [
        event("response.created", sequence_number=0, response=response),
        event("response.in_progress", sequence_number=1, response=response),
        event("response.output_item.added", sequence_number=2, output_index=0, item=item),
        event("response.content_part.added", sequence_number=3, item_id=item["id"], output_index=0,
              content_index=0, part={"type": "output_text", "text": "", "annotations": []}),
        event("response.output_text.delta", sequence_number=4, item_id=item["id"], output_index=0,
              content_index=0, delta=text[:half]),
        event("response.output_text.delta", sequence_number=5, item_id=item["id"], output_index=0,
              content_index=0, delta=text[half:]),
        event("response.completed", sequence_number=6, response={**response, "status": "completed"}),
    ]


def full_answer_turn(rid: str, text: str) -> list[str]:
    """A turn as OpenAI streams it, item and part `done` events and the finished
    response included (what Codex renders its answer from)."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    item_id = f"msg_{rid}"
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    return [
        event("response.created", sequence_number=0, response=response),
        event("response.output_item.added", sequence_number=1, output_index=0,
              item={**item, "status": "in_progress", "content": []}),
        event("response.content_part.added", sequence_number=2, **where, part={**part, "text": ""}),
        event("response.output_text.delta", sequence_number=3, **where, delta=text),
        event("response.output_text.done", sequence_number=4, **where, text=text),
        event("response.content_part.done", sequence_number=5, **where, part=part),
        event("response.output_item.done", sequence_number=6, output_index=0, item=item),
        event("response.completed", sequence_number=7,
              response={**response, "status": "completed", "output": [item], "usage": usage}),
    ]


def overload_error(seq: int, code: str = "server_is_overloaded") -> str:
    return event("error", sequence_number=seq,
                 error={"type": "server_error", "code": code, "message": "Our servers are currently overloaded."})


def failed(rid: str, seq: int, code: str = "server_is_overloaded") -> str:
    return event("response.failed", sequence_number=seq,
                 response={"id": rid, "object": "response", "status": "failed", "output": [],
                           "error": {"code": code, "message": "Our servers are currently overloaded."}})


def overload_turn(rid: str) -> list[str]:
    """Fails before any output: created, an error, then response.failed."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    return [event("response.created", sequence_number=0, response=response), overload_error(1), failed(rid, 2)]


def failed_turn(rid: str, code: str = "server_is_overloaded") -> list[str]:
    """Fails before any output the way Codex's provider does: created, then response.failed."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    return [event("response.created", sequence_number=0, response=response), failed(rid, 1, code)]


def warm_up_turn(rid: str) -> list[str]:
    """The answer to a `generate: false` create: a response with no output."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    return [event("response.created", sequence_number=0, response=response),
            event("response.completed", sequence_number=1, response={**response, "status": "completed"})]


CLOSE = "CLOSE"  # in a script: the server closes the WebSocket (code 1000) there


@dataclass(frozen=True)
class Close:
    """In a script: the server closes the WebSocket there with this code and reason."""

    code: int
    reason: str


PING = "PING"  # in a script: the server sends a ping there
HOLD = "HOLD"  # in a script: the server neither reads nor sends until `release()`


class WsProvider:
    def __init__(self, websocket: bool = True, ssl_context: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.websocket = websocket
        self.refusal = 404  # the status an upgrade gets with websocket=False
        self.refusal_text = "no WebSocket here"
        self.refusal_headers: dict[str, str] = {}
        self._ssl = ssl_context  # serve https/wss with it
        self.creates: list[str] = []  # every response.create text received, in order
        self.posts: list[bytes] = []  # every POST /v1/responses body, in order
        self.handshakes: list[dict[str, str]] = []  # headers of each upgrade (or refused upgrade)
        self.post_headers: list[dict[str, str]] = []
        self.connections = 0
        self.ended = 0  # connections that have ended (either side closed)
        self.sent = 0  # WebSocket messages sent (each waits while the peer is not reading)
        self.others = 0  # text messages received that are no response.create
        self.others_digest = hashlib.sha256()  # of their texts, in order
        self._release: asyncio.Event | None = None
        self._scripts: deque[list[str | bytes | float | Close]] = deque()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def http_url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}/v1/responses"

    @property
    def proxied_url(self) -> str:
        """The same address for aiohttp behind an HTTP proxy: aiohttp sends the request
        line in absolute form with the URL's scheme, and mitmproxy takes only http(s)."""
        return f"http://127.0.0.1:{self.port}/v1/responses"

    def proxied_url_under(self, prefix: str) -> str:
        """`proxied_url` under `/prefix/`, the path by which a test's route picks this upstream."""
        return self.proxied_url.replace("/v1/responses", f"/{prefix}/v1/responses")

    def script(self, *turns: list[str | bytes | float | Close]) -> None:
        with self._lock:
            self._scripts.extend(turns)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self.creates.clear()
            self.posts.clear()
            self.handshakes.clear()
            self.post_headers.clear()
            self.connections = 0
            self.ended = 0
            self.sent = 0
            self.refusal = 404
            self.refusal_text = "no WebSocket here"
            self.refusal_headers = {}

    def release(self) -> None:
        """End a `HOLD`."""
        self._loop.call_soon_threadsafe(lambda: self._release.set() if self._release else None)

    def start(self) -> "WsProvider":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_get("/{prefix:.*}v1/responses", self._handle)  # /v1/responses, /slow/v1/responses, ...
        app.router.add_post("/{prefix:.*}v1/responses", self._post)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl).start()

    def _next(self, turn: int) -> list[str | bytes | float | Close]:
        with self._lock:
            return self._scripts.popleft() if self._scripts else list(answer_turn(f"resp_default{turn}"))

    def answer(self, create: str, turn: int) -> list[str | bytes | float]:
        """What answers `create` (a `response.create` text, or a POST's body), the `turn`th on its
        connection: the next scripted turn.  A subclass may answer by what was asked."""
        return self._next(turn)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        with self._lock:
            self.posts.append(body)
            self.post_headers.append(dict(request.headers))
            turn = len(self.posts)
        script = self.answer(body.decode(errors="replace"), turn)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for item in script:
            if isinstance(item, float | int):
                await asyncio.sleep(item)
            elif item == CLOSE or isinstance(item, Close):
                break
            elif isinstance(item, bytes):
                continue  # a binary message: SSE has none
            else:
                kind = json.loads(item).get("type", "message") if item.startswith("{") else "message"
                await response.write(f"event: {kind}\ndata: {item}\n\n".encode())
        await response.write_eof()
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.handshakes.append(dict(request.headers))
        if not self.websocket:
            return web.Response(status=self.refusal, text=self.refusal_text, headers=self.refusal_headers)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        with self._lock:
            self.connections += 1
        turn = 0
        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                continue
            try:
                kind = json.loads(msg.data).get("type")
            except (ValueError, AttributeError):
                kind = None
            if kind != "response.create":
                with self._lock:
                    self.others += 1
                    self.others_digest.update(msg.data.encode())
                continue
            turn += 1
            with self._lock:
                self.creates.append(msg.data)
            for item in self.answer(msg.data, turn):
                if isinstance(item, float | int):
                    await asyncio.sleep(item)
                elif isinstance(item, bytes):
                    await ws.send_bytes(item)  # a binary message
                    self.sent += 1
                elif item == CLOSE:
                    await ws.close()
                    return ws
                elif isinstance(item, Close):
                    await ws.close(code=item.code, message=item.reason.encode())
                    return ws
                elif item == PING:
                    await ws.ping(b"keepalive")
                elif item == HOLD:
                    assert self._release is not None
                    await self._release.wait()
                else:
                    await ws.send_str(item)
                    self.sent += 1
        with self._lock:
            self.ended += 1
        return ws


def slow_client(proxy_port: int, upstream: WsProvider) -> tuple[socket.socket, WSConnection]:
    """A WebSocket client to `upstream` through the proxy at `proxy_port`, with a small
    receive buffer: what it does not read, stays (in the proxy, if the proxy lets it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", proxy_port))
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host=f"127.0.0.1:{upstream.port}", target=upstream.proxied_url)))
    for _ in range(100):  # bounded: the handshake's answer is one or two reads
        ws.receive_data(sock.recv(65536))
        if any(isinstance(e, AcceptConnection) for e in ws.events()):
            return sock, ws
    raise AssertionError("no WebSocket handshake answer")
