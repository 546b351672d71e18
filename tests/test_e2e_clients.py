"""mitmweb's address, with its token, as docs/debugging.md gives it (`scripts/run --web`).

The client recipes of docs/clients.md are run as written by test_docs_recipes.py;
Codex CLI and Claude Code's behaviour through Switchyard by test_e2e_codex.py and
test_e2e_claude_code.py.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.mitm import free_port

ROOT = Path(__file__).resolve().parents[1]


# --- mitmweb's address, with its token ----------------------------------------------------


def get_status(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def run_web(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], int, str]:
    """`scripts/run --web` as docs/debugging.md gives it; returns the process, mitmweb's port and the
    address it printed."""
    web_port = free_port()
    process = subprocess.Popen([str(ROOT / "scripts" / "run"), "--web", "-p", str(free_port()),
                                "--set", f"web_port={web_port}", "--set", "web_open_browser=false",
                                "--set", f"confdir={tmp_path / 'conf'}", *extra],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for _ in range(200):  # bounded: mitmweb prints its address within a few lines
        line = process.stdout.readline()
        if "Web server listening at" in line:
            return process, web_port, line.split("listening at", 1)[1].strip()
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError("mitmweb printed no address")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def test_mitmweb_is_opened_with_the_token_it_prints_or_a_password_you_set(tmp_path: Path) -> None:
    process, port, printed = run_web(tmp_path)
    try:
        assert printed.startswith(f"http://127.0.0.1:{port}/?token=")
        assert get_status(printed) == 200
        assert get_status(f"http://127.0.0.1:{port}/") == 403  # "Authentication Required" without it
    finally:
        stop(process)
    process, port, printed = run_web(tmp_path, "--set", "web_password=letmein-42")
    try:
        assert printed == f"http://127.0.0.1:{port}/"  # a password you set is not printed
        assert get_status(f"http://127.0.0.1:{port}/?token=letmein-42") == 200
        assert get_status(f"http://127.0.0.1:{port}/?token=wrong") == 403
    finally:
        stop(process)
