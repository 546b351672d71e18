#!/usr/bin/env python3
"""Switchyard benchmark: the same loopback upstream, three ways, interleaved in one run.

    .venv/bin/python scripts/bench.py              # default run (a few minutes)
    .venv/bin/python scripts/bench.py --quick      # smoke check (well under a minute)
    .venv/bin/python scripts/bench.py --json out.json --concurrency 1 50 --rounds 3

Paths measured, round by round in rotating order so that drift (thermal, noisy
neighbours) hits all of them alike:

  direct      the client talks to the upstream itself (the physical limit)
  plain       `mitmdump` with no script, regular proxy mode, the client using it
              as its HTTP proxy for a plain-http upstream URL.  Plain mitmdump
              buffers SSE bodies unless told to stream (mitmproxy issue #4469),
              so it runs with `--set stream_large_bodies=1`: that is what a user
              streaming an LLM through it has to set.
  switchyard  `mitmdump -s addon/switchyard.py` with a rules.yaml whose route
              matches the upstream path: upstream `primary` (url: original,
              retries: 0) then `backup` on the upstream's second port.  No
              stream_large_bodies here: the addon needs the request body in its
              `request` hook and enables streaming for its own answers.

Both proxies get `--listen-host 127.0.0.1 --set connection_strategy=lazy` and a
private confdir; tests/support/mitm.py starts them, as it does for the tests.

The upstream is an aiohttp server in its own process (this file with
`--serve`), so its CPU is not charged to the client; its frames are built
by the test suite's tests/support/wire.py.  It streams Chat
Completions answers shaped like OpenAI's: a role frame, N content frames paced
`--gap-ms` apart, a finish frame, a usage frame, `data: [DONE]`.  Paths:

  /ok/v1/chat/completions      a normal answer              (port 1)
  /fail/v1/chat/completions    HTTP 200 SSE whose first frame is
                               data: {"error":{"code":503,"message":"provider overloaded"}}
                               then the body ends            (port 1)
  /backup/v1/chat/completions  a normal answer              (port 2, another origin)
  /cut/v1/chat/completions     the role frame and three content frames, then the
                               connection is reset           (port 1)

Figures, per concurrency level:
  TTFB   request sent -> first body byte
  TTFT   request sent -> first frame with non-empty `content` (Switchyard holds
         the role frame back until the first output by design, so its first
         byte is the first content; TTFT is the like-for-like figure)
  TTLB   request sent -> end of body
  proxy CPU per stream: utime+stime delta of the proxy process (and any
         descendants, plus cutime/cstime) over the cell, divided by streams
         (also its kernel part, stime, and the threads' schedstat run count as
         "wake-ups": the event loop's trips per stream)
  proxy peak RSS: VmRSS sampled every 20 ms during the cells of that level;
         a Python process rarely gives memory back, so after the warm-up burst
         this is in effect the high-water mark (VmHWM, printed too)
  fallback: time to the backup's first content when the first upstream fails
         before output.  Switchyard does it inside the proxy; for direct and
         plain the *client* does it (read the error frame, then ask the backup)
         — what a client without Switchyard would have to do.  "added" is that
         time minus (the failing upstream's direct time-to-error + the backup's
         direct TTFT), both medians from the direct cells of the same run.
  burst (`--burst 20 50`, `--bursts N` a cell): C happy requests started in one
         loop pass, as an agent fanning out tool calls does; the next burst
         once all C have ended (and 50 ms more).  TTFT median, p90 and p99 are
         timed from the burst's start, so the last request's figure includes
         the proxy's work on the C-1 before it; proxy CPU per stream as above.
  The first table printed holds the figures to compare first, each against
  plain mitmdump in the same run and round by round: first content in a burst
  of 20 and of 50 (median, p90), at concurrency 1, and CPU per stream at each
  `--concurrency` level (1, 20, 50).
  continue after cut (switchyard only): the `/cut/` answer breaks after three
         content frames; its route has `continue_after_cut: [prefill]` and a
         backup with `prefill: true`, which answers the continuation request
         normally.  The figure is the client's time from the last content frame
         before the cut to the first continued one: noticing the reset, asking
         the backup, and the backup's own first content (its pacing included,
         like the fallback row's).  Without Switchyard there is nothing to
         compare: a client re-runs the whole request.

Clients are asyncio aiohttp sessions (trust_env=False), one per path, kept for
the whole run like a long-lived SDK client; a warm-up burst at the highest
concurrency opens their connections (and the relay's) before measuring.

The header says how busy the rest of the machine was during the measured cells
(/proc/stat minus the benchmark's own processes, and hypervisor steal): on a
shared box, trust ratios of interleaved paths more than absolute latencies.  At
high concurrency on a small machine the single-threaded proxy saturates; then
frames coalesce per read and CPU per stream falls, so compare CPU ratios at a
concurrency where the proxy still idles between tokens (c=1).

Staging memory (`--staging-streams N`, default 1000, 200 with --quick, 0 to skip):
after the measured rounds, once per proxy (plain, then switchyard), N streaming
requests are opened at once.  Their answer (the request body carries
"bench_hold_ms", "bench_hold_group", "bench_hold_n" and "bench_hold_wait_ms"
fields the upstream reads) is the role frame and three lifecycle-only frames
(an Azure prompt-filter chunk, two chunks with empty deltas) at once — which
Switchyard holds in staging, since nothing in them is output — then nothing
until all N requests of the group have reached the upstream (a barrier, bounded
by bench_hold_wait_ms) and a further `--staging-hold-s` (default 3 s) have
passed; then the content frames (min(--tokens, 20), paced --gap-ms),
finish, usage and [DONE].  The proxy's RSS is sampled every 50 ms from just
before the first request until the last answer is complete; reported: RSS
before, peak while all N were held (the upstream says when the barrier opened
and when it released), peak over the whole phase (the sampled peak, or VmHWM if
it rose during the phase and is higher), and peak minus before.  The
target is that switchyard's peak minus before exceeds plain
mitmdump's by under 300 MB.  Every client must get its complete answer (exact
byte count, [DONE]); for switchyard, also no data frame before the release
(else it did not hold the stream) — plain passes the role frame straight
through, which the table shows as a check that the hold is real.  The soft
RLIMIT_NOFILE is raised to the hard limit in this process (the children
inherit it) and in the upstream; the proxy needs about 3N descriptors.

Outage rows (`--outages N`, default 10, 3 with --quick, 0 to skip; scripts/benchmark/outages.py
says how): after the rounds, for a primary that is hung, refuses connections or answers 429 with
Retry-After, the first content of the second and later requests through Switchyard against
going straight to the backup (directly and through plain mitmdump); and for a primary whose
first token is slow, with `hedge_after_s`, first content against hedge_after_s plus the
backup's own.  Their routes are on a host of their own, after the others in the rules.

`--switchyard-addon PATH` runs another tree's addon/switchyard.py on the Switchyard side (an
earlier commit's worktree): the same run's plain mitmdump is the yardstick for both.

`--profile DIR` records both proxies with py-spy during the measured rounds
(pip install py-spy into the venv; it is not a project dependency).

Every wait is bounded; every child process is stopped in `finally` (and gets
SIGTERM from the kernel if this process dies: PR_SET_PDEATHSIG).

The code is the package beside this file, scripts/benchmark/: cli (arguments,
processes started and stopped, what is printed), upstream (the `--serve`
process), frames (the request and the answers), processes, clients, cells (one
measured cell), rounds (the run), websocket, staging and outages (their rows), procstats
(/proc readings), report and printout (the tables and the lines around them),
profiling (py-spy).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support, shared with the test suite

from benchmark.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], description=(__doc__ or "").split("\n\n")[0]))
