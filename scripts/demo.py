#!/usr/bin/env python3
"""See a fallback happen: HTTP 200, a first-frame 503, and the backup answers.

Starts the fake provider and `mitmdump -s addon/switchyard.py` on loopback, sends
the same streaming Chat Completions request once straight to the provider and
once through Switchyard, and prints what the client got each time and what
Switchyard logged.  With --web it runs mitmweb instead and keeps running so you
can look at the flows (Ctrl-C to stop).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "addon"))
sys.path.insert(0, str(ROOT / "scripts"))

from fake_provider import ScriptedByApi  # noqa: E402
from tests.support.mitm import Mitmdump, free_port, start_mitmdump  # noqa: E402

RULES = """\
version: 1
defaults: {{backoff_ms: 100}}
routes:
  - name: demo-chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - name: primary                 # the request's own destination
        url: original
        retries: 1
      - name: backup                  # another origin: gets its own key, never the client's
        url: http://127.0.0.1:{backup_port}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer ${{DEMO_BACKUP_KEY}}"}}
"""

BODY = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Say hello"}]})


def curl(url: str, proxy: str | None = None) -> str:
    args = ["curl", "-sS", "-N", "-i", "--max-time", "20", "-H", "Content-Type: application/json",
            "-H", "Authorization: Bearer sk-demo-client-key", "--data-binary", BODY, url]
    if proxy:
        args[1:1] = ["-x", proxy, "--noproxy", ""]
    return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout.replace("\r\n", "\n")


def answer_text(sse: str) -> str:
    text = []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def section(title: str) -> None:
    bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
    print(f"\n{bold}── {title} {'─' * max(0, 70 - len(title))}{plain}")


@contextmanager
def demo_setup(primary_failures: int, *, web: bool) -> Iterator[tuple[ScriptedByApi, Mitmdump, Path]]:
    """The fake provider (primary answers a first-frame 503, the first N times) and
    Switchyard in front of it; both stopped afterwards.  The rules file and mitmdump's
    log stay in the run's folder: the log names the rules file, which must still be
    there to read."""
    provider = ScriptedByApi({"primary": ("sse_503", primary_failures)})
    provider.start()
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-demo-"))
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(backup_port=provider.ports[1]))
    extra = ["--set", f"web_port={free_port()}", "--set", "web_open_browser=false"] if web else []
    dump = start_mitmdump(rules, workdir / "mitmdump.log", env={"DEMO_BACKUP_KEY": "sk-demo-backup-key"},
                          extra_args=extra, web=web)
    try:
        yield provider, dump, workdir
    finally:
        dump.stop()
        provider.stop()
        shutil.rmtree(workdir / "mitmproxy-conf", ignore_errors=True)  # the CA it made for this run


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # a `kill` cleans up as Ctrl-C does: mitmweb stopped, files removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--web", action="store_true", help="run mitmweb and keep it running")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    with demo_setup(3, web=args.web) as (provider, dump, workdir):
        url = provider.url("primary", "/v1/chat/completions")
        try:
            section("1. Straight to the provider: HTTP 200, and the answer is an error")
            print(curl(url).strip())
            direct = len(provider.calls)
            section("2. Through Switchyard: the same request")
            through = curl(url, dump.proxy_url)
            print(through.strip())
            section("What the client got")
            print(f"answer text: {answer_text(through)!r}")
            shown = [line.split(": ", 1)[1] for line in through.splitlines() if line.lower().startswith("x-switchyard-")]
            print(f"x-switchyard-upstream / attempts: {shown}")
            print(f"requests the provider saw from Switchyard: {[c.upstream for c in provider.calls[direct:]]}"
                  f" (and {direct} straight from the client, in section 1)")
            section("What Switchyard logged")
            time.sleep(0.2)
            for line in dump.log().splitlines():
                if "] switchyard." in line:
                    print(line)
            if args.web:
                section("mitmweb")
                print(f"open {dump.web_url} — Ctrl-C to stop")
                while True:
                    time.sleep(1)
        except KeyboardInterrupt:
            pass
    print(f"\nThe rules file and mitmdump's log are kept in {workdir}/ (rules.yaml, mitmdump.log).")


if __name__ == "__main__":
    main()
