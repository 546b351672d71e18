"""The test set-up installs the agents at the versions the lock pins."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.agents import ROOT, agent_binary

PINNED = json.loads((ROOT / "tests" / "agents" / "package.json").read_text())["dependencies"]


@pytest.mark.parametrize(
    ("binary", "package"),
    [("codex", "@openai/codex"), ("claude", "@anthropic-ai/claude-code"), ("gemini", "@google/gemini-cli")],
)
def test_agent_is_installed_at_its_pinned_version(binary: str, package: str, tmp_path) -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "CODEX_HOME": str(tmp_path)}
    out = subprocess.run(
        [str(agent_binary(binary)), "--version"], capture_output=True, text=True, timeout=120, env=env, check=True
    )
    assert PINNED[package] in out.stdout
