"""The benchmark's HTTP clients: one streamed answer read to the end, with the moments
that matter noted (first byte, first content, error frame, the cut, the end)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
import aiohttp

from benchmark.frames import CONTENT_MARK, CUT_AFTER, DONE, ERROR_MARK, ID_MARK, REQUEST_HEADERS

_SSE_COMMENT = re.compile(rb"(?m)^:[^\n]*\n\n?")


@dataclass
class Sample:
    """One stream's result as the cells record it (times in seconds)."""

    ok: bool
    ttfb: float | None = None
    ttft: float | None = None
    ttlb: float | None = None
    upstream: str | None = None  # whose answer arrived (from the chunk id)
    tte: float | None = None  # fallback, client side: time to the failing upstream's error frame
    backup_ttft: float | None = None  # fallback, client side: backup request -> first content
    cut_gap: float | None = None  # continue: last content before the cut -> first continued content
    error: str | None = None


@dataclass
class Read:
    """What `read_stream` saw of one answer."""

    status: int
    ttfb: float | None
    ttft: float | None
    tte: float | None
    ttlb: float
    nbytes: int
    upstream: str | None
    ended_done: bool
    header_upstream: str | None
    header_attempts: str | None = None


@dataclass
class CutRead:
    """What `read_cut_stream` saw: `gap`, from the CUT_AFTER-th content frame to the next one."""

    status: int
    gap: float | None
    content_frames: int
    ended_done: bool
    tail: bytes


@dataclass
class StagedRead:
    """What `staged_stream` saw; `answer` is the body without SSE comments, times are time.monotonic()."""

    status: int
    answer: bytes
    nbytes: int
    comments: int
    first_data_at: float | None
    end_at: float
    header_upstream: str | None


def new_session(timeout: aiohttp.ClientTimeout, limit: int) -> aiohttp.ClientSession:
    """A client like a long-lived SDK's, but one that ignores proxy variables and leaves bodies encoded."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    return aiohttp.ClientSession(trust_env=False, connector=connector, timeout=timeout, auto_decompress=False)


async def read_stream(session: aiohttp.ClientSession, url: str, proxy: str | None, t0: float, request: bytes) -> Read:
    """POST `request`, read the SSE body to the end, note when things arrived (relative to t0)."""
    perf = time.perf_counter
    async with session.post(url, data=request, headers=REQUEST_HEADERS, proxy=proxy) as resp:
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
                    id_at = head.rfind(ID_MARK, 0, at)
                    if id_at >= 0:
                        start = id_at + len(ID_MARK)
                        upstream = head[start:head.index(b'"', start)].decode()
                elif ERROR_MARK in head:
                    tte = now - t0
                    upstream = "fail"
            nbytes += len(chunk)
            tail = (tail + chunk)[-len(DONE):]
        return Read(resp.status, ttfb, ttft, tte, perf() - t0, nbytes, upstream, tail == DONE,
                    resp.headers.get("x-switchyard-upstream"), resp.headers.get("x-switchyard-attempts"))


async def read_cut_stream(session: aiohttp.ClientSession, url: str, proxy: str | None, request: bytes) -> CutRead:
    """POST to the /cut/ path and read the answer, continued or not, to the end."""
    perf = time.perf_counter
    async with session.post(url, data=request, headers=REQUEST_HEADERS, proxy=proxy) as resp:
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
        return CutRead(resp.status, gap, body.count(CONTENT_MARK), body.endswith(DONE), bytes(body[-200:]))


async def staged_stream(session: aiohttp.ClientSession, url: str, proxy: str, body: bytes) -> StagedRead:
    """POST one held request, read the answer to the end; its times are shared with the upstream's clock."""
    mono = time.monotonic
    async with session.post(url, data=body, headers=REQUEST_HEADERS, proxy=proxy) as resp:
        first_data = None
        parts = []
        async for chunk in resp.content.iter_any():
            if first_data is None and b"data:" in chunk:  # not a keepalive comment
                first_data = mono()
            parts.append(chunk)
        raw = b"".join(parts)
        # a proxy may send SSE comments (Switchyard's pre-answer keepalive): not part of the answer
        answer, comments = _SSE_COMMENT.subn(b"", raw)
        return StagedRead(resp.status, answer, len(raw), comments, first_data, mono(),
                          resp.headers.get("x-switchyard-upstream"))
