#!/usr/bin/env python3
"""Switchyard benchmark: the same loopback upstream, three ways, interleaved in one run.

    .venv/bin/python scripts/bench.py              # default run (a few minutes)
    .venv/bin/python scripts/bench.py --quick      # smoke check (well under a minute)
    .venv/bin/python scripts/bench.py --json out.json --concurrency 1 50 --rounds 3

Paths measured, round by round in rotating order so that drift (thermal, noisy
neighbours) hits all of them alike:

  direct      the client talks to the upstream itself (the physical limit)
  plain       `mitmdump` with no script, regular proxy mode, the client using it
              as its HTTP proxy for a plain-http upstream URL.  Plain mitmdump
              buffers SSE bodies unless told to stream (mitmproxy issue #4469),
              so it runs with `--set stream_large_bodies=1`: that is what a user
              streaming an LLM through it has to set.
  switchyard  `mitmdump -s addon/switchyard.py` with a rules.yaml whose route
              matches the upstream path: upstream `primary` (url: original,
              retries: 0) then `backup` on the upstream's second port.  No
              stream_large_bodies here: the addon needs the request body in its
              `request` hook and enables streaming for its own answers.

Both proxies get `--listen-host 127.0.0.1 --set connection_strategy=lazy` and a
private confdir.

The upstream is an aiohttp server in its own process (this file with
`--serve`), so its CPU is not charged to the client.  It streams Chat
Completions answers shaped like OpenAI's: a role frame, N content frames paced
`--gap-ms` apart, a finish frame, a usage frame, `data: [DONE]`.  Paths:

  /ok/v1/chat/completions      a normal answer              (port 1)
  /fail/v1/chat/completions    HTTP 200 SSE whose first frame is
                               data: {"error":{"code":503,"message":"provider overloaded"}}
                               then the body ends            (port 1)
  /backup/v1/chat/completions  a normal answer              (port 2, another origin)
  /cut/v1/chat/completions     the role frame and three content frames, then the
                               connection is reset           (port 1)

Figures, per concurrency level:
  TTFB   request sent -> first body byte
  TTFT   request sent -> first frame with non-empty `content` (Switchyard holds
         the role frame back until the first output by design, so its first
         byte is the first content; TTFT is the like-for-like figure)
  TTLB   request sent -> end of body
  proxy CPU per stream: utime+stime delta of the proxy process (and any
         descendants, plus cutime/cstime) over the cell, divided by streams
         (also its kernel part, stime, and the threads' schedstat run count as
         "wake-ups": the event loop's trips per stream)
  proxy peak RSS: VmRSS sampled every 20 ms during the cells of that level;
         a Python process rarely gives memory back, so after the warm-up burst
         this is in effect the high-water mark (VmHWM, printed too)
  fallback: time to the backup's first content when the first upstream fails
         before output.  Switchyard does it inside the proxy; for direct and
         plain the *client* does it (read the error frame, then ask the backup)
         — what a client without Switchyard would have to do.  "added" is that
         time minus (the failing upstream's direct time-to-error + the backup's
         direct TTFT), both medians from the direct cells of the same run.
  burst (`--burst 20 50`, `--bursts N` a cell): C happy requests started in one
         loop pass, as an agent fanning out tool calls does; the next burst
         once all C have ended (and 50 ms more).  TTFT median, p90 and p99 are
         timed from the burst's start, so the last request's figure includes
         the proxy's work on the C-1 before it; proxy CPU per stream as above.
  The first table printed holds the figures to compare first, each against
  plain mitmdump in the same run and round by round: first content in a burst
  of 20 and of 50 (median, p90), at concurrency 1, and CPU per stream at each
  `--concurrency` level (1, 20, 50).
  continue after cut (switchyard only): the `/cut/` answer breaks after three
         content frames; its route has `continue_after_cut: [prefill]` and a
         backup with `prefill: true`, which answers the continuation request
         normally.  The figure is the client's time from the last content frame
         before the cut to the first continued one: noticing the reset, asking
         the backup, and the backup's own first content (its pacing included,
         like the fallback row's).  Without Switchyard there is nothing to
         compare: a client re-runs the whole request.

Clients are asyncio aiohttp sessions (trust_env=False), one per path, kept for
the whole run like a long-lived SDK client; a warm-up burst at the highest
concurrency opens their connections (and the relay's) before measuring.

The header says how busy the rest of the machine was during the measured cells
(/proc/stat minus the benchmark's own processes, and hypervisor steal): on a
shared box, trust ratios of interleaved paths more than absolute latencies.  At
high concurrency on a small machine the single-threaded proxy saturates; then
frames coalesce per read and CPU per stream falls, so compare CPU ratios at a
concurrency where the proxy still idles between tokens (c=1).

Staging memory (`--staging-streams N`, default 1000, 200 with --quick, 0 to skip):
after the measured rounds, once per proxy (plain, then switchyard), N streaming
requests are opened at once.  Their answer (the request body carries
"bench_hold_ms", "bench_hold_group", "bench_hold_n" and "bench_hold_wait_ms"
fields the upstream reads) is the role frame and three lifecycle-only frames
(an Azure prompt-filter chunk, two chunks with empty deltas) at once — which
Switchyard holds in staging, since nothing in them is output — then nothing
until all N requests of the group have reached the upstream (a barrier, bounded
by bench_hold_wait_ms) and a further `--staging-hold-s` (default 3 s) have
passed; then the content frames (min(--tokens, 20), paced --gap-ms),
finish, usage and [DONE].  The proxy's RSS is sampled every 50 ms from just
before the first request until the last answer is complete; reported: RSS
before, peak while all N were held (the upstream says when the barrier opened
and when it released), peak over the whole phase (the sampled peak, or VmHWM if
it rose during the phase and is higher), and peak minus before.  The
target is that switchyard's peak minus before exceeds plain
mitmdump's by under 300 MB.  Every client must get its complete answer (exact
byte count, [DONE]); for switchyard, also no data frame before the release
(else it did not hold the stream) — plain passes the role frame straight
through, which the table shows as a check that the hold is real.  The soft
RLIMIT_NOFILE is raised to the hard limit in this process (the children
inherit it) and in the upstream; the proxy needs about 3N descriptors.

`--profile DIR` records both proxies with py-spy during the measured rounds
(pip install py-spy into the venv; it is not a project dependency).

Every wait is bounded; every child process is stopped in `finally` (and gets
SIGTERM from the kernel if this process dies: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ADDON = ROOT / "addon" / "switchyard.py"
sys.path.insert(0, str(ROOT))  # tests/support, shared with the test suite

from benchmark.constants import PATH_LABEL, PATHS  # noqa: E402
from benchmark.procstats import (cpu_seconds, kernel_cpu_seconds, machine, machine_busy_s, ours_cpu_s,  # noqa: E402
                                 rss_kb, status_kb, wakeups)
from benchmark.report import (headline, median, report, staging_report, staging_verdict,  # noqa: E402
                              summarize, websocket_report)
from tests.support.mitm import free_port  # noqa: E402

CLIENT_KEY = "sk-bench-client-key"
BACKUP_KEY = "sk-bench-backup-key"
REQUEST_BODY = json.dumps(
    {
        "model": "gpt-4o",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a short paragraph about railway switchyards."},
        ],
    }
).encode()
REQUEST_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    "Authorization": f"Bearer {CLIENT_KEY}",
}
CONTENT_MARK = b'"delta":{"content":"'  # a content frame; the role frame has "role" first
ERROR_MARK = b'"error":'
DONE = b"data: [DONE]\n\n"
CUT_AFTER = 3  # content frames the /cut/ answer sends before its connection is reset
HOLD_FIELD = "bench_hold_ms"  # in a request body: the staging-phase answer (see the module docstring)
STAGING_TOKENS_MAX = 20
BURST_PAUSE_S = 0.05  # between one burst's end and the next one's start: the proxy settles first
STAGING_HOLD_MAX_S = 10.0  # below Switchyard's default pre_answer_keepalive_s (15 s)
PROXY_ENV_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")

# --------------------------------------------------------------------------------------
# Wire frames (OpenAI Chat Completions shape; mirrors tests/support/wire.py)
# --------------------------------------------------------------------------------------

WORDS = (
    "A switchyard sorts railway cars onto the right tracks so that each train leaves "
    "with the cars it needs, in the order it needs them, without anyone noticing the work"
).split()


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(cid: str, delta: dict, finish: str | None = None) -> bytes:
    return _data(
        {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 1727346168,
            "model": "gpt-4o-2024-08-06",
            "system_fingerprint": "fp_5050236cbd",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def answer_frames(upstream: str, tokens: int) -> list[bytes]:
    """role frame, `tokens` content frames, finish frame, usage frame, [DONE]."""
    cid = f"chatcmpl-bench-{upstream}"
    frames = [_chunk(cid, {"role": "assistant", "content": "", "refusal": None})]
    for i in range(tokens):
        word = WORDS[i % len(WORDS)]
        frames.append(_chunk(cid, {"content": word if i == 0 else " " + word}))
    frames.append(_chunk(cid, {}, "stop"))
    frames.append(
        _data(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": 1727346168,
                "model": "gpt-4o-2024-08-06",
                "system_fingerprint": "fp_5050236cbd",
                "choices": [],
                "usage": {"prompt_tokens": 31, "completion_tokens": tokens, "total_tokens": 31 + tokens},
            }
        )
    )
    frames.append(DONE)
    return frames


def lifecycle_frames(upstream: str) -> list[bytes]:
    """Chat Completions frames that carry no output: Switchyard holds them (with the role frame) in staging."""
    cid = f"chatcmpl-bench-{upstream}"
    return [
        _data(
            {
                "id": "",
                "object": "",
                "created": 0,
                "model": "",
                "choices": [],
                "prompt_filter_results": [
                    {"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False, "severity": "safe"}}}
                ],
            }
        ),
        _chunk(cid, {}),
        _chunk(cid, {"refusal": None}),
    ]


def hold_answer_frames(upstream: str, tokens: int) -> tuple[list[bytes], list[bytes]]:
    """(sent at once: role + lifecycle frames, sent after the hold: content, finish, usage, [DONE])."""
    frames = answer_frames(upstream, tokens)
    return [frames[0], *lifecycle_frames(upstream)], frames[1:]


WS_PATH = "/ws/v1/responses"


def ws_turn_messages(rid: str, tokens: int) -> list[str]:
    """One Responses turn over WebSocket: created, `tokens` text deltas, completed."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    where = {"item_id": f"msg_{rid}", "output_index": 0, "content_index": 0}
    deltas = [json.dumps({"type": "response.output_text.delta", "sequence_number": i + 1, **where,
                          "delta": f"tok{i} "}) for i in range(tokens)]
    return [json.dumps({"type": "response.created", "sequence_number": 0, "response": response}), *deltas,
            json.dumps({"type": "response.completed", "sequence_number": tokens + 1,
                        "response": {**response, "status": "completed"}})]


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return (soft, hard) afterwards."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft < hard:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


FAIL_FRAME = _data(
    {
        "id": "chatcmpl-bench-fail",
        "object": "chat.completion.chunk",
        "created": 1727346168,
        "model": "gpt-4o-2024-08-06",
        "choices": [],
        "error": {"code": 503, "message": "provider overloaded"},
    }
)

# --------------------------------------------------------------------------------------
# The upstream (runs in its own process: `bench.py --serve`)
# --------------------------------------------------------------------------------------


async def _serve(tokens: int, gap_s: float, max_lifetime_s: float) -> None:
    from aiohttp import web

    parent = os.getppid()
    raise_nofile_limit()
    cache: dict[tuple[str, int], list[bytes]] = {}
    hold_cache: dict[tuple[str, int], tuple[list[bytes], list[bytes]]] = {}
    groups: dict[str, dict[str, Any]] = {}  # staging phase: one barrier per group of held requests

    def group_of(name: str, n: int, wait_s: float) -> dict[str, Any]:
        group = groups.get(name)
        if group is None:
            now = time.monotonic()
            group = groups[name] = {"n": n, "arrived": 0, "first_at": now, "deadline": now + wait_s,
                                    "all_at": None, "release_at": None, "timed_out": False, "done": 0,
                                    "all": asyncio.Event()}
        return group

    async def hold(request: web.Request, upstream: str, spec: dict[str, Any]) -> web.StreamResponse:
        hold_s = min(max(float(spec[HOLD_FIELD]) / 1000, 0.0), STAGING_HOLD_MAX_S)
        wait_s = min(max(float(spec.get("bench_hold_wait_ms", 60000)) / 1000, 0.0), 600.0)
        n = max(1, int(spec.get("bench_hold_n", 1)))
        group = group_of(str(spec.get("bench_hold_group", "default")), n, wait_s)
        key = (upstream, min(tokens, STAGING_TOKENS_MAX))
        if key not in hold_cache:
            hold_cache[key] = hold_answer_frames(*key)
        first, rest = hold_cache[key]
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        response.headers["Cache-Control"] = "no-cache"
        response.headers["x-request-id"] = f"req-bench-{upstream}"
        await response.prepare(request)
        await response.write(b"".join(first))  # role + lifecycle frames: held in staging by Switchyard
        group["arrived"] += 1
        if group["arrived"] >= group["n"] and not group["all"].is_set():
            group["all_at"] = time.monotonic()
            group["release_at"] = group["all_at"] + hold_s
            group["all"].set()
        if not group["all"].is_set():
            try:
                await asyncio.wait_for(group["all"].wait(), max(0.0, group["deadline"] - time.monotonic()))
            except TimeoutError:
                if not group["all"].is_set():  # not all arrived in time: release the ones that did
                    group["timed_out"] = True
                    group["release_at"] = time.monotonic()
                    group["all"].set()
        delay = group["release_at"] - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        for frame in rest[:-2]:  # content frames and the finish frame, paced like a model
            await asyncio.sleep(gap_s)
            await response.write(frame)
        await response.write(rest[-2] + rest[-1])  # usage, [DONE]
        await response.write_eof()
        group["done"] += 1
        return response

    async def hold_status(request: web.Request) -> web.Response:
        group = groups.get(request.match_info["group"])
        if group is None:
            return web.json_response({"known": False})
        return web.json_response({"known": True, **{k: v for k, v in group.items() if k not in ("all",)}})

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream = request.path.lstrip("/").split("/", 1)[0]
        if HOLD_FIELD.encode() in body:
            spec = json.loads(body)
            if isinstance(spec, dict) and HOLD_FIELD in spec:
                return await hold(request, upstream, spec)
        n = int(request.query.get("tokens", tokens))
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        response.headers["Cache-Control"] = "no-cache"
        response.headers["x-request-id"] = f"req-bench-{upstream}"
        await response.prepare(request)
        if upstream == "fail":
            await response.write(FAIL_FRAME)
            await response.write_eof()
            return response
        frames = cache.get((upstream, n))
        if frames is None:
            frames = cache[(upstream, n)] = answer_frames(upstream, n)
        if upstream == "cut":
            await response.write(frames[0])
            for frame in frames[1:1 + CUT_AFTER]:
                await asyncio.sleep(gap_s)
                await response.write(frame)
            assert request.transport is not None
            request.transport.abort()  # a reset after output: the continuation's case
            return response
        await response.write(frames[0])  # role frame at once
        for frame in frames[1:-2]:  # content frames and the finish frame, paced like a model
            await asyncio.sleep(gap_s)
            await response.write(frame)
        await response.write(frames[-2])  # usage
        await response.write(frames[-1])  # [DONE]
        await response.write_eof()
        return response

    async def ws_handle(request: web.Request) -> web.WebSocketResponse:
        """Responses over WebSocket: each response.create is answered with `tokens` deltas, paced."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        turn = 0
        async for msg in ws:
            if msg.type is not web.WSMsgType.TEXT:
                continue
            turn += 1
            messages = ws_turn_messages(f"resp_bench{turn}", tokens)
            await ws.send_str(messages[0])
            for message in messages[1:-1]:
                await asyncio.sleep(gap_s)
                await ws.send_str(message)
            await ws.send_str(messages[-1])
        return ws

    app = web.Application()
    app.router.add_route("GET", "/bench/hold-status/{group}", hold_status)
    app.router.add_route("GET", WS_PATH, ws_handle)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, handle_signals=False)
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
            except asyncio.TimeoutError:
                pass
    finally:
        await runner.cleanup()


# --------------------------------------------------------------------------------------
# Processes: start, watch, stop
# --------------------------------------------------------------------------------------


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in PROXY_ENV_VARS:
        env.pop(name, None)
    return env


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path | None = None
    stop_signal: int = signal.SIGTERM

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(30 if self.stop_signal == signal.SIGINT else 8)
            except subprocess.TimeoutExpired:
                self.process.kill()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        for stream in (self.process.stdout, self.process.stderr, self.process.stdin):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def start_upstream(args: argparse.Namespace, workdir: Path) -> tuple[Child, list[int]]:
    log = (workdir / "upstream.log").open("wb")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", "--tokens", str(args.tokens),
           "--gap-ms", str(args.gap_ms), "--max-lifetime", str(args.max_lifetime)]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                               env=_child_env(), preexec_fn=_die_with_parent)
    log.close()
    child = Child("upstream", process, workdir / "upstream.log")
    assert process.stdout is not None
    deadline = time.monotonic() + 20
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or process.poll() is not None:
            child.stop()
            raise RuntimeError(f"upstream did not start: {(workdir / 'upstream.log').read_text(errors='replace')}")
        ready, _, _ = select.select([process.stdout], [], [], min(remaining, 0.5))
        if ready:
            byte = os.read(process.stdout.fileno(), 1)
            if not byte:
                continue
            line += byte
    return child, json.loads(line)["ports"]


def start_mitmdump(name: str, workdir: Path, extra: list[str]) -> tuple[Child, int]:
    mitmdump = Path(sys.executable).parent / "mitmdump"
    if not mitmdump.exists():
        mitmdump = ROOT / ".venv" / "bin" / "mitmdump"
    port = free_port()
    home = workdir / name
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "mitmdump.log"
    cmd = [str(mitmdump), *extra, "--listen-host", "127.0.0.1", "--mode", f"regular@{port}",
           "--set", "connection_strategy=lazy", "--set", f"confdir={home / 'conf'}"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=_child_env(), cwd=home, preexec_fn=_die_with_parent)
    child = Child(name, process, log_path)
    deadline = time.monotonic() + 45
    while True:
        text = log_path.read_text(errors="replace")
        if "listening at" in text:
            return child, port
        if process.poll() is not None or time.monotonic() > deadline:
            child.stop()
            raise RuntimeError(f"{name} mitmdump did not start (cmd: {' '.join(cmd)}):\n{text[-4000:]}")
        time.sleep(0.05)


RULES = """\
version: 1
defaults:
  retries: 1
  headers_timeout_s: 30
  idle_timeout_s: 60
routes:
  - name: bench-cut             # the continue-after-cut scenario
    match: {{host: 127.0.0.1, path: /cut/v1/chat/completions}}
    continue_after_cut: [prefill]
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        url: http://127.0.0.1:{backup_port}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer {backup_key}"}}
        prefill: true
  - name: bench-chat
    match: {{host: 127.0.0.1, path: "/*/v1/chat/completions"}}
    upstreams:
      - name: primary
        url: original
        retries: 0              # the fallback scenario measures the move to the backup, not a backoff
      - name: backup
        url: http://127.0.0.1:{backup_port}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer {backup_key}"}}
  - name: bench-responses-websocket
    match: {{host: 127.0.0.1, path: /ws/v1/responses}}
    api: openai-responses
    upstreams:
      - {{name: primary, url: original, retries: 0}}
"""

# --------------------------------------------------------------------------------------
# Optional profiling with py-spy (pip install py-spy into the venv; not a project dependency)
# --------------------------------------------------------------------------------------


def start_profilers(outdir: Path, targets: dict[str, int], max_seconds: float) -> list[Child]:
    import shutil

    pyspy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if pyspy is None:
        raise RuntimeError("--profile needs py-spy: .venv/bin/pip install py-spy")
    outdir.mkdir(parents=True, exist_ok=True)
    children = []
    for name, pid in targets.items():
        log_path = outdir / f"{name}.py-spy.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [pyspy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--nonblocking",
                 "--duration", str(int(max_seconds)), "--output", str(outdir / f"{name}.collapsed.txt")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        children.append(Child(f"py-spy-{name}", process, log_path, stop_signal=signal.SIGINT))
    return children


_LINE_NO = __import__("re").compile(r":\d+\)$")


def summarize_profile(path: Path, top: int = 30) -> str:
    """Top functions by inclusive and by self samples from py-spy's collapsed-stack output."""
    from collections import Counter

    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.strip() for f in stack.split(";")]
        frames = [_LINE_NO.sub(")", f) for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    out = [f"{path.name}: {total} samples"]
    out.append("  inclusive:")
    out += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)] if total else []
    out.append("  self:")
    out += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)] if total else []
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------


@dataclass
class Sample:
    ok: bool
    ttfb: float | None = None  # seconds
    ttft: float | None = None
    ttlb: float | None = None
    upstream: str | None = None  # whose answer arrived (from the chunk id)
    tte: float | None = None  # fallback, client side: time to the failing upstream's error frame
    backup_ttft: float | None = None  # fallback, client side: backup request -> first content
    cut_gap: float | None = None  # continue: last content before the cut -> first continued content
    error: str | None = None


@dataclass
class Read:
    status: int
    ttfb: float | None
    ttft: float | None
    tte: float | None
    ttlb: float
    nbytes: int
    upstream: str | None
    ended_done: bool
    header_upstream: str | None


async def read_stream(session: Any, url: str, proxy: str | None, t0: float) -> Read:
    """POST, read the SSE body to the end, note when things arrived (relative to t0)."""
    perf = time.perf_counter
    async with session.post(url, data=REQUEST_BODY, headers=REQUEST_HEADERS, proxy=proxy) as resp:
        ttfb = ttft = tte = None
        head = b""
        upstream = None
        nbytes = 0
        tail = b""
        async for chunk in resp.content.iter_any():
            now = perf()
            if ttfb is None:
                ttfb = now - t0
            if ttft is None and tte is None:
                head += chunk
                at = head.find(CONTENT_MARK)
                if at >= 0:
                    ttft = now - t0
                    id_at = head.rfind(b'"id":"chatcmpl-bench-', 0, at)
                    if id_at >= 0:
                        upstream = head[id_at + 21 : head.index(b'"', id_at + 21)].decode()
                elif ERROR_MARK in head:
                    tte = now - t0
                    upstream = "fail"
            nbytes += len(chunk)
            tail = (tail + chunk)[-len(DONE):]
        return Read(resp.status, ttfb, ttft, tte, perf() - t0, nbytes, upstream, tail == DONE,
                    resp.headers.get("x-switchyard-upstream"))


async def read_cut_stream(session: Any, url: str, proxy: str | None) -> tuple[int, float | None, int, bool, bytes]:
    """POST to the /cut/ path; (status, time from the CUT_AFTER-th content frame to the
    next one, content frames, ended with [DONE], the last bytes)."""
    perf = time.perf_counter
    async with session.post(url, data=REQUEST_BODY, headers=REQUEST_HEADERS, proxy=proxy) as resp:
        body = bytearray()
        at_cut = gap = None
        async for chunk in resp.content.iter_any():
            now = perf()
            body += chunk
            if gap is None:
                seen = body.count(CONTENT_MARK)  # a mark split between reads is counted once whole
                if at_cut is None and seen >= CUT_AFTER:
                    at_cut = now
                if at_cut is not None and seen > CUT_AFTER:
                    gap = now - at_cut
        return resp.status, gap, body.count(CONTENT_MARK), body.endswith(DONE), bytes(body[-200:])


class Bench:
    def __init__(self, args: argparse.Namespace, ports: list[int], proxies: dict[str, tuple[int | None, str | None]],
                 upstream_pid: int) -> None:
        self.args = args
        self.ok_url = f"http://127.0.0.1:{ports[0]}/ok/v1/chat/completions"
        self.fail_url = f"http://127.0.0.1:{ports[0]}/fail/v1/chat/completions"
        self.backup_url = f"http://127.0.0.1:{ports[1]}/backup/v1/chat/completions"
        self.cut_url = f"http://127.0.0.1:{ports[0]}/cut/v1/chat/completions"
        self.proxies = proxies  # path -> (pid, proxy url)
        self.upstream_pid = upstream_pid
        self.all_pids = [upstream_pid] + [pid for pid, _ in proxies.values() if pid]
        self.expected_len = {name: len(b"".join(answer_frames(name, args.tokens))) for name in ("ok", "backup")}
        self.sessions: dict[str, Any] = {}
        self.stream_timeout = 30 + args.tokens * args.gap_ms / 1000 * 20
        self.cells: list[dict[str, Any]] = []
        self.rss_peak_kb: dict[tuple[str, int], int] = {}

    async def open(self) -> None:
        import aiohttp

        limit = max(self.args.concurrency + self.args.burst)
        timeout = aiohttp.ClientTimeout(total=self.stream_timeout, sock_connect=10, sock_read=30)
        for path in PATHS:
            connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
            self.sessions[path] = aiohttp.ClientSession(trust_env=False, connector=connector, timeout=timeout,
                                                        auto_decompress=False)

    async def close(self) -> None:
        for session in self.sessions.values():
            try:
                await asyncio.wait_for(session.close(), 10)
            except Exception:
                pass
        self.sessions.clear()

    # --- one stream ---------------------------------------------------------------

    def _check(self, read: Read, want: str) -> str | None:
        if read.status != 200:
            return f"status {read.status}"
        if read.upstream != want:
            return f"answer from {read.upstream!r}, wanted {want!r}"
        if read.nbytes != self.expected_len[want]:
            return f"{read.nbytes} bytes, wanted {self.expected_len[want]}"
        if not read.ended_done:
            return "no [DONE] at the end"
        if read.ttft is None:
            return "no content"
        return None

    async def happy(self, path: str, t0: float | None = None) -> Sample:
        """One normal answer; `t0`, the moment its burst started (else now)."""
        _, proxy = self.proxies[path]
        t0 = time.perf_counter() if t0 is None else t0
        read = await read_stream(self.sessions[path], self.ok_url, proxy, t0)
        error = self._check(read, "ok")
        if error is None and path == "switchyard" and read.header_upstream != "primary":
            error = f"not relayed by Switchyard (x-switchyard-upstream {read.header_upstream!r})"
        return Sample(error is None, read.ttfb, read.ttft, read.ttlb, read.upstream, error=error)

    async def fallback(self, path: str) -> Sample:
        _, proxy = self.proxies[path]
        session = self.sessions[path]
        t0 = time.perf_counter()
        if path == "switchyard":  # the proxy falls back by itself
            read = await read_stream(session, self.fail_url, proxy, t0)
            error = self._check(read, "backup")
            if error is None and read.header_upstream != "backup":
                error = f"x-switchyard-upstream {read.header_upstream!r}"
            return Sample(error is None, read.ttfb, read.ttft, read.ttlb, read.upstream, error=error)
        # without Switchyard the client must notice the error frame and ask the backup itself
        first = await read_stream(session, self.fail_url, proxy, t0)
        if first.tte is None:
            return Sample(False, error=f"failing upstream gave no error frame (status {first.status})")
        t1 = time.perf_counter()
        read = await read_stream(session, self.backup_url, proxy, t1)
        error = self._check(read, "backup")
        offset = t1 - t0
        return Sample(
            error is None,
            first.ttfb,
            None if read.ttft is None else offset + read.ttft,
            offset + read.ttlb,
            read.upstream,
            tte=first.tte,
            backup_ttft=read.ttft,
            error=error,
        )

    async def cont(self, path: str) -> Sample:
        """Switchyard only: a stream cut after output, finished by the prefill backup."""
        _, proxy = self.proxies[path]
        status, gap, frames, done, tail = await read_cut_stream(self.sessions[path], self.cut_url, proxy)
        want = CUT_AFTER + self.args.tokens  # the backup's whole (normal) answer continues the text
        error = None
        if status != 200:
            error = f"status {status}"
        elif not done:
            error = f"no [DONE] at the end: {tail[-120:]!r}"
        elif frames != want:
            error = f"{frames} content frames, wanted {want}"
        elif gap is None:
            error = "no continued content"
        return Sample(error is None, cut_gap=gap, error=error)

    # --- one cell: n streams on one path at concurrency c ------------------------------

    async def _guarded(self, run: Any) -> Sample:
        try:
            return await asyncio.wait_for(run, self.stream_timeout + 5)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a failed stream is a result, not a crash
            return Sample(False, error=f"{type(exc).__name__}: {exc}"[:300])

    async def bursts(self, path: str, concurrency: int, n: int, samples: list[Sample]) -> None:
        """`n` happy streams in bursts of `concurrency` started in one loop pass, each
        burst once the previous one has ended; every stream is timed from its burst's start."""
        for first in range(0, n, concurrency):
            t0 = time.perf_counter()
            size = min(concurrency, n - first)
            samples.extend(await asyncio.gather(*(self._guarded(self.happy(path, t0)) for _ in range(size))))
            await asyncio.sleep(BURST_PAUSE_S)

    async def cell(self, path: str, kind: str, concurrency: int, n: int, round_no: int | None) -> dict[str, Any]:
        pid, _ = self.proxies[path]
        run_one = {"happy": self.happy, "burst": self.happy, "fallback": self.fallback, "continue": self.cont}[kind]
        queue = list(range(n))
        samples: list[Sample] = []

        async def worker() -> None:
            while queue:
                queue.pop()
                samples.append(await self._guarded(run_one(path)))

        peak = 0
        stop_sampling = asyncio.Event()

        async def sample_rss() -> None:
            nonlocal peak
            while not stop_sampling.is_set():
                peak = max(peak, rss_kb(pid))
                try:
                    await asyncio.wait_for(stop_sampling.wait(), 0.02)
                except asyncio.TimeoutError:
                    pass

        sampler = asyncio.create_task(sample_rss()) if pid else None
        waves = math.ceil(n / concurrency)
        bound = 60 + waves * (self.args.tokens * self.args.gap_ms / 1000 + 1) * 20
        busy0, steal0 = machine_busy_s()
        ours0 = ours_cpu_s(self.all_pids)
        cpu0, up0, self0 = cpu_seconds(pid), cpu_seconds(self.upstream_pid), time.process_time()
        sys0, wake0 = kernel_cpu_seconds(pid), wakeups(pid)
        w0 = time.perf_counter()
        if kind == "burst":
            workers = [asyncio.create_task(self.bursts(path, concurrency, n, samples))]
        else:
            workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, n))]
        try:
            done, pending = await asyncio.wait(workers, timeout=bound)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)
                samples.extend(Sample(False, error="cell timeout") for _ in range(max(0, n - len(samples))))
        finally:
            wall = time.perf_counter() - w0
            cpu1, up1, self1 = cpu_seconds(pid), cpu_seconds(self.upstream_pid), time.process_time()
            sys1, wake1 = kernel_cpu_seconds(pid), wakeups(pid)
            busy1, steal1 = machine_busy_s()
            ours1 = ours_cpu_s(self.all_pids)
            stop_sampling.set()
            if sampler is not None:
                await asyncio.wait([sampler], timeout=5)
        key = (path, concurrency)
        self.rss_peak_kb[key] = max(self.rss_peak_kb.get(key, 0), peak)
        result = {
            "path": path,
            "kind": kind,
            "concurrency": concurrency,
            "round": round_no,
            "streams": n,
            "wall_s": wall,
            "proxy_cpu_s": cpu1 - cpu0 if pid else None,
            "proxy_kernel_cpu_s": sys1 - sys0 if pid else None,
            "proxy_wakeups": wake1 - wake0 if pid else None,
            "upstream_cpu_s": up1 - up0,
            "client_cpu_s": self1 - self0,
            # CPU used on this machine by processes that are not part of the benchmark
            # (other test runs, ...), and CPU time the hypervisor gave to someone else
            "foreign_cpu_s": max(0.0, (busy1 - busy0) - (ours1 - ours0)),
            "steal_cpu_s": steal1 - steal0,
            "proxy_rss_peak_kb": peak if pid else None,
            "samples": [asdict(s) for s in samples],
        }
        if round_no is not None:
            self.cells.append(result)
        return result


# --------------------------------------------------------------------------------------
# Staging memory: N streams held at once in each proxy
# --------------------------------------------------------------------------------------


_SSE_COMMENT = __import__("re").compile(rb"(?m)^:[^\n]*\n\n?")


async def staged_stream(session: Any, url: str, proxy: str, body: bytes) -> dict[str, Any]:
    """POST one held request, read the answer to the end; times are time.monotonic() (shared with the upstream)."""
    mono = time.monotonic
    async with session.post(url, data=body, headers=REQUEST_HEADERS, proxy=proxy) as resp:
        first_data = None
        parts = []
        async for chunk in resp.content.iter_any():
            if first_data is None and b"data:" in chunk:  # not a keepalive comment
                first_data = mono()
            parts.append(chunk)
        raw = b"".join(parts)
        # a proxy may send SSE comments (Switchyard's pre-answer keepalive after 15 s): not part of the answer
        answer, comments = _SSE_COMMENT.subn(b"", raw)
        return {"status": resp.status, "answer": answer, "nbytes": len(raw), "comments": comments,
                "first_data_at": first_data, "end_at": mono(),
                "header_upstream": resp.headers.get("x-switchyard-upstream")}


async def staging_phase(args: argparse.Namespace, ports: list[int], path: str, pid: int, proxy: str,
                        progress: Any) -> dict[str, Any]:
    """N concurrent streams through one proxy, all held (role + lifecycle frames only) for a while."""
    import aiohttp

    n = args.staging_streams
    hold_s = args.staging_hold_s
    wait_s = 30 + n / 50  # bound for all N to reach the upstream (the barrier)
    stream_bound = wait_s + hold_s + 60 + STAGING_TOKENS_MAX * args.gap_ms / 1000 * 50
    group = f"{path}-{os.getpid()}-{time.monotonic_ns()}"
    body = json.dumps({**json.loads(REQUEST_BODY), HOLD_FIELD: round(hold_s * 1000), "bench_hold_group": group,
                       "bench_hold_n": n, "bench_hold_wait_ms": round(wait_s * 1000)}).encode()
    url = f"http://127.0.0.1:{ports[0]}/ok/v1/chat/completions"
    first, rest = hold_answer_frames("ok", min(args.tokens, STAGING_TOKENS_MAX))
    expected = b"".join(first + rest)

    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()

    async def sample_rss() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), rss_kb(pid)))
            try:
                await asyncio.wait_for(stop.wait(), 0.05)
            except TimeoutError:
                pass

    results: list[dict[str, Any] | None] = [None] * n
    errors: list[str] = []

    async def one(i: int) -> None:
        try:
            results[i] = await asyncio.wait_for(staged_stream(session, url, proxy, body), stream_bound)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a failed stream is a result
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    timeout = aiohttp.ClientTimeout(total=stream_bound, sock_connect=30, sock_read=wait_s + hold_s + 30)
    connector = aiohttp.TCPConnector(limit=n + 10, limit_per_host=n + 10)
    session = aiohttp.ClientSession(trust_env=False, connector=connector, timeout=timeout, auto_decompress=False)
    status: dict[str, Any] = {}
    try:
        before_kb = rss_kb(pid)
        hwm_before_kb = status_kb(pid, "VmHWM")
        sampler = asyncio.create_task(sample_rss())
        t0 = time.monotonic()
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        _, pending = await asyncio.wait(tasks, timeout=stream_bound + 15)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10)
            errors.append(f"phase timeout: {len(pending)} stream(s) still open after {stream_bound + 15:.0f} s")
        stop.set()
        await asyncio.wait([sampler], timeout=5)
        wall = time.monotonic() - t0
        hwm_after_kb = status_kb(pid, "VmHWM")
        async with (aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=10)) as direct,
                    direct.get(f"http://127.0.0.1:{ports[0]}/bench/hold-status/{group}") as resp):
            status = await resp.json()
    finally:
        try:
            await asyncio.wait_for(session.close(), 10)
        except (OSError, TimeoutError, aiohttp.ClientError):
            pass

    release_at = status.get("release_at")
    all_at = status.get("all_at")
    complete = early = comments = 0
    for result in results:
        if result is None:
            continue
        comments += result["comments"]
        problem = None
        if result["status"] != 200:
            problem = f"status {result['status']}"
        elif not result["answer"].endswith(DONE):
            problem = f"no [DONE] at the end ({len(result['answer'])} bytes, wanted {len(expected)})"
        elif result["answer"] != expected:
            problem = f"answer differs from the upstream's ({len(result['answer'])} bytes, wanted {len(expected)})"
        elif path == "switchyard" and result["header_upstream"] != "primary":
            problem = f"not relayed by Switchyard (x-switchyard-upstream {result['header_upstream']!r})"
        if release_at is not None and result["first_data_at"] is not None and result["first_data_at"] < release_at:
            early += 1
            if path == "switchyard" and problem is None:
                problem = "a data frame reached the client before the release: not held in staging"
        if problem is None:
            complete += 1
        else:
            errors.append(problem)
    arrived = status.get("arrived", 0)
    if not status.get("known") or status.get("timed_out") or all_at is None:
        errors.append(f"not all {n} streams were held at once: {arrived} reached the upstream within {wait_s:.0f} s")
    held = [kb for t, kb in samples if all_at is not None and release_at is not None and all_at <= t <= release_at]
    sampled_peak_kb = max([kb for _, kb in samples] + [before_kb])
    # a 50 ms sampler can miss a short spike; the kernel's high-water mark cannot, if it rose in this phase
    peak_kb = max(sampled_peak_kb, hwm_after_kb if hwm_after_kb > hwm_before_kb else 0)
    entry = {
        "path": path,
        "streams": n,
        "complete": complete,
        "failed": n - complete,
        "errors": sorted(set(errors))[:10],
        "error_count": len(errors),
        "reached_upstream": arrived,
        "first_data_before_release": early,
        "sse_comments_received": comments,  # e.g. Switchyard keepalives if a stream waited over 15 s
        "hold_s": hold_s,
        "held_all_s": None if all_at is None or release_at is None else release_at - all_at,
        "all_reached_upstream_after_s": None if all_at is None else all_at - t0,
        "wall_s": wall,
        "rss_before_mb": before_kb / 1024,
        "rss_peak_held_mb": max(held) / 1024 if held else None,
        "rss_peak_mb": peak_kb / 1024,
        "rss_peak_minus_before_mb": (peak_kb - before_kb) / 1024,
        "rss_peak_sampled_mb": sampled_peak_kb / 1024,
        "vmhwm_before_mb": hwm_before_kb / 1024,
        "vmhwm_after_mb": hwm_after_kb / 1024,
        "rss_samples": len(samples),
        "rss_samples_held": len(held),
    }
    progress(f"staging {path:<10} n={n}: {complete} complete, {n - complete} failed; RSS {entry['rss_before_mb']:.1f} -> "
             f"peak {entry['rss_peak_mb']:.1f} MB (+{entry['rss_peak_minus_before_mb']:.1f}); wall {wall:.1f} s")
    return entry


async def websocket_phase(args: argparse.Namespace, ports: list[int],
                          proxies: dict[str, tuple[int | None, str | None]], progress: Any) -> dict[str, Any]:
    """Responses over one WebSocket per path and round: `--ws-turns` turns of
    `--tokens` deltas each, the paths interleaved.  Per turn: time to the first
    delta and to `response.completed`; per path: proxy CPU per message."""
    import aiohttp

    url = f"http://127.0.0.1:{ports[0]}{WS_PATH}"
    expected = [json.loads(m)["type"] for m in ws_turn_messages("x", args.tokens)]
    out: dict[str, Any] = {p: {"ttft": [], "ttlb": [], "cpu_s": 0.0, "messages": 0, "errors": []} for p in PATHS}

    async def turn(ws: Any) -> tuple[float, float]:
        t0 = time.perf_counter()
        await ws.send_str(json.dumps({"type": "response.create", "model": "bench", "input": "hi"}))
        first = None
        types = []
        while True:
            msg = await ws.receive(timeout=60)
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"WebSocket ended mid-turn: {msg.type}")
            kind = json.loads(msg.data)["type"]
            types.append(kind)
            if first is None and kind == "response.output_text.delta":
                first = time.perf_counter() - t0
            if kind == "response.completed":
                break
        if types != expected:
            raise RuntimeError(f"turn arrived altered: {len(types)} messages, wanted {len(expected)}")
        assert first is not None
        return first, time.perf_counter() - t0

    async with aiohttp.ClientSession(trust_env=False) as session:
        for round_no in range(args.rounds):
            shift = round_no % len(PATHS)
            for path in PATHS[shift:] + PATHS[:shift]:
                pid, proxy = proxies[path]
                entry = out[path]
                try:
                    async with session.ws_connect(url, proxy=proxy, autoping=True) as ws:
                        await turn(ws)  # untimed: opens the relay's and the upstream's connections
                        cpu_before = cpu_seconds(pid)
                        for _ in range(args.ws_turns):
                            ttft, ttlb = await turn(ws)
                            entry["ttft"].append(ttft)
                            entry["ttlb"].append(ttlb)
                        if pid is not None:
                            entry["cpu_s"] += cpu_seconds(pid) - cpu_before
                        entry["messages"] += args.ws_turns * len(expected)
                except (RuntimeError, OSError, TimeoutError, aiohttp.ClientError) as exc:
                    entry["errors"].append(f"{type(exc).__name__}: {exc}"[:300])
                progress(f"websocket round {round_no + 1}/{args.rounds} {path:<10} {args.ws_turns} turns"
                         + (f"  FAILED: {entry['errors'][-1]}" if entry["errors"] else ""))
    summary: dict[str, Any] = {"turns": args.ws_turns * args.rounds, "messages_per_turn": len(expected)}
    for path in PATHS:
        entry = out[path]
        summary[path] = {
            "ttft_median_s": median(entry["ttft"]), "ttlb_median_s": median(entry["ttlb"]),
            "cpu_us_per_message": (entry["cpu_s"] / entry["messages"] * 1e6
                                   if entry["messages"] and proxies[path][0] else None),
            "errors": entry["errors"],
        }
    sw, plain = summary["switchyard"], summary["plain"]
    if sw["cpu_us_per_message"] and plain["cpu_us_per_message"]:
        summary["cpu_ratio"] = sw["cpu_us_per_message"] / plain["cpu_us_per_message"]
    if sw["ttft_median_s"] is not None and plain["ttft_median_s"] is not None:
        summary["added_ttft_ms"] = (sw["ttft_median_s"] - plain["ttft_median_s"]) * 1000
        summary["added_ttlb_ms"] = (sw["ttlb_median_s"] - plain["ttlb_median_s"]) * 1000
    return summary


# The run
# --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, ports: list[int], proxies: dict[str, tuple[int | None, str | None]],
              upstream_pid: int, progress: Any, measuring: Any = None) -> tuple[Bench, dict[str, Any]]:
    bench = Bench(args, ports, proxies, upstream_pid)
    await bench.open()
    try:
        top = max(args.concurrency + args.burst)
        progress(f"warm-up: {top} concurrent streams per path, then fallbacks")
        for path in PATHS:
            warm = await bench.cell(path, "happy", top, top, None)
            fails = [s["error"] for s in warm["samples"] if not s["ok"]]
            if fails:
                raise RuntimeError(f"warm-up on {path} failed: {fails[:3]}")
            warm = await bench.cell(path, "fallback", min(top, 10), min(top, 10), None)
            fails = [s["error"] for s in warm["samples"] if not s["ok"]]
            if fails:
                raise RuntimeError(f"fallback warm-up on {path} failed: {fails[:3]}")
        warm = await bench.cell("switchyard", "continue", min(top, 10), min(top, 10), None)
        fails = [s["error"] for s in warm["samples"] if not s["ok"]]
        if fails:
            raise RuntimeError(f"continue-after-cut warm-up failed: {fails[:3]}")
        idle_rss = {path: rss_kb(proxies[path][0]) / 1024 for path in PATHS if proxies[path][0]}
        if measuring is not None:
            measuring()
        for round_no in range(args.rounds):
            for c in args.concurrency:
                for kind in ("happy", "fallback", "continue"):
                    n = (max(args.streams, c * args.waves) if kind == "happy"
                         else max(args.fallback_streams, c))
                    shift = (round_no + (kind == "fallback")) % len(PATHS)
                    order = PATHS[shift:] + PATHS[:shift] if kind != "continue" else ("switchyard",)
                    for path in order:
                        cell = await bench.cell(path, kind, c, n, round_no)
                        bad = sum(1 for s in cell["samples"] if not s["ok"])
                        cpu = cell["proxy_cpu_s"]
                        progress(
                            f"round {round_no + 1}/{args.rounds} c={c:<3} {kind:<8} {path:<10} n={n:<4} "
                            f"wall {cell['wall_s']:6.2f}s"
                            + (f"  proxy cpu/stream {cpu / n * 1000:7.2f} ms" if cpu is not None else "")
                            + (f"  FAILED {bad}" if bad else "")
                        )
            for c in args.burst:
                n = c * args.bursts
                shift = round_no % len(PATHS)
                for path in PATHS[shift:] + PATHS[:shift]:
                    cell = await bench.cell(path, "burst", c, n, round_no)
                    bad = sum(1 for s in cell["samples"] if not s["ok"])
                    cpu = cell["proxy_cpu_s"]
                    ttft = median([s["ttft"] for s in cell["samples"] if s["ok"] and s["ttft"] is not None])
                    progress(
                        f"round {round_no + 1}/{args.rounds} c={c:<3} burst    {path:<10} n={n:<4} "
                        f"wall {cell['wall_s']:6.2f}s"
                        + (f"  TTFT median {ttft * 1000:6.2f} ms" if ttft is not None else "")
                        + (f"  proxy cpu/stream {cpu / n * 1000:7.2f} ms" if cpu is not None else "")
                        + (f"  FAILED {bad}" if bad else "")
                    )
        extra: dict[str, Any] = {"idle_rss_mb_after_warmup": idle_rss}
        if args.ws_turns:
            progress(f"websocket: {args.ws_turns} Responses turns per path and round over one WebSocket each")
            extra["websocket"] = await websocket_phase(args, ports, proxies, progress)
        if args.staging_streams:
            await bench.close()
            staging: dict[str, Any] = {}
            for path in ("plain", "switchyard"):
                pid, proxy = proxies[path]
                assert pid is not None and proxy is not None
                progress(f"staging: {args.staging_streams} concurrent held streams through {PATH_LABEL[path]}, "
                         f"held {args.staging_hold_s:g} s")
                staging[path] = await staging_phase(args, ports, path, pid, proxy, progress)
            staging["verdict"] = staging_verdict(staging)
            extra["staging"] = staging
        return bench, extra
    finally:
        await bench.close()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20, help="happy-path streams per path, concurrency level and round (at least the concurrency)")
    parser.add_argument("--fallback-streams", type=int, default=10, help="fallback streams per path, concurrency level and round (at least the concurrency)")
    parser.add_argument("--waves", type=int, default=4,
                        help="happy-path streams per cell are at least this many times the concurrency: one wave "
                             "of 50 streams lasts about half a second, too short to read CPU time to within a few "
                             "percent (default 4, with --quick 1)")
    parser.add_argument("--tokens", type=int, default=200, help="content frames per answer")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="pause before each content frame, like a model between tokens")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 20, 50], help="concurrency levels (default: 1 20 50)")
    parser.add_argument("--burst", type=int, nargs="*", default=[20, 50], metavar="C",
                        help="burst sizes: C happy requests started in one loop pass, timed from that moment, the "
                             "next burst once all have ended (default: 20 50; none to skip)")
    parser.add_argument("--bursts", type=int, default=6, help="bursts per path, size and round (default 6, with --quick 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (1 round, 50 tokens, few streams)")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--keep-logs", type=Path, help="copy the mitmdump and upstream logs into this directory")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="record both proxies with py-spy during the measured rounds (collapsed stacks and a "
                             "summary in DIR); sampling costs CPU, so do not quote a profiled run's figures")
    parser.add_argument("--staging-streams", type=int, default=None, metavar="N",
                        help="after the measured rounds, hold N concurrent streams in each proxy (role + lifecycle "
                             "frames only) and report peak RSS; 0 skips (default 1000, with --quick 200)")
    parser.add_argument("--staging-hold-s", type=float, default=3.0, metavar="S",
                        help=f"how long the N streams are held once all reached the upstream (default 3, at most "
                             f"{STAGING_HOLD_MAX_S:g})")
    parser.add_argument("--ws-turns", type=int, default=None, metavar="N",
                        help="Responses turns over WebSocket per path and round (each --tokens deltas, --gap-ms "
                             "apart); 0 skips (default 20, with --quick 3)")
    parser.add_argument("--switchyard-set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a mitmproxy option for the Switchyard proxy only (repeatable), e.g. "
                             "switchyard_direct_relay=false to measure the relay's answers through its socket")
    parser.add_argument("--max-lifetime", type=float, default=3600, help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
        args.tokens = min(args.tokens, 50)
        args.streams = min(args.streams, 5)
        args.fallback_streams = min(args.fallback_streams, 3)
        args.waves = 1
        args.bursts = min(args.bursts, 2)
    if args.ws_turns is None:
        args.ws_turns = 3 if args.quick else 20
    if args.ws_turns < 0:
        parser.error("--ws-turns must not be negative")
    if args.staging_streams is None:
        args.staging_streams = 200 if args.quick else 1000
    if args.staging_streams < 0:
        parser.error("--staging-streams must not be negative")
    if not 0 < args.staging_hold_s <= STAGING_HOLD_MAX_S:
        parser.error(f"--staging-hold-s must be above 0 and at most {STAGING_HOLD_MAX_S:g}")
    if min(args.concurrency) < 1 or min(args.burst, default=1) < 1 or args.bursts < 1 or args.streams < 1 or args.fallback_streams < 1 or args.waves < 1 or args.rounds < 1 or args.tokens < 1:
        parser.error("--concurrency, --streams, --fallback-streams, --rounds and --tokens must be at least 1")
    if args.gap_ms < 0:
        parser.error("--gap-ms must not be negative")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.tokens, args.gap_ms / 1000, args.max_lifetime))
        return 0

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", file=sys.stderr, flush=True)

    info = machine()
    nofile_soft, nofile_hard = raise_nofile_limit()  # inherited by the upstream and both mitmdumps
    need = 3 * args.staging_streams + 512
    if args.staging_streams and nofile_soft < need:
        print(f"bench: --staging-streams {args.staging_streams} needs about {need} file descriptors per process; "
              f"RLIMIT_NOFILE is {nofile_soft} (hard {nofile_hard})", file=sys.stderr)
        return 2
    children: list[Child] = []
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    try:
        upstream, ports = start_upstream(args, workdir)
        children.append(upstream)
        progress(f"upstream pid {upstream.pid} on ports {ports}")
        rules = workdir / "rules.yaml"
        rules.write_text(RULES.format(backup_port=ports[1], backup_key=BACKUP_KEY))
        plain, plain_port = start_mitmdump("plain", workdir, ["--set", "stream_large_bodies=1"])
        children.append(plain)
        options = [arg for option in args.switchyard_set for arg in ("--set", option)]
        switchyard, sw_port = start_mitmdump("switchyard", workdir,
                                             ["-s", str(ADDON), "--set", f"switchyard_rules={rules}", *options])
        children.append(switchyard)
        progress(f"plain mitmdump pid {plain.pid} :{plain_port}; switchyard mitmdump pid {switchyard.pid} :{sw_port}")
        proxies: dict[str, tuple[int | None, str | None]] = {
            "direct": (None, None),
            "plain": (plain.pid, f"http://127.0.0.1:{plain_port}"),
            "switchyard": (switchyard.pid, f"http://127.0.0.1:{sw_port}"),
        }
        profilers: list[Child] = []

        def measuring() -> None:
            if args.profile:
                profilers.extend(start_profilers(args.profile, {"plain": plain.pid, "switchyard": switchyard.pid},
                                                 args.max_lifetime))
                children.extend(profilers)
                progress(f"py-spy recording into {args.profile}")

        bench, extra = asyncio.run(run(args, ports, proxies, upstream.pid, progress, measuring))
        for profiler in profilers:
            profiler.stop()
        hwm = {name: status_kb(pid, "VmHWM") / 1024 for name, (pid, _) in proxies.items() if pid}
        for child in (plain, switchyard):
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} mitmdump exited during the run:\n{child.log_path.read_text(errors='replace')[-3000:]}")
        wall = time.monotonic() - started
        levels = sorted(set(args.concurrency) | set(args.burst))
        summary = summarize(bench.cells, bench.rss_peak_kb, levels)
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("serve", "max_lifetime")}
        print()
        print("## Switchyard benchmark")
        print()
        print(f"Machine: {info['cpu_model']}, {info['cores']} cores ({info['cores_usable']} usable), Linux {info['kernel']}, "
              f"Python {info['python']}, mitmproxy {info['mitmproxy']}, httptools {info['httptools']}")
        try:
            python = os.path.relpath(sys.executable)
        except ValueError:
            python = sys.executable
        print(f"Command: {python} {os.path.relpath(Path(__file__).resolve())} {' '.join(argv)}".rstrip())
        print(f"Run: {args.rounds} interleaved round(s); {args.tokens} content frames per answer, {args.gap_ms:g} ms apart; "
              f"per path, level and round {args.streams} happy (at least {args.waves} x the concurrency) / "
              f"{args.fallback_streams} fallback streams (at least the concurrency); wall time {wall:.1f} s")
        plain_c1 = summary.get(f"happy/c{min(args.concurrency)}/plain", {})
        if plain_c1.get("ttfb") and plain_c1.get("ttlb") and args.tokens * args.gap_ms >= 50:
            if plain_c1["ttfb"]["median"] > 0.5 * plain_c1["ttlb"]["median"]:
                print("WARNING: plain mitmdump's first byte came late: it does not seem to stream (stream_large_bodies)")
        measured = [cell for cell in bench.cells]
        cell_wall = sum(cell["wall_s"] for cell in measured) or 1.0
        foreign = sum(cell["foreign_cpu_s"] for cell in measured) / cell_wall
        foreign_max = max((cell["foreign_cpu_s"] / cell["wall_s"] for cell in measured if cell["wall_s"] > 0), default=0.0)
        steal = sum(cell["steal_cpu_s"] for cell in measured) / cell_wall
        print(f"Machine load from other processes during the measured cells: {100 * foreign:.0f}% of one core on "
              f"average (worst cell {100 * foreign_max:.0f}%), hypervisor steal {100 * steal:.0f}%; "
              f"load average at the end {os.getloadavg()[0]:.2f}")
        if foreign > 0.1 or foreign_max > 0.3:
            print("WARNING: other processes were busy on this machine; latency figures (p99, c>1) are disturbed. "
                  "Ratios are fairer than absolute values because the paths are interleaved.")
        print()
        print(headline(summary, bench.cells, args.concurrency, args.burst))
        print()
        print(report(summary, levels))
        print()
        if "websocket" in extra:
            print(websocket_report(extra["websocket"]))
            print()
        if "staging" in extra:
            print(staging_report(extra["staging"]))
            print()
        print("Proxy peak memory over the whole run (VmHWM): "
              + ", ".join(f"{PATH_LABEL[k]} {v:.1f} MB" for k, v in hwm.items())
              + "; after warm-up, idle: "
              + ", ".join(f"{PATH_LABEL[k]} {v:.1f} MB" for k, v in extra["idle_rss_mb_after_warmup"].items()))
        for c in args.concurrency:
            sw = summary.get(f"happy/c{c}/switchyard", {}).get("proxy_cpu_s_per_stream_by_round")
            pl = summary.get(f"happy/c{c}/plain", {}).get("proxy_cpu_s_per_stream_by_round")
            if sw and pl:
                print(f"CPU ratio switchyard / plain by round, c={c}: " + ", ".join(f"{a / b:.2f}x" for a, b in zip(sw, pl) if b))
        if profilers:
            parts = []
            for name in ("plain", "switchyard"):
                collapsed = args.profile / f"{name}.collapsed.txt"
                if collapsed.exists():
                    parts.append(summarize_profile(collapsed))
            (args.profile / "summary.txt").write_text("\n\n".join(parts) + "\n")
            print(f"Profiles: {args.profile} (summary.txt; the figures above include py-spy's sampling cost)")
        errors = {k: v["errors"] for k, v in summary.items() if v.get("errors")}
        if errors:
            print("Errors: " + json.dumps(errors, indent=1))
        if args.json:
            payload = {"machine": info, "config": config, "wall_s": wall, "summary": summary, "vmhwm_mb": hwm,
                       **extra, "cells": bench.cells}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(payload, indent=1))
            print(f"Raw numbers: {args.json}")
        staging_failed = any(extra.get("staging", {}).get(p, {}).get("error_count") for p in ("plain", "switchyard"))
        staging_failed = staging_failed or any(extra.get("websocket", {}).get(p, {}).get("errors") for p in PATHS)
        return 1 if staging_failed or any(v["failed"] for v in summary.values()) else 0
    except KeyboardInterrupt:
        print("\ninterrupted; stopping processes", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"\nbench failed: {exc}", file=sys.stderr)
        for child in children:
            if child.name in ("plain", "switchyard") and child.log_path and child.log_path.exists():
                lines = child.log_path.read_text(errors="replace").splitlines()
                hits = [line for line in lines if "error" in line.lower() or "Traceback" in line][-12:]
                if hits:
                    print(f"last error lines of the {child.name} mitmdump log:", file=sys.stderr)
                    print("\n".join("  " + line for line in hits), file=sys.stderr)
        return 2
    finally:
        for child in reversed(children):
            child.stop()
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for child in children:
                if child.log_path and child.log_path.exists():
                    (args.keep_logs / f"{child.name}.log").write_bytes(child.log_path.read_bytes())
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
