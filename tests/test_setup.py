"""The README's two set-up commands on a fresh checkout: `scripts/run` installs what
running needs and no more, saying so as it goes, and once listening says where the
CA is and what to do next; the demo's and try's fake provider adds only its server;
CI runs the README's test command."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.mitm import free_port

ROOT = Path(__file__).resolve().parents[1]


def fresh_checkout(tmp_path: Path) -> Path:
    """This tree's tracked files (as they are now, committed or not), with no .venv."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    checkout = tmp_path / "switchyard"
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    return checkout


def imports(checkout: Path, module: str) -> bool:
    return subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c", f"import {module}"],
                          capture_output=True).returncode == 0


def test_a_fresh_checkouts_run_installs_what_running_needs_with_progress_then_the_fake_provider_adds_its_server(
        tmp_path: Path) -> None:
    checkout = fresh_checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run([str(checkout / "scripts" / "run"), "--version"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Mitmproxy: 12." in done.stdout
    said = done.stderr
    assert "switchyard: creating " in said and "switchyard: installing what running Switchyard needs" in said
    assert "Successfully installed" in said and "mitmproxy" in said.split("Successfully installed", 1)[1]
    assert imports(checkout, "mitmproxy") and imports(checkout, "wsproto")
    for test_only in ("pytest", "mypy", "hypothesis", "openai", "aiohttp"):
        assert not imports(checkout, test_only), test_only
    # a second run sets nothing up
    again = subprocess.run([str(checkout / "scripts" / "run"), "--version"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "switchyard:" not in again.stderr
    # the fake provider (scripts/try, scripts/demo) adds its server, not the tests' tools
    done = subprocess.run([str(checkout / "scripts" / "fake_provider.py"), "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "installing what running Switchyard and its fake provider need" in done.stderr
    assert imports(checkout, "aiohttp") and not imports(checkout, "pytest")


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == "exec scripts/test -q"
    assert "scripts/test" in (ROOT / "README.md").read_text()


def test_once_listening_run_says_where_the_ca_is_and_what_to_do_next(tmp_path: Path) -> None:
    proxy, reverse = free_port(), free_port()
    process = subprocess.Popen([str(ROOT / "scripts" / "run"), "--mode", f"regular@{proxy}",
                                "--mode", f"reverse:https://api.openai.com@{reverse}",
                                "--set", f"confdir={tmp_path / 'conf'}"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        printed: list[str] = []
        while not any("what failed and why" in line for line in printed):  # bounded by the reads' end
            line = process.stdout.readline()
            assert line, "scripts/run ended early:\n" + "".join(printed)
            printed.append(line)
        text = "".join(printed)
        ca = tmp_path / "conf" / "mitmproxy-ca-cert.pem"
        assert ca.is_file()
        assert f"Proxy mode at 127.0.0.1:{proxy}: give a client HTTPS_PROXY=http://127.0.0.1:{proxy}" in text
        assert f"mitmproxy's CA, {ca}" in text and "NODE_EXTRA_CA_CERTS" in text
        assert (f"Reverse mode at 127.0.0.1:{reverse} for https://api.openai.com: give a client the base URL "
                f"http://127.0.0.1:{reverse}/v1\n    (no CA needed).") in text
        assert "docs/clients.md" in text and "scripts/try" in text
        # it comes after mitmproxy's own listening lines
        assert text.index("Switchyard is ready.") > text.rindex("listening at")
    finally:
        process.terminate()
        process.wait(20)
