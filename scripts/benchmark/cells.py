"""One cell of the measurement: n streams of one kind on one path at concurrency c, with
the proxy's CPU, wake-ups and peak RSS over it and how busy the rest of the machine was."""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import aiohttp

from benchmark.clients import Read, Sample, new_session, read_cut_stream, read_stream
from benchmark.constants import PATHS, Proxies
from benchmark.frames import answer_frames, request_body
from benchmark.procstats import cpu_seconds, kernel_cpu_seconds, machine_busy_s, ours_cpu_s, rss_kb, wakeups

BURST_PAUSE_S = 0.05  # between one burst's end and the next one's start: the proxy settles first
RSS_SAMPLE_S = 0.02


class Bench:
    """The clients (one session per path, kept for the whole run) and the cells measured with them."""

    def __init__(self, args: argparse.Namespace, ports: list[int], proxies: Proxies, upstream_pid: int) -> None:
        self.args = args
        self.ok_url = f"http://127.0.0.1:{ports[0]}/ok/v1/chat/completions"
        self.fail_url = f"http://127.0.0.1:{ports[0]}/fail/v1/chat/completions"
        self.backup_url = f"http://127.0.0.1:{ports[1]}/backup/v1/chat/completions"
        self.xfail_url = f"http://127.0.0.1:{ports[0]}/xfail/v1/chat/completions"
        self.cut_url = f"http://127.0.0.1:{ports[0]}/cut/v1/chat/completions"
        self.proxies = proxies
        self.upstream_pid = upstream_pid
        self.all_pids = [upstream_pid] + [pid for pid, _ in proxies.values() if pid]
        self.expected_len = {name: len(b"".join(answer_frames(name, args.tokens))) for name in ("ok", "backup")}
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self.request = request_body(args.prompt_kb)  # what every client of the run sends (--prompt-kb)
        self.stream_timeout = 30 + args.tokens * args.gap_ms / 1000 * 20
        self.cells: list[dict[str, Any]] = []
        self.rss_peak_kb: dict[tuple[str, int], int] = {}

    async def open(self) -> None:
        limit = max(self.args.concurrency + self.args.burst)
        timeout = aiohttp.ClientTimeout(total=self.stream_timeout, sock_connect=10, sock_read=30)
        for path in PATHS:
            self.sessions[path] = new_session(timeout, limit)

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
        read = await read_stream(self.sessions[path], self.ok_url, proxy, t0, self.request)
        error = self._check(read, "ok")
        if error is None and path == "switchyard" and read.header_upstream != "primary":
            error = f"not relayed by Switchyard (x-switchyard-upstream {read.header_upstream!r})"
        return Sample(error is None, read.ttfb, read.ttft, read.ttlb, read.upstream, error=error)

    async def fallback(self, path: str) -> Sample:
        _, proxy = self.proxies[path]
        session = self.sessions[path]
        t0 = time.perf_counter()
        if path == "switchyard":  # the proxy falls back by itself
            read = await read_stream(session, self.fail_url, proxy, t0, self.request)
            error = self._check(read, "backup")
            if error is None and read.header_upstream != "backup":
                error = f"x-switchyard-upstream {read.header_upstream!r}"
            return Sample(error is None, read.ttfb, read.ttft, read.ttlb, read.upstream, error=error)
        # without Switchyard the client must notice the error frame and ask the backup itself
        first = await read_stream(session, self.fail_url, proxy, t0, self.request)
        if first.tte is None:
            return Sample(False, error=f"failing upstream gave no error frame (status {first.status})")
        t1 = time.perf_counter()
        read = await read_stream(session, self.backup_url, proxy, t1, self.request)
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

    async def translated(self, path: str) -> Sample:
        """Switchyard only: the primary fails before output and the backup speaks Anthropic
        Messages, its answer translated into the client's Chat Completions."""
        _, proxy = self.proxies[path]
        read = await read_stream(self.sessions[path], self.xfail_url, proxy, time.perf_counter(), self.request)
        error = None
        if read.status != 200:
            error = f"status {read.status}"
        elif read.upstream != "xbackup" or read.header_upstream != "backup":
            error = f"answer from {read.upstream!r} (x-switchyard-upstream {read.header_upstream!r})"
        elif not read.ended_done:
            error = "no [DONE] at the end"
        elif read.ttft is None:
            error = "no content"
        return Sample(error is None, read.ttfb, read.ttft, read.ttlb, read.upstream, error=error)

    async def cont(self, path: str) -> Sample:
        """Switchyard only: a stream cut after output, finished by the prefill backup."""
        _, proxy = self.proxies[path]
        read = await read_cut_stream(self.sessions[path], self.cut_url, proxy, self.request)
        want = self.args.tokens  # the cut answer's CUT_AFTER frames, then the prefill backup's rest
        error = None
        if read.status != 200:
            error = f"status {read.status}"
        elif not read.ended_done:
            error = f"no [DONE] at the end: {read.tail[-120:]!r}"
        elif read.content_frames != want:
            error = f"{read.content_frames} content frames, wanted {want}"
        elif read.gap is None:
            error = "no continued content"
        return Sample(error is None, cut_gap=read.gap, error=error)

    # --- one cell: n streams on one path at concurrency c ------------------------------

    async def _guarded(self, run: Awaitable[Sample]) -> Sample:
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
        """Measure one cell; a cell with a `round_no` is recorded, a warm-up (None) only returned."""
        pid, _ = self.proxies[path]
        kinds: dict[str, Callable[[str], Awaitable[Sample]]] = {
            "happy": self.happy, "burst": self.happy, "fallback": self.fallback, "continue": self.cont,
            "translated": self.translated}
        run_one = kinds[kind]
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
                    await asyncio.wait_for(stop_sampling.wait(), RSS_SAMPLE_S)
                except TimeoutError:
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
