"""The run: a warm-up, then interleaved rounds of cells (happy, fallback, continue after
cut, bursts), then the WebSocket row and the staging phase."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from benchmark.cells import Bench
from benchmark.constants import PATH_LABEL, PATHS, Progress, Proxies
from benchmark.outages import OutageUpstreams, outage_phase
from benchmark.procstats import rss_kb
from benchmark.report import median, staging_verdict
from benchmark.staging import staging_phase
from benchmark.websocket import websocket_phase

WARM_UP_FALLBACKS = 10


def _rotated(round_no: int) -> tuple[str, ...]:
    """The paths in this round's order, so that drift hits all of them alike."""
    shift = round_no % len(PATHS)
    return PATHS[shift:] + PATHS[:shift]


async def warm_up(bench: Bench, top: int) -> None:
    """Open every client's connections (and the relay's) before anything is measured."""
    few = min(top, WARM_UP_FALLBACKS)
    for path in PATHS:
        for kind, c, what in (("happy", top, "warm-up"), ("fallback", few, "fallback warm-up")):
            warm = await bench.cell(path, kind, c, c, None)
            fails = [s["error"] for s in warm["samples"] if not s["ok"]]
            if fails:
                raise RuntimeError(f"{what} on {path} failed: {fails[:3]}")
    for kind in ("continue", "translated") if bench.args.translated else ("continue",):
        warm = await bench.cell("switchyard", kind, few, few, None)
        fails = [s["error"] for s in warm["samples"] if not s["ok"]]
        if fails:
            raise RuntimeError(f"{kind} warm-up failed: {fails[:3]}")


async def measured_round(bench: Bench, args: argparse.Namespace, round_no: int, progress: Progress) -> None:
    for c in args.concurrency:
        # the translated fallback (--translated) right after the same-API one, for the same number of streams
        kinds = ("happy", "fallback", "translated", "continue") if args.translated else ("happy", "fallback", "continue")
        for kind in kinds:
            n = max(args.streams, c * args.waves) if kind == "happy" else max(args.fallback_streams, c)
            order = _rotated(round_no + (kind == "fallback")) if kind in ("happy", "fallback") else ("switchyard",)
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
        for path in _rotated(round_no):
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


async def run(args: argparse.Namespace, ports: list[int], proxies: Proxies, upstream_pid: int, progress: Progress,
              measuring: Callable[[], None] | None = None,
              outages: OutageUpstreams | None = None) -> tuple[Bench, dict[str, Any]]:
    """Everything measured; `measuring` is called once the warm-up is over (the profilers start there);
    `outages`, the outage rows' primaries (their routes are in the rules)."""
    bench = Bench(args, ports, proxies, upstream_pid)
    await bench.open()
    try:
        top = max(args.concurrency + args.burst)
        progress(f"warm-up: {top} concurrent streams per path, then fallbacks")
        await warm_up(bench, top)
        idle_rss = {path: rss_kb(proxies[path][0]) / 1024 for path in PATHS if proxies[path][0]}
        if measuring is not None:
            measuring()
        for round_no in range(args.rounds):
            await measured_round(bench, args, round_no, progress)
        extra: dict[str, Any] = {"idle_rss_mb_after_warmup": idle_rss}
        if outages is not None:
            progress(f"outages: {args.outages} requests per cell and round, each scenario and the backup alone")
            try:
                extra["outages"] = await outage_phase(bench, outages, progress)
            finally:
                await outages.close()
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
