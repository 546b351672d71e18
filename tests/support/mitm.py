"""Run a real `mitmdump -s addon/switchyard.py` for tests, and read its log."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MITMDUMP = Path(os.environ.get("SWITCHYARD_MITMDUMP", ROOT / ".venv" / "bin" / "mitmdump"))
MITMWEB = MITMDUMP.with_name("mitmweb")
ADDON = ROOT / "addon" / "switchyard.py"
PROXY_ENV_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                  "no_proxy")
_PR_SET_PDEATHSIG = 1


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `env`, without proxy variables: a child talks
    to loopback only, and a proxy set in the caller's shell must not come between."""
    full = {**os.environ, **(env or {})}
    for name in PROXY_ENV_VARS:
        full.pop(name, None)
    return full


def terminate_with_parent() -> None:
    """A `preexec_fn`: the kernel sends the child SIGTERM when the thread that started it
    ends, so a killed run leaves no process behind (Linux only; elsewhere a no-op)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


_GIVEN: set[int] = set()  # ports this process has handed out


def free_port() -> int:
    """A loopback port free now, and never one this process handed out before: the
    kernel may give a just-closed port again, and two listeners of one mitmdump
    asked for in a row would then collide."""
    for _ in range(1000):  # bounded: the kernel picks from thousands
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no loopback port this process has not handed out already")


_REFUSING: list[socket.socket] = []  # held for the whole session


def refused_port() -> int:
    """A loopback port that refuses connections for the whole session: bound and never
    listening, so nothing else can take it (a port merely found free could be taken,
    or become a connection's own source port, before it is dialled)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _REFUSING.append(sock)
    return sock.getsockname()[1]


@dataclass
class Mitmdump:
    process: subprocess.Popen[bytes]
    log_path: Path
    proxy_port: int
    reverse_port: int | None

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def web_url(self) -> str:
        """mitmweb's address with its access token, as it logged it."""
        for line in self.log().splitlines():
            if "Web server listening at" in line:
                return line.split("listening at", 1)[1].strip()
        raise RuntimeError("no web server in the log")

    @property
    def reverse_url(self) -> str:
        return f"http://127.0.0.1:{self.reverse_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_mark(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, mark: int) -> str:
        with self.log_path.open("rb") as handle:
            handle.seek(mark)
            return handle.read().decode(errors="replace")

    def wait_for_log(self, text: str, mark: int = 0, timeout_s: float = 10.0, count: int = 1) -> str:
        """Poll the log (bounded) until `text` shows up (`count` times) after `mark`."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.log_since(mark)
            if found.count(text) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not logged within {timeout_s}s; log:\n{found[-4000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_mitmdump(
    rules: Path,
    log_path: Path,
    *,
    reverse_target: str | None = None,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    wait: bool = True,
    web: bool = False,
    mode: str = "regular",
    bare: bool = False,
    die_with_parent: bool = False,
    start_timeout_s: float = 30.0,
    proxy_port: int | None = None,
    reverse_port: int | None = None,
) -> Mitmdump:
    """Start mitmdump (mitmweb with `web`) with the addon; `bare`: plain mitmdump, no addon.
    Its listeners: `mode` at `proxy_port`, and with `reverse_target` a reverse one at
    `reverse_port` (each a free port unless given).

    `die_with_parent`: the kernel stops it when the calling thread ends (the benchmark's
    runs; not for tests, whose fixtures may start it from a thread that ends first)."""
    proxy_port = proxy_port or free_port()
    modes = ["--mode", f"{mode}@{proxy_port}"]
    if reverse_target:
        reverse_port = reverse_port or free_port()
        modes += ["--mode", f"reverse:{reverse_target}@{reverse_port}"]
    else:
        reverse_port = None
    addon = [] if bare else ["-s", str(ADDON), "--set", f"switchyard_rules={rules}"]
    args = [
        str(MITMWEB if web else MITMDUMP),
        *addon,
        "--listen-host",
        "127.0.0.1",
        *modes,
        "--set",
        "connection_strategy=lazy",
        "--set",
        f"confdir={log_path.parent / 'mitmproxy-conf'}",
        *(extra_args or []),
    ]
    with log_path.open("wb") as handle:
        process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=child_env(env), cwd=log_path.parent,
                                   preexec_fn=terminate_with_parent if die_with_parent else None)
    dump = Mitmdump(process, log_path, proxy_port, reverse_port)
    if wait:
        deadline = time.monotonic() + start_timeout_s
        while True:
            text = dump.log()
            ready = text.count("listening at") >= (2 if reverse_target else 1) + (1 if web else 0)
            if ready:
                break
            if process.poll() is not None:
                raise RuntimeError(f"mitmdump exited with {process.returncode} (cmd: {' '.join(args)}):\n{text}")
            if time.monotonic() > deadline:
                dump.stop()
                raise RuntimeError(f"mitmdump did not start (cmd: {' '.join(args)}):\n{text}")
            time.sleep(0.05)
    return dump


@contextmanager
def mitmdump_on(workdir: Path, rules_text: str, **options: Any) -> Iterator[Mitmdump]:
    """A mitmdump (`start_mitmdump`'s `options`) on `rules_text`, written to
    `workdir/rules.yaml` with its log beside it, stopped when the block ends."""
    rules = workdir / "rules.yaml"
    rules.write_text(rules_text)
    dump = start_mitmdump(rules, workdir / "mitmdump.log", **options)
    try:
        yield dump
    finally:
        dump.stop()
