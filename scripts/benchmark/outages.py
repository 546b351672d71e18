"""The outage rows (issue 26): while a route's primary is out, how soon the second and later
requests get their first content through Switchyard, against the same client going straight
to the backup (directly, and through plain mitmdump); and a slow first token hedged
(`hedge_after_s`) against the backup's own first content.

Each scenario is a route of its own, on a host nobody resolves (OUTAGE_HOST: its upstreams
are named by URL), whose backup is the benchmark upstream's normal `/backup/` answer and
whose primary is out one way:

  hung      a loopback port that takes connections (the kernel completes them into its
            backlog) and never reads or answers them; the route's `headers_timeout_s` is
            HUNG_HEADERS_TIMEOUT_S, which the request that finds the outage waits;
  refused   a port bound and not listening: every connect is refused;
  limited   an HTTP server answering `429` (`rate_limit_exceeded`) with `Retry-After`;
  hedge     not an outage: a primary whose head and role frame come at once and whose first
            content comes only after SLOW_FIRST_TOKEN_S; the route has `hedge_after_s`
            HEDGE_AFTER_S, so the backup is asked beside it and wins.

The skips are made to outlast the run (`unreachable_skip_s`, `max_skip_s` and the stated
delay are RUN_SKIP_S), so that every measured request is one that skips: the request that
finds the outage is measured once, before the rounds, and shown apart; a real probe (one
request every `unreachable_skip_s`) costs what that first request did.

The limited and slow servers run on this process's own event loop, and the hung and
refused ports are plain sockets it holds: the limited server answers only the request that
finds the outage, the slow one writes one head and one frame per request and is then
dropped, so none of them is a measurable part of the client's time.

Per round the cells go in rotating order (so that drift hits them alike): the backup
directly, the backup through plain mitmdump, and each scenario through Switchyard, each
`--outages` requests one after another (concurrency 1), every answer checked whole.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from benchmark.cells import Bench
from benchmark.clients import read_stream
from benchmark.constants import Progress
from benchmark.frames import BACKUP_KEY, answer_frames
from benchmark.procstats import cpu_seconds
from benchmark.report import median, percentile

OUTAGE_HOST = "outage.bench"
SCENARIOS = ("hung", "refused", "limited", "hedge")
LABEL = {
    "hung": "primary hung (accepts, never answers)",
    "refused": "primary refuses connections",
    "limited": "primary answers 429 with Retry-After",
    "hedge": "primary's first token slow, `hedge_after_s` on",
}
HUNG_HEADERS_TIMEOUT_S = 1.0
RUN_SKIP_S = 3600
SLOW_FIRST_TOKEN_S = 2.0
HEDGE_AFTER_S = 0.2
LIMITED_BODY = json.dumps({"error": {"message": "Rate limit reached for requests", "type": "requests",
                                     "param": None, "code": "rate_limit_exceeded"}}).encode()

ROUTES = """\
  - name: bench-outage-{name}
    match: {{host: {host}, path: /{name}/v1/chat/completions}}
{settings}    upstreams:
      - {{name: primary, url: "http://127.0.0.1:{port}/{name}/v1/chat/completions", retries: 0}}
      - name: backup
        url: http://127.0.0.1:{backup_port}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer {backup_key}"}}
"""
SETTINGS = {
    "hung": f"    headers_timeout_s: {HUNG_HEADERS_TIMEOUT_S:g}\n    unreachable_skip_s: {RUN_SKIP_S}\n",
    "refused": f"    unreachable_skip_s: {RUN_SKIP_S}\n",
    "limited": f"    max_skip_s: {RUN_SKIP_S}\n",
    "hedge": f"    hedge_after_s: {HEDGE_AFTER_S:g}\n",
}


def _bound(listen: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    if listen:
        sock.listen(64)
    sock.setblocking(False)
    return sock


@dataclass
class OutageUpstreams:
    """The primaries' sockets, bound before the proxies start (their ports go in the rules)."""

    sockets: dict[str, socket.socket] = field(default_factory=dict)
    servers: list[asyncio.Server] = field(default_factory=list)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    limited_requests: int = 0

    @classmethod
    def open(cls) -> OutageUpstreams:
        return cls({"hung": _bound(True), "refused": _bound(False), "limited": _bound(True), "hedge": _bound(True)})

    def port(self, name: str) -> int:
        return int(self.sockets[name].getsockname()[1])

    def routes(self, backup_port: int) -> str:
        """The scenarios' routes, to append to the benchmark's rules (their host is nobody else's)."""
        return "".join(ROUTES.format(name=name, host=OUTAGE_HOST, settings=SETTINGS[name], port=self.port(name),
                                     backup_port=backup_port, backup_key=BACKUP_KEY) for name in SCENARIOS)

    async def serve(self, tokens: int) -> None:
        frames = answer_frames("slow", tokens)
        self.servers.append(await asyncio.start_server(self._limited, sock=self.sockets["limited"]))
        self.servers.append(await asyncio.start_server(lambda r, w: self._slow(r, w, frames),
                                                       sock=self.sockets["hedge"]))

    async def close(self) -> None:
        """Stop serving and end the connections a proxy's pool still keeps."""
        for server in self.servers:
            server.close()
        for writer in list(self.writers):
            writer.close()
        for server in self.servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 5)
            except TimeoutError:
                pass
        for sock in self.sockets.values():
            sock.close()

    async def _request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request (head and Content-Length body); False at the connection's end."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length:
            await reader.readexactly(length)
        return True

    async def _limited(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while await self._request(reader):
                self.limited_requests += 1
                writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                             + f"Retry-After: {RUN_SKIP_S}\r\nContent-Length: {len(LIMITED_BODY)}\r\n\r\n".encode()
                             + LIMITED_BODY)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _slow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frames: list[bytes]) -> None:
        def chunk(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        self.writers.add(writer)
        try:
            while await self._request(reader):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n" + chunk(frames[0]))
                await writer.drain()
                try:  # a hedge's loser is dropped before its first token: the read sees the end
                    if not await asyncio.wait_for(reader.read(1), SLOW_FIRST_TOKEN_S):
                        return
                except TimeoutError:
                    pass
                writer.write(b"".join(chunk(frame) for frame in frames[1:]) + b"0\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()


def _url(name: str) -> str:
    return f"http://{OUTAGE_HOST}/{name}/v1/chat/completions"


async def _one(bench: Bench, path: str, url: str) -> dict[str, Any]:
    """One request to the end; its first content (s) and what was wrong with it, if anything."""
    _, proxy = bench.proxies[path]
    read = await read_stream(bench.sessions[path], url, proxy, time.perf_counter(), bench.request)
    error = None
    if read.status != 200:
        error = f"status {read.status}"
    elif read.upstream != "backup":
        error = f"answer from {read.upstream!r}, wanted the backup's"
    elif read.nbytes != bench.expected_len["backup"] or not read.ended_done:
        error = f"{read.nbytes} bytes, wanted {bench.expected_len['backup']} ending in [DONE]"
    elif path == "switchyard" and read.header_upstream != "backup":
        error = f"x-switchyard-upstream {read.header_upstream!r}"
    return {"ttft": read.ttft, "attempts": read.header_attempts, "error": error}


async def _cell(bench: Bench, path: str, url: str, n: int) -> dict[str, Any]:
    pid, _ = bench.proxies[path]
    cpu0 = cpu_seconds(pid)
    samples = [await asyncio.wait_for(_one(bench, path, url), bench.stream_timeout) for _ in range(n)]
    return {"samples": samples, "cpu_s": cpu_seconds(pid) - cpu0 if pid else None}


async def outage_phase(bench: Bench, upstreams: OutageUpstreams, progress: Progress) -> dict[str, Any]:
    """The request that finds each outage, then `--outages` requests per cell and round."""
    args = bench.args
    n = args.outages
    await upstreams.serve(args.tokens)
    first = {}
    for name in SCENARIOS:
        one = await _one(bench, "switchyard", _url(name))
        first[name] = one
        if one["error"]:
            raise RuntimeError(f"outage {name}: the first request failed: {one['error']}")
    cells: list[tuple[str, str, str]] = [("direct", "backup", bench.backup_url), ("plain", "backup", bench.backup_url)]
    cells += [("switchyard", name, _url(name)) for name in SCENARIOS]
    out: dict[str, Any] = {"n": n, "rounds": args.rounds, "first": first, "cells": []}
    for round_no in range(args.rounds):
        shift = round_no % len(cells)
        for path, name, url in cells[shift:] + cells[:shift]:
            cell = await _cell(bench, path, url, n)
            out["cells"].append({"round": round_no, "path": path, "scenario": name, **cell})
            ttft = median([s["ttft"] for s in cell["samples"] if s["ttft"] is not None])
            bad = sum(1 for s in cell["samples"] if s["error"])
            progress(f"outage round {round_no + 1}/{args.rounds} {name:<8} {path:<10} n={n}"
                     + (f"  TTFT median {ttft * 1000:7.2f} ms" if ttft is not None else "")
                     + (f"  FAILED {bad}" if bad else ""))
    out["limited_requests"] = upstreams.limited_requests
    return out


def _ttfts(cells: list[dict[str, Any]], path: str, name: str, round_no: int | None = None) -> list[float]:
    return [s["ttft"] for c in cells if c["path"] == path and c["scenario"] == name
            and (round_no is None or c["round"] == round_no) for s in c["samples"] if s["ttft"] is not None]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.2f}"


def outage_report(out: dict[str, Any]) -> list[str]:
    """The table: each scenario's first content against the backup's through plain mitmdump."""
    cells, n, rounds = out["cells"], out["n"], out["rounds"]
    errors = sorted({f"{c['scenario']}/{c['path']}: {s['error']}" for c in cells for s in c["samples"] if s["error"]})
    lines = [f"### During a primary's outage: the second and later requests ({n} a cell, concurrency 1, {rounds} "
             "round(s)), first content against going straight to the backup", "",
             "| scenario | figure | backup directly | backup through plain mitmdump | switchyard | switchyard / plain "
             "| switchyard − plain (ms) | ratio by round (medians) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name in SCENARIOS:
        less = HEDGE_AFTER_S if name == "hedge" else 0.0
        for stat, q in (("median", 50.0), ("p90", 90.0)):
            direct = percentile(_ttfts(cells, "direct", "backup"), q)
            plain = percentile(_ttfts(cells, "plain", "backup"), q)
            sw = percentile(_ttfts(cells, "switchyard", name), q)
            base = None if plain is None else plain + less
            ratio = "—" if sw is None or not base else f"**{sw / base:.2f}x**" if stat == "median" else f"{sw / base:.2f}x"
            diff = "—" if sw is None or base is None else f"{(sw - base) * 1000:+.2f}"
            by_round = "—"
            if stat == "median":
                per = []
                for r in range(rounds):
                    p, s = median(_ttfts(cells, "plain", "backup", r)), median(_ttfts(cells, "switchyard", name, r))
                    if p is not None and s is not None:
                        per.append(f"{s / (p + less):.2f}x")
                by_round = ", ".join(per) or "—"
            label = f"first content, {stat}" + (f" (backup columns + hedge_after_s {HEDGE_AFTER_S:g} s)"
                                                if name == "hedge" else "")
            lines.append(f"| {LABEL[name]} | {label} | {_ms(direct)} | {_ms(plain)} | {_ms(sw)} | {ratio} | {diff} "
                         f"| {by_round} |")
    cpu = {}
    for path, name in [("plain", "backup")] + [("switchyard", s) for s in SCENARIOS]:
        mine = [c for c in cells if c["path"] == path and c["scenario"] == name and c["cpu_s"] is not None]
        streams = sum(len(c["samples"]) for c in mine)
        cpu[name if path == "switchyard" else "plain"] = sum(c["cpu_s"] for c in mine) / streams if streams else None
    lines.append("")
    lines.append("Proxy CPU per request (ms): plain mitmdump to the backup " + _ms(cpu["plain"]) + "; switchyard "
                 + ", ".join(f"{name} {_ms(cpu[name])}" for name in SCENARIOS) + ".")
    first = out["first"]
    lines.append("The request that found each outage (once, before the rounds): first content "
                 + ", ".join(f"{name} {_ms(first[name]['ttft'])} ms" for name in SCENARIOS)
                 + f"; the 429 upstream was asked {out['limited_requests']} time(s) in the whole run. "
                 + "x-switchyard-attempts of the measured requests: "
                 + ", ".join(f"{name} {sorted({s['attempts'] for c in cells if c['scenario'] == name for s in c['samples']})}"
                             for name in SCENARIOS) + ".")
    if errors:
        lines.append("Outage errors: " + json.dumps(errors[:10]))
    return lines + [""]
