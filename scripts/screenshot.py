#!/usr/bin/env python3
"""Take docs/debugging.md's screenshot: mitmweb showing a fallback, by headless Chromium.

Runs the demo scenario (fake provider, first-frame 503, backup answers) through
`mitmweb -s addon/switchyard.py`, then opens the failed attempt's flow in
headless Chromium (Debian's `chromium`; `scripts/screenshot` installs it) and
writes docs/mitmweb-fallback.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "addon"))
sys.path.insert(0, str(ROOT / "scripts"))

from demo import curl, demo_setup  # noqa: E402

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--window-size=1500,900", "--virtual-time-budget=6000",
]


def flows(web_url: str) -> list[dict]:
    base, _, query = web_url.partition("/?")
    with urllib.request.urlopen(f"{base}/flows?{query}", timeout=10) as response:
        return json.load(response)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "docs" / "mitmweb-fallback.png"))
    parser.add_argument("--tab", default="response", help="the flow detail tab to show")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        sys.exit("chromium not found: run scripts/screenshot (it installs Debian's chromium)")
    with demo_setup(2, web=True) as (provider, dump, workdir):
        curl(provider.url("primary", "/v1/chat/completions"), dump.proxy_url)
        time.sleep(0.5)
        shown = flows(dump.web_url)
        attempt = next(f for f in shown if "; attempt 1 (" in f.get("comment", ""))
        url = f"{dump.web_url}#/flows/{attempt['id']}/{args.tab}"
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={workdir / 'chromium'}",
                        f"--screenshot={out}", url], check=True, capture_output=True, timeout=120)
        print(f"wrote {out} ({out.stat().st_size} bytes) from {url.split('?')[0]}")


if __name__ == "__main__":
    main()
