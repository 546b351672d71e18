"""Optional profiling of both proxies with py-spy (`--profile DIR`; pip install py-spy
into the venv, it is not a project dependency)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmark.processes import Child

_LINE_NO = re.compile(r":\d+\)$")


def start_profilers(outdir: Path, targets: dict[str, int], max_seconds: float) -> list[Child]:
    """One `py-spy record` per target pid, writing `<name>.collapsed.txt` into `outdir`; SIGINT ends one."""
    pyspy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if pyspy is None:
        raise RuntimeError("--profile needs py-spy: .venv/bin/pip install py-spy")
    outdir.mkdir(parents=True, exist_ok=True)
    children = []
    for name, pid in targets.items():
        log_path = outdir / f"{name}.py-spy.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [pyspy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--nonblocking",
                 "--duration", str(int(max_seconds)), "--output", str(outdir / f"{name}.collapsed.txt")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        children.append(Child(f"py-spy-{name}", process, log_path, stop_signal=signal.SIGINT))
    return children


def summarize_profile(path: Path, top: int = 30) -> str:
    """Top functions by inclusive and by self samples from py-spy's collapsed-stack output."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.strip() for f in stack.split(";")]
        frames = [_LINE_NO.sub(")", f) for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    out = [f"{path.name}: {total} samples"]
    out.append("  inclusive:")
    out += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)] if total else []
    out.append("  self:")
    out += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)] if total else []
    return "\n".join(out)
