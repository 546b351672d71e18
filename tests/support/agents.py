"""The real CLI agents the end-to-end tests drive, installed from npm.

`scripts/install-agents` installs them (pinned by tests/agents/package-lock.json)
into the ignored `.agents/` folder once; later runs reuse it. A test that needs an
agent fails with npm's own words when they cannot be installed: never a skip, so a
machine without the registry shows up as red, not as a green run that tested less.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "scripts" / "install-agents"


@functools.cache
def _bin_dir() -> Path | str:
    """The binaries' folder, or the installer's error text (cached either way)."""
    proc = subprocess.run(
        [str(INSTALLER)], capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        return f"scripts/install-agents failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


def agent_binary(name: str) -> Path:
    """The path of `codex`, `claude` or `gemini`; fails the test clearly without it."""
    found = _bin_dir()
    if isinstance(found, str):
        pytest.fail(f"the {name} agent could not be installed from npm: {found}", pytrace=False)
    path = found / name
    if not path.exists():
        pytest.fail(f"{name} is missing from {found} after scripts/install-agents", pytrace=False)
    return path
