"""What the run prints around the tables: the machine, the command, how busy the rest of
the machine was, and the memory and CPU-ratio lines after them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from benchmark.constants import PATH_LABEL
from benchmark.report import headline, report, staging_report, translated_report, websocket_report

BUSY_AVERAGE = 0.1  # of one core, from other processes over the measured cells: above it, a warning
BUSY_WORST_CELL = 0.3


def header(info: dict[str, Any], args: argparse.Namespace, argv: list[str], entry: Path, wall: float,
           summary: dict[str, Any], cells: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Switchyard benchmark", "",
             f"Machine: {info['cpu_model']}, {info['cores']} cores ({info['cores_usable']} usable), "
             f"Linux {info['kernel']}, Python {info['python']}, mitmproxy {info['mitmproxy']}, "
             f"httptools {info['httptools']}"]
    try:
        python = os.path.relpath(sys.executable)
    except ValueError:
        python = sys.executable
    lines.append(f"Command: {python} {os.path.relpath(entry)} {' '.join(argv)}".rstrip())
    if args.switchyard_addon is not None:
        lines.append(f"Switchyard side: {args.switchyard_addon.resolve()} (not this tree's addon)")
    if args.plain_hook_dispatch:
        lines.append("Plain mitmdump ran with Switchyard's hook dispatch: the ratios show what Switchyard itself costs")
    lines.append(f"Run: {args.rounds} interleaved round(s); {args.tokens} content frames per answer, "
                 f"{args.gap_ms:g} ms apart; per path, level and round {args.streams} happy (at least "
                 f"{args.waves} x the concurrency) / {args.fallback_streams} fallback streams (at least the "
                 f"concurrency); wall time {wall:.1f} s")
    plain_c1 = summary.get(f"happy/c{min(args.concurrency)}/plain", {})
    if plain_c1.get("ttfb") and plain_c1.get("ttlb") and args.tokens * args.gap_ms >= 50:
        if plain_c1["ttfb"]["median"] > 0.5 * plain_c1["ttlb"]["median"]:
            lines.append("WARNING: plain mitmdump's first byte came late: it does not seem to stream "
                         "(stream_large_bodies)")
    cell_wall = sum(cell["wall_s"] for cell in cells) or 1.0
    foreign = sum(cell["foreign_cpu_s"] for cell in cells) / cell_wall
    foreign_max = max((cell["foreign_cpu_s"] / cell["wall_s"] for cell in cells if cell["wall_s"] > 0), default=0.0)
    steal = sum(cell["steal_cpu_s"] for cell in cells) / cell_wall
    lines.append(f"Machine load from other processes during the measured cells: {100 * foreign:.0f}% of one core on "
                 f"average (worst cell {100 * foreign_max:.0f}%), hypervisor steal {100 * steal:.0f}%; "
                 f"load average at the end {os.getloadavg()[0]:.2f}")
    if foreign > BUSY_AVERAGE or foreign_max > BUSY_WORST_CELL:
        lines.append("WARNING: other processes were busy on this machine; latency figures (p99, c>1) are disturbed. "
                     "Ratios are fairer than absolute values because the paths are interleaved.")
    return lines


def tables(summary: dict[str, Any], cells: list[dict[str, Any]], args: argparse.Namespace,
           extra: dict[str, Any]) -> list[str]:
    levels = sorted(set(args.concurrency) | set(args.burst))
    lines = ["", headline(summary, cells, args.concurrency, args.burst), "", report(summary, levels), ""]
    translated = translated_report(summary, args.concurrency)
    if translated is not None:
        lines += [translated, ""]
    if "websocket" in extra:
        lines += [websocket_report(extra["websocket"]), ""]
    if "staging" in extra:
        lines += [staging_report(extra["staging"]), ""]
    return lines


def footer(summary: dict[str, Any], args: argparse.Namespace, hwm: dict[str, float],
           idle: dict[str, float]) -> list[str]:
    lines = ["Proxy peak memory over the whole run (VmHWM): "
             + ", ".join(f"{PATH_LABEL[k]} {v:.1f} MB" for k, v in hwm.items())
             + "; after warm-up, idle: "
             + ", ".join(f"{PATH_LABEL[k]} {v:.1f} MB" for k, v in idle.items())]
    for c in args.concurrency:
        sw = summary.get(f"happy/c{c}/switchyard", {}).get("proxy_cpu_s_per_stream_by_round")
        pl = summary.get(f"happy/c{c}/plain", {}).get("proxy_cpu_s_per_stream_by_round")
        if sw and pl:
            lines.append(f"CPU ratio switchyard / plain by round, c={c}: "
                         + ", ".join(f"{a / b:.2f}x" for a, b in zip(sw, pl) if b))
    return lines
