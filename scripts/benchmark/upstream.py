"""The benchmark's loopback upstream, run in a process of its own (`bench.py --serve`) so
that its CPU is not charged to the client.

It answers Chat Completions paced like a model, on two ports (two origins):

  /ok/...      a normal answer
  /fail/...    HTTP 200 whose first frame is an in-stream 503, then the end
  /backup/...  a normal answer (a fallback's), or to a prefill (a continuation's) the
               rest of it after the /cut/ answer's CUT_AFTER content frames
  /xfail/...   as /fail/, on the route whose backup speaks another API
  /xbackup/v1/messages  the normal answer as Anthropic Messages streams it (the translated fallback's backup)
  /cut/...     the role frame and CUT_AFTER content frames, then a reset
  /ws/v1/responses            Responses turns over WebSocket
  /bench/hold-status/{group}  how the staging phase's barrier went

A request body with HOLD_FIELD gets the staging answer: role and lifecycle frames
at once, then nothing until every request of its group has arrived (a barrier,
bounded by the body's wait) and the hold has passed, then the rest.

It is not tests/support's FakeProvider: that one records every call and plays
scripted replies from a thread of the test process; here nothing may be
charged to the client, the staging phase holds a thousand streams, and the
answers are cached bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from benchmark.frames import (CUT_AFTER, FAIL_FRAME, HOLD_FIELD, STAGING_HOLD_MAX_S, STAGING_TOKENS_MAX, WS_PATH,
                              anthropic_answer_frames, answer_frames, hold_answer_frames, ws_turn_messages)
from benchmark.processes import raise_nofile_limit

PREFILLED = b'"role":"assistant"'  # in a request body: a continuation's prefill (the client's own ask none)


@dataclass
class HoldGroup:
    """The staging phase's barrier for one group of held requests; its fields are the status the client reads."""

    n: int
    first_at: float
    deadline: float
    arrived: int = 0
    all_at: float | None = None
    release_at: float | None = None
    timed_out: bool = False
    done: int = 0
    everyone: asyncio.Event = field(default_factory=asyncio.Event)

    def status(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "everyone"}


class Upstream:
    def __init__(self, tokens: int, gap_s: float) -> None:
        self.tokens = tokens
        self.gap_s = gap_s
        self.answers: dict[tuple[str, int], list[bytes]] = {}
        self.held_answers: dict[tuple[str, int], tuple[list[bytes], list[bytes]]] = {}
        self.groups: dict[str, HoldGroup] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/bench/hold-status/{group}", self.hold_status)
        app.router.add_route("GET", WS_PATH, self.websocket)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def _start_sse(self, request: web.Request, upstream: str) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        response.headers["Cache-Control"] = "no-cache"
        response.headers["x-request-id"] = f"req-bench-{upstream}"
        await response.prepare(request)
        return response

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream = request.path.lstrip("/").split("/", 1)[0]
        if HOLD_FIELD.encode() in body:
            spec = json.loads(body)
            if isinstance(spec, dict) and HOLD_FIELD in spec:
                return await self.hold(request, upstream, spec)
        n = int(request.query.get("tokens", self.tokens))
        response = await self._start_sse(request, upstream)
        if upstream in ("fail", "xfail"):
            await response.write(FAIL_FRAME)
            await response.write_eof()
            return response
        frames = self.answers.get((upstream, n))
        if frames is None:
            build = anthropic_answer_frames if upstream == "xbackup" else answer_frames
            frames = self.answers[(upstream, n)] = build(upstream, n)
        if upstream == "xbackup":  # message_start, block start, ping at once; deltas and the block's stop paced
            await response.write(b"".join(frames[:3]))
            for frame in frames[3:-2]:
                await asyncio.sleep(self.gap_s)
                await response.write(frame)
            await response.write(frames[-2] + frames[-1])  # message_delta (usage), message_stop
            await response.write_eof()
            return response
        if PREFILLED in body:
            # a continuation's prefill (its request ends with the cut answer's text): as a
            # prefill-capable model does, only the rest of the same answer
            frames = [frames[0], *frames[1 + CUT_AFTER:]]
        if upstream == "cut":
            await response.write(frames[0])
            for frame in frames[1:1 + CUT_AFTER]:
                await asyncio.sleep(self.gap_s)
                await response.write(frame)
            assert request.transport is not None
            request.transport.abort()  # a reset after output: the continuation's case
            return response
        await response.write(frames[0])  # role frame at once
        for frame in frames[1:-2]:  # content frames and the finish frame, paced like a model
            await asyncio.sleep(self.gap_s)
            await response.write(frame)
        await response.write(frames[-2])  # usage
        await response.write(frames[-1])  # [DONE]
        await response.write_eof()
        return response

    def group_of(self, name: str, n: int, wait_s: float) -> HoldGroup:
        group = self.groups.get(name)
        if group is None:
            now = time.monotonic()
            group = self.groups[name] = HoldGroup(n=n, first_at=now, deadline=now + wait_s)
        return group

    async def hold(self, request: web.Request, upstream: str, spec: dict[str, Any]) -> web.StreamResponse:
        hold_s = min(max(float(spec[HOLD_FIELD]) / 1000, 0.0), STAGING_HOLD_MAX_S)
        wait_s = min(max(float(spec.get("bench_hold_wait_ms", 60000)) / 1000, 0.0), 600.0)
        group = self.group_of(str(spec.get("bench_hold_group", "default")), max(1, int(spec.get("bench_hold_n", 1))),
                              wait_s)
        key = (upstream, min(self.tokens, STAGING_TOKENS_MAX))
        if key not in self.held_answers:
            self.held_answers[key] = hold_answer_frames(*key)
        first, rest = self.held_answers[key]
        response = await self._start_sse(request, upstream)
        await response.write(b"".join(first))  # role + lifecycle frames: held in staging by Switchyard
        group.arrived += 1
        if group.arrived >= group.n and not group.everyone.is_set():
            group.all_at = time.monotonic()
            group.release_at = group.all_at + hold_s
            group.everyone.set()
        if not group.everyone.is_set():
            try:
                await asyncio.wait_for(group.everyone.wait(), max(0.0, group.deadline - time.monotonic()))
            except TimeoutError:
                if not group.everyone.is_set():  # not all arrived in time: release the ones that did
                    group.timed_out = True
                    group.release_at = time.monotonic()
                    group.everyone.set()
        assert group.release_at is not None
        delay = group.release_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        for frame in rest[:-2]:  # content frames and the finish frame, paced like a model
            await asyncio.sleep(self.gap_s)
            await response.write(frame)
        await response.write(rest[-2] + rest[-1])  # usage, [DONE]
        await response.write_eof()
        group.done += 1
        return response

    async def hold_status(self, request: web.Request) -> web.Response:
        group = self.groups.get(request.match_info["group"])
        if group is None:
            return web.json_response({"known": False})
        return web.json_response({"known": True, **group.status()})

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        """Responses over WebSocket: each response.create is answered with `tokens` deltas, paced."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        turn = 0
        async for msg in ws:
            if msg.type is not web.WSMsgType.TEXT:
                continue
            turn += 1
            messages = ws_turn_messages(f"resp_bench{turn}", self.tokens)
            await ws.send_str(messages[0])
            for message in messages[1:-1]:
                await asyncio.sleep(self.gap_s)
                await ws.send_str(message)
            await ws.send_str(messages[-1])
        return ws


async def serve(tokens: int, gap_s: float, max_lifetime_s: float) -> None:
    """Listen on two loopback ports, print them as one JSON line, serve until SIGTERM,
    the parent's exit or `max_lifetime_s`."""
    parent = os.getppid()
    raise_nofile_limit()
    runner = web.AppRunner(Upstream(tokens, gap_s).app(), handler_cancellation=True, access_log=None,
                           handle_signals=False)
    await runner.setup()
    ports = []
    for _ in range(2):
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    sys.stdout.write(json.dumps({"ports": ports}) + "\n")
    sys.stdout.flush()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    deadline = time.monotonic() + max_lifetime_s
    try:
        while not stop.is_set() and time.monotonic() < deadline and os.getppid() == parent:
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
    finally:
        await runner.cleanup()
