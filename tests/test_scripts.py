"""The project's own tools run as a user runs them: `scripts/demo`, finding a Python, the benchmark
(`scripts/fake_provider.py` and `scripts/try` have files of their own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_shows_a_fallback_end_to_end() -> None:
    done = subprocess.run([str(ROOT / "scripts" / "demo")], capture_output=True, timeout=120)
    output = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "answer text: 'Hello from backup, all good.'" in output
    assert "switchyard.fallback_answered route=demo-chat upstream=backup" in output
    # section 1 involves no Switchyard: what it shows is a provider's own error frame
    direct = output.split("1. Straight to the provider", 1)[1].split("2. Through Switchyard", 1)[0]
    assert "switchyard" not in direct.lower()
    assert '{"id":"c1","object":"chat.completion.chunk","choices":[],"error":{"code":503,' in direct
    # the provider's requests: Switchyard's three, and the direct one named as such
    assert ("requests the provider saw from Switchyard: ['primary', 'primary', 'backup'] "
            "(and 1 straight from the client, in section 1)") in output
    # the rules file its log names is still there to read
    named = output.split("switchyard.rules_loaded path=", 1)[1].split()[0]
    assert Path(named).read_text().startswith("version: 1")
    kept = Path(named).parent
    assert f"kept in {kept}/" in output and (kept / "mitmdump.log").exists()
    shutil.rmtree(kept)

# --- finding a Python >= 3.12 on a machine that may have only an older one ----------------


@pytest.fixture
def bare_machine(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the scripts and a PATH holding only bash, dirname and a `python3`
    that is too old: a machine without pyenv or a new enough Python."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", root / "scripts")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run the scripts"
        (bin_dir / tool).symlink_to(found)
    old = bin_dir / "python3"
    old.write_text("#!/bin/sh\necho 'Python 3.11.2'\nexit 1\n")  # fails the version check, as 3.11 does
    old.chmod(0o755)
    return root, {"PATH": str(bin_dir), "HOME": str(tmp_path)}


def real_python() -> str:
    """This interpreter itself (>= 3.12, or the suite would not run), not the venv's wrapper."""
    return os.path.realpath(sys.executable)


def test_with_no_python_new_enough_the_scripts_say_so_and_install_nothing(bare_machine) -> None:
    root, env = bare_machine
    for script in ("find-python", "run", "test"):
        done = subprocess.run([str(root / "scripts" / script)], env=env, capture_output=True, timeout=30)
        assert done.returncode == 1, script
        message = done.stderr.decode()
        assert "no Python >= 3.12 found" in message and "SWITCHYARD_PYTHON" in message, message
        assert "install one" in message
    assert not (root / ".venv").exists()


def test_a_system_python3_13_is_found_beside_an_old_python3(bare_machine) -> None:
    root, env = bare_machine
    (Path(env["PATH"]) / "python3.13").symlink_to(real_python())
    done = subprocess.run([str(root / "scripts" / "find-python")], env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == str(Path(env["PATH"]) / "python3.13")


def test_switchyard_python_comes_first(bare_machine) -> None:
    root, env = bare_machine
    (Path(env["PATH"]) / "python3.13").symlink_to(real_python())
    chosen = real_python()
    done = subprocess.run([str(root / "scripts" / "find-python")], env={**env, "SWITCHYARD_PYTHON": chosen},
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == chosen


def test_the_benchmark_runs_every_path_and_every_stream_arrives_whole(tmp_path: Path) -> None:
    """Not a measurement (no figure is asserted): docs/benchmarks.md's figures come from
    this script, so it must keep working; it checks every stream's bytes itself."""
    raw = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--concurrency", "1", "4",
                           "--burst", "4", "--staging-streams", "40", "--translated", "--prompt-kb", "64", "--json", str(raw)],
                          capture_output=True, timeout=240)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    summary = json.loads(raw.read_text())["summary"]
    assert json.loads(raw.read_text())["config"]["prompt_kb"] == 64  # every request the size of an agent's turn
    for kind in ("happy", "fallback"):
        for c in (1, 4):
            for path in ("direct", "plain", "switchyard"):
                cell = summary[f"{kind}/c{c}/{path}"]
                assert cell["streams"] >= c and cell["failed"] == 0, (kind, c, path, cell["errors"])
    for path in ("direct", "plain", "switchyard"):  # bursts: every stream timed from its burst's start, whole
        cell = summary[f"burst/c4/{path}"]
        assert cell["streams"] >= 4 and cell["failed"] == 0 and cell["ttft"]["n"] == cell["streams"], cell["errors"]
    for c in (1, 4):  # a stream cut after output, continued by the prefill backup, whole
        cell = summary[f"continue/c{c}/switchyard"]
        assert cell["streams"] >= c and cell["failed"] == 0 and cell["cut_gap"]["n"] == cell["streams"], cell["errors"]
    for c in (1, 4):  # the backup speaks Anthropic Messages: its answer translated, whole, to [DONE]
        cell = summary[f"translated/c{c}/switchyard"]
        assert cell["streams"] >= c and cell["failed"] == 0 and cell["ttft"]["n"] == cell["streams"], cell["errors"]
    report = done.stdout.decode()
    assert "| 1 | proxy CPU per stream (ms) |" in report and "translated fallback | translated / same |" in report
    assert "| 4 | proxy CPU per stream (ms) |" in report
    assert "| time to first content, 4 requests started together, p90 |" in report
    assert "| 1 | continue after cut: cut to first continued content, median (ms) |" in report
    assert "switchyard's peak − before at most 300 MB beyond plain mitmdump's" in report
    outages = json.loads(raw.read_text())["outages"]  # each outage's later requests skip to the backup, whole
    assert outages["cells"] and not [s["error"] for c in outages["cells"] for s in c["samples"] if s["error"]]
    assert "| primary hung (accepts, never answers) | first content, median |" in report


def test_the_benchmark_can_give_plain_mitmdump_switchyards_hook_dispatch(tmp_path: Path) -> None:
    """`--plain-hook-dispatch`: plain mitmdump runs with that dispatch (its log says so),
    and the report says the ratios are then Switchyard's own cost."""
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--concurrency", "1",
                           "--burst", "--staging-streams", "0", "--ws-turns", "0", "--outages", "0",
                           "--plain-hook-dispatch", "--keep-logs", str(logs)], capture_output=True, timeout=240)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    assert "plain mitmdump runs with Switchyard's hook dispatch" in (logs / "plain.log").read_text()
    assert "Plain mitmdump ran with Switchyard's hook dispatch" in done.stdout.decode()


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_killed_benchmark_leaves_no_upstream_or_mitmdump_behind() -> None:
    """SIGKILL gives the benchmark no chance to stop its children; the kernel does (they die with it)."""
    bench = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--staging-streams", "0",
                              "--ws-turns", "0", "--max-lifetime", "120"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        assert bench.stderr is not None
        for _ in range(20):  # progress lines, bounded; the pids come in the first few
            line = bench.stderr.readline().decode()
            if "upstream pid" in line:
                pids.append(int(line.split("upstream pid", 1)[1].split()[0]))
            if "switchyard mitmdump pid" in line:
                pids.append(int(line.split("plain mitmdump pid", 1)[1].split()[0]))
                pids.append(int(line.split("switchyard mitmdump pid", 1)[1].split()[0]))
                break
        assert len(pids) == 3, f"the benchmark did not report its upstream and both mitmdumps: {pids}"
        assert not any(_gone(pid) for pid in pids)
        cmdline = Path(f"/proc/{pids[-1]}/cmdline").read_bytes().decode().split("\0")
        rules = next(arg.split("=", 1)[1] for arg in cmdline if arg.startswith("switchyard_rules="))
        workdir = Path(rules).parent  # the killed run cannot remove it itself
    finally:
        bench.kill()
        bench.wait(10)
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(workdir, ignore_errors=True)
    assert [pid for pid in pids if not _gone(pid)] == []
