"""Load: one mitmdump, 200 concurrent streams, a third of the attempts failing before output.

Every client must get exactly one complete upstream answer (its own: answers
echo a per-request nonce), nothing duplicated or mixed; afterwards the proxy
holds no more sockets than before.  Peak memory is reported, not timed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tests.support import wire
from tests.support.fake_provider import NORMAL, RESET, FakeProvider, Reply
from tests.support.mitm import start_mitmdump

STREAMS = 200
SEED = 20261130

RULES = """\
version: 1
defaults: {{backoff_ms: 1, max_backoff_ms: 20, pre_answer_keepalive_s: 0, headers_timeout_s: 20, idle_timeout_s: 20}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 1}}
      - {{name: backup, url: "http://127.0.0.1:{port}/backup/v1/chat/completions", retries: 1}}
"""


def failure(rng: random.Random) -> Reply:
    shapes = [
        lambda: Reply.sse(wire.chat_error(503, "provider overloaded")),
        lambda: Reply.sse(wire.CHAT_ROLE, wire.chat_error("429", "rate limited")),
        lambda: Reply.sse(b": keep-alive\n\n", wire.chat_error("server_error", "boom"), wire.CHAT_DONE),
        lambda: Reply.json(503, {"error": {"message": "Our servers are currently overloaded.", "type": "server_error"}}),
        lambda: Reply.sse(wire.CHAT_ROLE, RESET),
        lambda: Reply.sse(wire.CHAT_DONE),
        lambda: Reply.json(400, {"error": {"message": "Selected model is at capacity. Please try a different model."}}),
    ]
    return rng.choice(shapes)()


def connections_of(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of the process's established TCP connections."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and fields[3] == "01":  # ESTABLISHED
                found.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
    return found


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def one_stream(session: aiohttp.ClientSession, url: str, proxy: str, index: int) -> tuple[str, bytes, str]:
    nonce = f"nonce-{index:04d}"
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}], "metadata": {"nonce": nonce}}
    async with session.post(url, data=json.dumps(body), proxy=proxy, headers={"Authorization": "Bearer sk-load"}) as response:
        assert response.status == 200
        return nonce, await response.read(), response.headers["x-switchyard-upstream"]


async def run_streams(url: str, proxy: str) -> list[tuple[str, bytes, str]]:
    timeout = aiohttp.ClientTimeout(total=90)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False) as session:
        return await asyncio.gather(*(one_stream(session, url, proxy, i) for i in range(STREAMS)))


def test_200_concurrent_streams_each_get_exactly_their_own_complete_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(SEED)
    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(port=provider.ports[1]))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log")
    pid = dump.process.pid
    try:
        # a third of the primary's attempts fail before output, in random shapes; the
        # backup answers, so every client must end up with a complete answer
        provider.script("primary", *[failure(rng) if rng.random() < 1 / 3 else NORMAL for _ in range(3 * STREAMS)])
        url = provider.url("primary", "/v1/chat/completions")
        assert connections_of(pid) == []
        rss_before = memory_kib(pid, "VmRSS")
        results = asyncio.run(run_streams(url, dump.proxy_url))

        answered_by = Counter()
        for nonce, body, upstream in results:
            # exactly one upstream's complete answer, byte for byte: its own, nothing mixed in
            assert body == b"".join(wire.chat_stream(wire.answer_text(upstream, nonce))), nonce
            answered_by[upstream] += 1
        assert sum(answered_by.values()) == STREAMS
        assert answered_by["primary"] > 0 and answered_by["backup"] > 0
        calls = Counter(c.upstream for c in provider.calls)
        assert calls["primary"] >= STREAMS

        peak_kib = memory_kib(pid, "VmHWM")
        # nothing left behind: no client, mitmproxy-to-relay or half-read upstream
        # connection stays open; what remains are idle keep-alive connections in the
        # relay's upstream pool (at most one per upstream request that was read to its
        # end), which aiohttp closes after its keep-alive timeout
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            leftover = [c for c in connections_of(pid) if c[1] not in provider.ports]
            if not leftover:
                break
            time.sleep(0.2)
        assert leftover == []
        pooled = connections_of(pid)
        assert len(pooled) <= len(provider.calls)
        log = dump.log()
        assert "switchyard.internal_error" not in log and "Traceback" not in log
        with capsys.disabled():
            print(f"\nload: {STREAMS} streams, answered by {dict(answered_by)}, upstream calls {dict(calls)}, "
                  f"mitmdump RSS {rss_before // 1024} MiB before, peak {peak_kib // 1024} MiB; "
                  f"{len(pooled)} idle pooled upstream connections after")
        assert peak_kib - rss_before < 300 * 1024  # far below staging_limit x streams in flight
    finally:
        dump.stop()
        provider.stop()
