"""Readings from /proc: CPU seconds, wake-ups and RSS of a process tree, and the machine's busy time."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{current}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for kid in kids:
                out.append(int(kid))
                todo.append(int(kid))
    return out


def _stat_ticks(pid: int, with_reaped: bool) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime=14, stime=15, cutime=16, cstime=17
    ticks = int(fields[11]) + int(fields[12])
    if with_reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds of a process, its live descendants, and its reaped children."""
    if pid is None:
        return 0.0
    ticks = _stat_ticks(pid, True) + sum(_stat_ticks(kid, False) for kid in _descendants(pid))
    return ticks / CLK_TCK


def kernel_cpu_seconds(pid: int | None) -> float:
    """The stime (+cstime) part of cpu_seconds: time in the kernel (syscalls, network stack)."""
    if pid is None:
        return 0.0
    ticks = 0
    for one in [pid, *_descendants(pid)]:
        try:
            raw = Path(f"/proc/{one}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        ticks += int(fields[12]) + (int(fields[14]) if one == pid else 0)
    return ticks / CLK_TCK


def wakeups(pid: int | None) -> int:
    """Times the process's threads were scheduled onto a CPU (schedstat run count), a proxy for
    event-loop wake-ups."""
    if pid is None:
        return 0
    total = 0
    for one in [pid, *_descendants(pid)]:
        try:
            tids = os.listdir(f"/proc/{one}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                total += int(Path(f"/proc/{one}/task/{tid}/schedstat").read_text().split()[2])
            except (OSError, IndexError, ValueError):
                pass
    return total


def status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid: int | None) -> int:
    if pid is None:
        return 0
    return status_kb(pid, "VmRSS") + sum(status_kb(kid, "VmRSS") for kid in _descendants(pid))


def machine_busy_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def ours_cpu_s(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids) + cpu_seconds(os.getpid())


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from mitmproxy.version import VERSION as mitm_version
    except Exception:
        mitm_version = "unknown"
    try:
        import httptools

        httptools_version = httptools.__version__
    except Exception:
        httptools_version = "unknown"
    affinity: int | None
    try:
        affinity = len(os.sched_getaffinity(0))
    except OSError:
        affinity = os.cpu_count()
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mitmproxy": mitm_version,
        "httptools": httptools_version,
    }


