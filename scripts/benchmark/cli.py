"""The command line: parse it, start the processes, run, print, and stop everything on the way out."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from benchmark.cells import Bench
from benchmark.constants import PATHS, Proxies
from benchmark.frames import STAGING_HOLD_MAX_S
from benchmark.outages import OutageUpstreams, outage_report
from benchmark.printout import footer, header, tables
from benchmark.processes import (ENTRY, PLAIN_HOOK_DISPATCH, Child, raise_nofile_limit, start_proxy, start_upstream,
                                 write_rules)
from benchmark.procstats import machine, status_kb
from benchmark.profiling import start_profilers, summarize_profile
from benchmark.report import summarize
from benchmark.rounds import run
from benchmark.upstream import serve

FDS_PER_STAGED_STREAM = 3
FDS_SPARE = 512
LOG_TAIL_CHARS = 3000
ERROR_LINES = 12


def parse_args(argv: list[str], description: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20, help="happy-path streams per path, concurrency level and round (at least the concurrency)")
    parser.add_argument("--fallback-streams", type=int, default=10, help="fallback streams per path, concurrency level and round (at least the concurrency)")
    parser.add_argument("--waves", type=int, default=4,
                        help="happy-path streams per cell are at least this many times the concurrency: one wave "
                             "of 50 streams lasts about half a second, too short to read CPU time to within a few "
                             "percent (default 4, with --quick 1)")
    parser.add_argument("--tokens", type=int, default=200, help="content frames per answer")
    parser.add_argument("--prompt-kb", type=int, default=0, metavar="KIB",
                        help="pad each request to about this many KiB, as an agent's turn carries its whole "
                             "conversation (default 0: a short chat request)")
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
    parser.add_argument("--translated", action="store_true",
                        help="also measure a translated fallback on the Switchyard path: the primary fails before "
                             "output and the backup speaks Anthropic Messages, translated into the client's Chat "
                             "Completions (issue 25), beside the same-API fallback, --fallback-streams per cell")
    parser.add_argument("--switchyard-set", action="append", default=[], metavar="OPTION=VALUE",
                        help="a mitmproxy option for the Switchyard proxy only (repeatable), e.g. "
                             "switchyard_direct_relay=false to measure the relay's answers through its socket")
    parser.add_argument("--outages", type=int, default=None, metavar="N",
                        help="requests per cell and round in the outage rows (a primary hung, refused, answering 429 "
                             "with Retry-After; a slow first token hedged) against going straight to the backup; "
                             "0 skips (default 10, with --quick 3)")
    parser.add_argument("--switchyard-addon", type=Path, default=None, metavar="PATH",
                        help="the Switchyard side loads this addon/switchyard.py (e.g. an earlier commit's worktree, "
                             "to measure before and after against plain mitmdump) instead of this tree's")
    parser.add_argument("--plain-hook-dispatch", action="store_true",
                        help="plain mitmdump also gets Switchyard's faster hook dispatch (and nothing else of it): "
                             "the ratios then show what Switchyard itself costs, beyond what it saves mitmproxy")
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
    if args.outages is None:
        args.outages = 3 if args.quick else 10
    if args.outages < 0:
        parser.error("--outages must not be negative")
    if args.staging_streams is None:
        args.staging_streams = 200 if args.quick else 1000
    if args.staging_streams < 0:
        parser.error("--staging-streams must not be negative")
    if not 0 < args.staging_hold_s <= STAGING_HOLD_MAX_S:
        parser.error(f"--staging-hold-s must be above 0 and at most {STAGING_HOLD_MAX_S:g}")
    if (min(args.concurrency) < 1 or min(args.burst, default=1) < 1 or args.bursts < 1 or args.streams < 1
            or args.fallback_streams < 1 or args.waves < 1 or args.rounds < 1 or args.tokens < 1):
        parser.error("--concurrency, --streams, --fallback-streams, --rounds and --tokens must be at least 1")
    if args.gap_ms < 0:
        parser.error("--gap-ms must not be negative")
    if args.prompt_kb < 0:
        parser.error("--prompt-kb must not be negative")
    return args


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _results(args: argparse.Namespace, argv: list[str], info: dict[str, Any], wall: float, bench: Bench,
             extra: dict[str, Any], hwm: dict[str, float], profilers: list[Child]) -> int:
    """Print the tables, write the profiles' summary and the raw numbers; 1 if any stream failed."""
    levels = sorted(set(args.concurrency) | set(args.burst))
    summary = summarize(bench.cells, bench.rss_peak_kb, levels)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("serve", "max_lifetime")}
    lines = header(info, args, argv, ENTRY, wall, summary, bench.cells)
    lines += tables(summary, bench.cells, args, extra)
    if "outages" in extra:
        lines += outage_report(extra["outages"])
    lines += footer(summary, args, hwm, extra["idle_rss_mb_after_warmup"])
    print("\n".join(lines))
    if profilers:
        assert args.profile is not None
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
    staging_failed = staging_failed or any(s["error"] for c in extra.get("outages", {}).get("cells", [])
                                           for s in c["samples"])
    return 1 if staging_failed or any(v["failed"] for v in summary.values()) else 0


def main(argv: list[str], description: str = "") -> int:
    args = parse_args(argv, description)
    if args.serve:
        asyncio.run(serve(args.tokens, args.gap_ms / 1000, args.max_lifetime))
        return 0
    signal.signal(signal.SIGTERM, _on_term)
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", file=sys.stderr, flush=True)

    info = machine()
    nofile_soft, nofile_hard = raise_nofile_limit()  # inherited by the upstream and both mitmdumps
    need = FDS_PER_STAGED_STREAM * args.staging_streams + FDS_SPARE
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
        outages = OutageUpstreams.open() if args.outages else None
        rules = write_rules(workdir, ports[1], outages.routes(ports[1]) if outages else "")
        dispatch = ["-s", str(PLAIN_HOOK_DISPATCH)] if args.plain_hook_dispatch else []
        plain, plain_port = start_proxy("plain", workdir, rules, ["--set", "stream_large_bodies=1", *dispatch], bare=True)
        children.append(plain)
        options = [arg for option in args.switchyard_set for arg in ("--set", option)]
        switchyard, sw_port = start_proxy("switchyard", workdir, rules, options, addon=args.switchyard_addon)
        children.append(switchyard)
        progress(f"plain mitmdump pid {plain.pid} :{plain_port}; switchyard mitmdump pid {switchyard.pid} :{sw_port}")
        proxies: Proxies = {
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

        bench, extra = asyncio.run(run(args, ports, proxies, upstream.pid, progress, measuring, outages))
        for profiler in profilers:
            profiler.stop()
        hwm = {name: status_kb(pid, "VmHWM") / 1024 for name, (pid, _) in proxies.items() if pid}
        for child in (plain, switchyard):
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} mitmdump exited during the run:\n{child.log_tail(LOG_TAIL_CHARS)}")
        return _results(args, argv, info, time.monotonic() - started, bench, extra, hwm, profilers)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping processes", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"\nbench failed: {exc}", file=sys.stderr)
        for child in children:
            if child.name in ("plain", "switchyard") and child.log_path and child.log_path.exists():
                lines = child.log_path.read_text(errors="replace").splitlines()
                hits = [line for line in lines if "error" in line.lower() or "Traceback" in line][-ERROR_LINES:]
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
        shutil.rmtree(workdir, ignore_errors=True)
