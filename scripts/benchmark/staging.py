"""Staging memory: N streams held at once in one proxy, whose answers carry nothing but
the role and lifecycle frames until all N have reached the upstream and a hold has passed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import aiohttp

from benchmark.clients import StagedRead, new_session, staged_stream
from benchmark.constants import Progress
from benchmark.frames import DONE, HOLD_FIELD, REQUEST_BODY, STAGING_TOKENS_MAX, hold_answer_frames
from benchmark.procstats import rss_kb, status_kb

RSS_SAMPLE_S = 0.05


async def staging_phase(args: argparse.Namespace, ports: list[int], path: str, pid: int, proxy: str,
                        progress: Progress) -> dict[str, Any]:
    """N concurrent streams through one proxy, all held (role + lifecycle frames only) for a while."""
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
                await asyncio.wait_for(stop.wait(), RSS_SAMPLE_S)
            except TimeoutError:
                pass

    results: list[StagedRead | None] = [None] * n
    errors: list[str] = []

    async def one(i: int) -> None:
        try:
            results[i] = await asyncio.wait_for(staged_stream(session, url, proxy, body), stream_bound)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a failed stream is a result
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    timeout = aiohttp.ClientTimeout(total=stream_bound, sock_connect=30, sock_read=wait_s + hold_s + 30)
    session = new_session(timeout, n + 10)
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
        comments += result.comments
        problem = None
        if result.status != 200:
            problem = f"status {result.status}"
        elif not result.answer.endswith(DONE):
            problem = f"no [DONE] at the end ({len(result.answer)} bytes, wanted {len(expected)})"
        elif result.answer != expected:
            problem = f"answer differs from the upstream's ({len(result.answer)} bytes, wanted {len(expected)})"
        elif path == "switchyard" and result.header_upstream != "primary":
            problem = f"not relayed by Switchyard (x-switchyard-upstream {result.header_upstream!r})"
        if release_at is not None and result.first_data_at is not None and result.first_data_at < release_at:
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
    # a sampler can miss a short spike; the kernel's high-water mark cannot, if it rose in this phase
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
        "sse_comments_received": comments,  # e.g. Switchyard's pre-answer keepalives if a stream waited long
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
