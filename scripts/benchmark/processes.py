"""The benchmark's child processes: the upstream, the two mitmdumps (started by the test
suite's own starter) and py-spy; each is stopped by its `Child`, and dies with the run."""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmark.frames import BACKUP_KEY
from tests.support.mitm import child_env, start_mitmdump, terminate_with_parent

ENTRY = Path(__file__).resolve().parents[1] / "bench.py"  # `bench.py --serve` runs the upstream
PLAIN_HOOK_DISPATCH = Path(__file__).resolve().parent / "plain_hook_dispatch.py"  # --plain-hook-dispatch
UPSTREAM_START_S = 20.0
MITMDUMP_START_S = 45.0

RULES = """\
version: 1
defaults:
  retries: 1
  headers_timeout_s: 30
  idle_timeout_s: 60
routes:
  - name: bench-cut             # the continue-after-cut scenario
    match: {{host: 127.0.0.1, path: /cut/v1/chat/completions}}
    continue_after_cut: [prefill]
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        url: http://127.0.0.1:{backup_port}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer {backup_key}"}}
        prefill: true
  - name: bench-chat-translated  # the translated fallback: the backup speaks Anthropic Messages
    match: {{host: 127.0.0.1, path: /xfail/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        api: anthropic-messages
        url: http://127.0.0.1:{backup_port}/xbackup/v1/messages
        model: claude-bench
        auth: {{header: x-api-key, value: "{backup_key}"}}
  - name: bench-chat
    match: {{host: 127.0.0.1, path: "/*/v1/chat/completions"}}
    upstreams:
      - name: primary
        url: original
        retries: 0              # the fallback scenario measures the move to the backup, not a backoff
      - name: backup
        url: http://127.0.0.1:{backup_port}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer {backup_key}"}}
  - name: bench-responses-websocket
    match: {{host: 127.0.0.1, path: /ws/v1/responses}}
    api: openai-responses
    upstreams:
      - {{name: primary, url: original, retries: 0}}
"""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None
    stop_signal: int = signal.SIGTERM

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(30 if self.stop_signal == signal.SIGINT else 8)
            except subprocess.TimeoutExpired:
                self.process.kill()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        for stream in (self.process.stdout, self.process.stderr, self.process.stdin):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (children inherit it); return (soft, hard) afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft < hard:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def start_upstream(args: argparse.Namespace, workdir: Path) -> tuple[Child, list[int]]:
    """`bench.py --serve` in its own process; returns once it has printed its two ports."""
    log_path = workdir / "upstream.log"
    cmd = [sys.executable, str(ENTRY), "--serve", "--tokens", str(args.tokens),
           "--gap-ms", str(args.gap_ms), "--max-lifetime", str(args.max_lifetime)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                   env=child_env(), preexec_fn=terminate_with_parent)
    child = Child("upstream", process, log_path)
    assert process.stdout is not None
    deadline = time.monotonic() + UPSTREAM_START_S
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or process.poll() is not None:
            child.stop()
            raise RuntimeError(f"upstream did not start: {log_path.read_text(errors='replace')}")
        ready, _, _ = select.select([process.stdout], [], [], min(remaining, 0.5))
        if ready:
            byte = os.read(process.stdout.fileno(), 1)
            if not byte:
                continue
            line += byte
    ports: list[int] = json.loads(line)["ports"]
    return child, ports


def write_rules(workdir: Path, backup_port: int, more_routes: str = "") -> Path:
    """The rules above, with `more_routes` (YAML list items) after their own."""
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(backup_port=backup_port, backup_key=BACKUP_KEY) + more_routes)
    return rules


def start_proxy(name: str, workdir: Path, rules: Path, extra: list[str], *, bare: bool = False,
                addon: Path | None = None) -> tuple[Child, int]:
    """One mitmdump in regular mode on loopback: Switchyard's with `rules`, or plain mitmdump (`bare`).
    `addon`: another tree's `addon/switchyard.py` (an earlier commit's worktree) instead of this one's;
    it imports the `switchyard_core` beside it."""
    home = workdir / name
    home.mkdir(parents=True, exist_ok=True)
    if addon is not None and not bare:
        extra = ["-s", str(addon), "--set", f"switchyard_rules={rules}", *extra]
        bare = True
    try:
        dump = start_mitmdump(rules, home / "mitmdump.log", extra_args=extra, bare=bare, die_with_parent=True,
                              start_timeout_s=MITMDUMP_START_S)
    except RuntimeError as exc:
        raise RuntimeError(f"{name} {exc}") from None
    return Child(name, dump.process, dump.log_path), dump.proxy_port
