#!/usr/bin/env python3
"""What a hostile WebSocket peer costs, through Switchyard and through plain mitmdump.

    .venv/bin/python scripts/measure_hostile.py            # every case, both proxies
    .venv/bin/python scripts/measure_hostile.py --json out.json

Cases (docs/security.md, "Hostile upstreams and clients", has the numbers):

  big-message     the upstream answers a turn with one 60 MiB text message; the
                  client reads everything
  client-pings    the client sends 30,000 pings and reads nothing (the pongs pile up)
  upstream-pings  the upstream sends 30,000 pings to a client that reads nothing

Each case runs against a fresh `mitmdump -s addon/switchyard.py` whose route
terminates the WebSocket, and a fresh plain `mitmdump` relaying it.  Meanwhile
a side thread asks the same proxy for a small plain HTTP answer every 50 ms: the
slowest of those answers is how long the proxy's event loop was held.  Peak
memory is the proxy process's VmHWM minus its VmRSS before the case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp
from wsproto.events import Ping, TextMessage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fake_provider import FakeProvider  # noqa: E402
from tests.support.mitm import Mitmdump, start_mitmdump  # noqa: E402
from tests.support.ws_provider import PING, WsProvider, answer_turn, event, slow_client  # noqa: E402

RULES = "version: 1\nroutes:\n  - name: ws\n    match: {path: /v1/responses}\n    upstreams: [{name: primary, url: original}]\n"
BIG = 60 * 1024 * 1024
PINGS = 30_000


def memory_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class Side(threading.Thread):
    """A plain HTTP GET through the proxy every 50 ms, each answer's time kept with when it began."""

    def __init__(self, proxy: str, url: str) -> None:
        super().__init__(daemon=True)
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
        self.url = url
        self.times: list[tuple[float, float]] = []  # (began, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            with self.opener.open(self.url, timeout=120) as answer:
                answer.read()
            self.times.append((began, time.monotonic() - began))
            self.stop.wait(0.05)

    def slowest(self, since: float, until: float) -> float:
        return max((took for began, took in self.times if since <= began + took and began <= until), default=0.0)


async def big_message(dump: Mitmdump, upstream: WsProvider) -> float:
    head, end = answer_turn("resp_big")[:4], answer_turn("resp_big")[-1]
    delta = event("response.output_text.delta", item_id="msg_resp_big", output_index=0, content_index=0,
                  delta="x" * BIG)
    upstream.script([*head, delta, end])
    began = time.monotonic()
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(upstream.proxied_url, proxy=dump.proxy_url, max_msg_size=0) as ws:
            await ws.send_str(json.dumps({"type": "response.create", "model": "m", "input": "x"}))
            for _ in range(6):
                await ws.receive(timeout=300)
    return time.monotonic() - began


def client_pings(dump: Mitmdump, upstream: WsProvider) -> float:
    """30,000 pings from a client that never reads; until the proxy stops taking them."""
    sock, ws = slow_client(dump.proxy_port, upstream)
    began = time.monotonic()
    try:
        for _ in range(PINGS):
            sock.sendall(ws.send(Ping(payload=b"p" * 125)))
    except (TimeoutError, OSError):
        pass  # the proxy stopped reading the client: held back
    took = time.monotonic() - began
    time.sleep(1)
    sock.close()
    return took


async def upstream_pings(dump: Mitmdump, upstream: WsProvider) -> float:
    """The upstream sends 30,000 pings in a turn; the client reads nothing until they are sent."""
    upstream.script([answer_turn("resp_p")[0], *[PING] * PINGS, *answer_turn("resp_p")[1:]])
    sock, ws = slow_client(dump.proxy_port, upstream)
    sock.sendall(ws.send(TextMessage(data=json.dumps({"type": "response.create", "model": "m", "input": "x"}))))
    began = time.monotonic()
    for _ in range(1200):  # until the upstream is done or held (bounded: 60 s)
        await asyncio.sleep(0.05)
        if upstream.sent >= 7:
            break
    took = time.monotonic() - began
    sock.close()
    return took


def measure(case: str, bare: bool, workdir: Path, side_url: str) -> dict[str, object]:
    upstream = WsProvider().start()
    (workdir / "rules.yaml").write_text(RULES)
    dump = start_mitmdump(workdir / "rules.yaml", workdir / f"{case}-{bare}.log", bare=bare)
    try:
        side = Side(dump.proxy_url, side_url)
        side.start()
        time.sleep(3)  # the side requests' own pace, before anything hostile
        before = memory_mb(dump.process.pid, "VmRSS")
        began = time.monotonic()
        if case == "big-message":
            took = asyncio.run(big_message(dump, upstream))
        elif case == "client-pings":
            took = client_pings(dump, upstream)
        else:
            took = asyncio.run(upstream_pings(dump, upstream))
        time.sleep(3)  # what the proxy still does for the hostile peer after it
        side.stop.set()
        side.join(130)
        return {"case": case, "proxy": "plain mitmdump" if bare else "switchyard", "seconds": round(took, 2),
                "side_request_before_s": round(side.slowest(began - 2, began), 3),
                "slowest_side_request_s": round(side.slowest(began, began + took + 3), 3),
                "peak_growth_mb": round(memory_mb(dump.process.pid, "VmHWM") - before, 1)}
    finally:
        dump.stop()
        upstream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cases", nargs="*", default=["big-message", "client-pings", "upstream-pings"])
    args = parser.parse_args()
    side = FakeProvider().start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for case in args.cases:
                for bare in (True, False):
                    row = measure(case, bare, Path(tmp), side.url("side", "/v1/models"))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        side.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
