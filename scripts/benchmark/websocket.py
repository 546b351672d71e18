"""The WebSocket row: Responses turns over one WebSocket per path and round."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import aiohttp

from benchmark.constants import PATHS, Progress, Proxies
from benchmark.frames import WS_PATH, ws_turn_messages
from benchmark.procstats import cpu_seconds
from benchmark.report import median

TURN_TIMEOUT_S = 60


async def websocket_phase(args: argparse.Namespace, ports: list[int], proxies: Proxies,
                          progress: Progress) -> dict[str, Any]:
    """Responses over one WebSocket per path and round: `--ws-turns` turns of
    `--tokens` deltas each, the paths interleaved.  Per turn: time to the first
    delta and to `response.completed`; per path: proxy CPU per message."""
    url = f"http://127.0.0.1:{ports[0]}{WS_PATH}"
    expected = [json.loads(m)["type"] for m in ws_turn_messages("x", args.tokens)]
    out: dict[str, Any] = {p: {"ttft": [], "ttlb": [], "cpu_s": 0.0, "messages": 0, "errors": []} for p in PATHS}

    async def turn(ws: aiohttp.ClientWebSocketResponse) -> tuple[float, float]:
        t0 = time.perf_counter()
        await ws.send_str(json.dumps({"type": "response.create", "model": "bench", "input": "hi"}))
        first = None
        types = []
        while True:
            msg = await ws.receive(timeout=TURN_TIMEOUT_S)
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
