"""The README's own tools: `scripts/fake_provider.py` and `scripts/demo`, run as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_provider() -> Iterator[str]:
    """`scripts/fake_provider.py` with the primary's first request failing; yields its first origin."""
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "fake_provider.py"), "--seconds", "60",
                                "--fail", "primary=sse_503:1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        origins = process.stdout.readline().decode().split()
        assert origins, "the fake provider printed no address"
        yield origins[0]
    finally:
        process.terminate()
        process.wait(10)


def post(url: str, body: dict) -> tuple[int, str, str]:
    """Status, content type and text; no proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=10) as answer:
        return answer.status, answer.headers["Content-Type"], answer.read().decode()


def test_the_fake_provider_fails_on_demand_then_answers_streams_and_whole_answers(fake_provider: str) -> None:
    url = f"{fake_provider}/primary/v1/chat/completions"
    status, _, text = post(url, {"model": "gpt-4o", "stream": True, "messages": []})
    assert status == 200 and json.loads(text.split("data: ", 1)[1])["error"]["code"] == 503  # an error frame in a 200
    status, content_type, text = post(url, {"model": "gpt-4o", "stream": True, "messages": []})
    assert content_type.startswith("text/event-stream") and text.endswith("data: [DONE]\n\n")
    # without "stream": true, the SDKs get a whole answer in their API's shape
    chat = openai.OpenAI(api_key="sk-test", base_url=f"{fake_provider}/primary/v1", max_retries=0)
    completion = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "Hello from primary, all good."
    response = chat.responses.create(model="gpt-4o", input="hi")
    assert response.output_text == "Hello from primary, all good."
    claude = anthropic.Anthropic(api_key="sk-test", base_url=f"{fake_provider}/primary", max_retries=0)
    message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "Hello from primary, all good."  # type: ignore[union-attr]


def test_the_demo_shows_a_fallback_end_to_end() -> None:
    done = subprocess.run([str(ROOT / "scripts" / "demo")], capture_output=True, timeout=120)
    output = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "answer text: 'Hello from backup, all good.'" in output
    assert "switchyard.fallback_answered route=demo-chat upstream=backup" in output


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
    """Not a measurement (no figure is asserted): the README's speed figures come from
    this script, so it must keep working; it checks every stream's bytes itself."""
    raw = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--concurrency", "1", "4",
                           "--burst", "4", "--staging-streams", "40", "--json", str(raw)], capture_output=True, timeout=240)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    summary = json.loads(raw.read_text())["summary"]
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
    report = done.stdout.decode()
    assert "| 4 | proxy CPU per stream (ms) |" in report
    assert "| time to first content, 4 requests started together, p90 |" in report
    assert "| 1 | continue after cut: cut to first continued content, median (ms) |" in report
    assert "switchyard's peak − before at most 300 MB beyond plain mitmdump's" in report
