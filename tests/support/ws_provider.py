"""A loopback WebSocket server that speaks the Responses API over WebSocket and fails on demand.

Each client `response.create` takes the next scripted turn (a list of message
texts, sent back to back; a number in it is a pause in seconds) from the queue the test filled; with none left it
answers a normal turn.  Every `response.create` received is recorded exactly.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque

from aiohttp import WSMsgType, web

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


class WsProvider:
    def __init__(self) -> None:
        self.port = free_port()
        self.creates: list[str] = []  # every response.create text received, in order
        self.connections = 0
        self._scripts: deque[list[str | float]] = deque()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def proxied_url(self) -> str:
        """The same address for aiohttp behind an HTTP proxy: aiohttp sends the request
        line in absolute form with the URL's scheme, and mitmproxy takes only http(s)."""
        return f"http://127.0.0.1:{self.port}/v1/responses"

    def script(self, *turns: list[str | float]) -> None:
        with self._lock:
            self._scripts.extend(turns)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self.creates.clear()
            self.connections = 0

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
        app = web.Application()
        app.router.add_get("/v1/responses", self._handle)
        app.router.add_get("/slow/v1/responses", self._handle)
        app.router.add_get("/patient/v1/responses", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.WebSocketResponse:
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
                continue
            turn += 1
            with self._lock:
                self.creates.append(msg.data)
                script = self._scripts.popleft() if self._scripts else answer_turn(f"resp_default{turn}")
            for item in script:
                if isinstance(item, float | int):
                    await asyncio.sleep(item)
                else:
                    await ws.send_str(item)
        return ws
