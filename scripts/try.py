#!/usr/bin/env python3
"""Try Switchyard on your own client, against a fake provider that fails on purpose.

Starts the fake provider (a primary that fails the way you choose, a backup that
answers) and Switchyard in front of it in reverse mode, with a ready rules file
that matches by path.  It prints the base URL to give your client, then the
Switchyard log lines as they come, until Ctrl-C.  Any API key works.

    scripts/try                            # every request to the primary: a first-frame 503
    scripts/try --fail response_failed:1   # one response.failed, then the primary answers (a retry)
    scripts/try --fail http_529:always --web

Switchyard listens twice: in reverse mode (--port), the base URL your client is given,
and in proxy mode (--proxy-port), for clients sent through it as an HTTP proxy to the
fake provider's own address.  Every port it opens can be pinned (--port, --proxy-port,
--provider-port, --web-port); each is a free one otherwise.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fake_provider import ALWAYS, ScriptedByApi, parse_failure  # noqa: E402
from tests.support.fake_provider import FAILURES  # noqa: E402
from tests.support.mitm import Mitmdump, free_port, start_mitmdump  # noqa: E402

RULES = """\
# Written by scripts/try: the fake provider's primary (this listener's reverse target)
# and its backup on another port. Routes match by path, so they work at any host.
version: 1
defaults: {{retries: 1, backoff_ms: 200, first_output_timeout_s: {stall_s}}}
routes:
  - name: try-chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{backup}/backup/v1/chat/completions"}}
  - name: try-responses
    match: {{path: /primary/v1/responses}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{backup}/backup/v1/responses"}}
  - name: try-messages
    match: {{path: /primary/v1/messages}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{backup}/backup/v1/messages"}}
  - name: try-gemini
    match: {{path: "/primary/v1*/models/*"}}
    upstreams:
      - {{name: primary, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{backup}/backup/v1beta/models/gemini-2.5-flash:streamGenerateContent"}}
"""


# a Switchyard event as mitmdump prints it: "[00:01:47.771] switchyard.attempt_failed ...";
# not mitmproxy's own lines that merely name the addon ("Loading script .../switchyard.py")
EVENT = re.compile(r"^\[[^\]]*\] switchyard\.")


def _listening(dump: Mitmdump, count: int) -> bool:
    """Whether mitmdump came up with all its listeners (bounded); False as soon as it exits."""
    deadline = time.monotonic() + 30
    while dump.log().count("listening at") < count:
        if dump.process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


TIMEOUTS = ("stall", "lifecycle_stall")  # a failure only once first_output_timeout_s says so
STALL_S = 5  # the rules' first_output_timeout_s


def what_happens(kind: str, count: int) -> str:
    """What the log will show for a request, as the rules above decide it (a retryable failure is
    tried once more on the primary, a timeout moves on to the backup at once)."""
    if kind in TIMEOUTS:
        story = (f"A stall is a failure once {STALL_S} s pass without output (first_output_timeout_s in the rules\n"
                 "file). A timeout moves on at once (asking a silent provider again only doubles the wait):\n"
                 f"after {STALL_S} s, switchyard.attempt_failed ... decision=next_upstream, then\n"
                 "switchyard.fallback_answered upstream=backup; your client gets the backup's answer\n"
                 "(\"Hello from backup, all good.\")")
    elif count == 1:
        story = ("Watch the log below: switchyard.attempt_failed ... decision=retry (the primary again), then\n"
                 "switchyard.retry_answered upstream=primary; your client gets the primary's answer\n"
                 "(\"Hello from primary, all good.\")")
    else:
        story = ("Watch the log below: switchyard.attempt_failed ... decision=retry (the primary again), then\n"
                 "decision=next_upstream and switchyard.fallback_answered upstream=backup; your client gets the\n"
                 "backup's answer (\"Hello from backup, all good.\")")
    if count != ALWAYS:
        story += f".\nOnce {count} request(s) failed so, the primary answers at once"
    return story + ". Ctrl-C to stop."


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/try", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fail", default="sse_503:always", metavar="KIND[:COUNT|always]",
                        help=f"how the primary fails (default sse_503:always); KIND one of {', '.join(FAILURES)}")
    parser.add_argument("--port", type=int, default=0,
                        help="Switchyard's reverse-mode listener, the base URL for your client (default: a free port)")
    parser.add_argument("--proxy-port", type=int, default=0,
                        help="Switchyard's proxy-mode listener (default: a free port)")
    parser.add_argument("--provider-port", type=int, action="append", default=[], metavar="PORT",
                        help="the fake provider's ports: the first for the primary, a second for the backup "
                             "(default: free ports)")
    parser.add_argument("--web-port", type=int, default=0, help="mitmweb's UI, with --web (default: a free port)")
    parser.add_argument("--pace-ms", type=float, default=0, help="pause between the frames of an answer")
    parser.add_argument("--web", action="store_true", help="mitmweb instead of mitmdump, to click through the flows")
    args = parser.parse_args()
    try:
        name, (kind, count) = parse_failure(f"primary={args.fail}")
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc).replace("--fail NAME=", "--fail ").replace("--fail primary=", "--fail "))
    if len(args.provider_port) > 2:
        parser.error("--provider-port: at most two (the primary's, then the backup's)")
    signal.signal(signal.SIGTERM, _interrupt)

    provider = ScriptedByApi({name: (kind, count)})
    provider.pace_s = args.pace_ms / 1000
    provider.start(ports=[*args.provider_port, 0, 0][:2])
    workdir = Path(tempfile.mkdtemp(prefix="switchyard-try-"))
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(backup=provider.ports[1], stall_s=STALL_S))
    log = workdir / "mitmdump.log"
    port = args.port or free_port()
    web = ["--set", f"web_port={args.web_port or free_port()}", "--set", "web_open_browser=false"] if args.web else []
    dump = start_mitmdump(rules, log, reverse_target=f"http://127.0.0.1:{provider.ports[0]}", reverse_port=port,
                          proxy_port=args.proxy_port or None, extra_args=web, web=args.web, wait=False)
    if not _listening(dump, count=3 if args.web else 2):  # its proxy, the reverse listener, mitmweb's UI
        dump.stop()
        provider.stop()
        said = [line for line in dump.log().splitlines() if not EVENT.match(line) and "Loading script" not in line
                and "listening at" not in line]
        sys.exit("scripts/try: mitmdump did not start:\n" + "\n".join(said[-10:]) + f"\n(its log: {log})")
    base = f"http://127.0.0.1:{port}/primary"
    straight = provider.url("primary", "")
    times = "every streaming request" if count == ALWAYS else f"the first {count} streaming request(s)"
    print(f"""\
The fake provider's primary fails {times} with {kind}; its backup answers.
Switchyard (reverse mode) is in front of it. Give your client this base URL (any API key works):

  OpenAI-style clients (openai SDK, llm, Codex CLI's provider base_url):  {base}/v1
  Anthropic-style clients (anthropic SDK, Claude Code's ANTHROPIC_BASE_URL): {base}
  Gemini clients (google-genai's base_url, Gemini CLI's GOOGLE_GEMINI_BASE_URL): {base}

  e.g.  OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY=sk-test python my_agent.py
        ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=sk-test claude -p "Say hello"
        GOOGLE_GEMINI_BASE_URL={base} GEMINI_API_KEY=test gemini --skip-trust -p "Say hello"
          (Gemini CLI: with {{"security": {{"auth": {{"selectedType": "gemini-api-key"}}}}}} in ~/.gemini/settings.json)

Proxy mode too: Switchyard also listens at {dump.proxy_url} as an HTTP proxy. The same routes take
what is sent through it to the fake provider's own address (plain HTTP, so no CA), e.g.
  curl -N -x {dump.proxy_url} {straight}/v1/chat/completions -H "Content-Type: application/json" \\
    -d '{{"model": "gpt-4o", "stream": true, "messages": [{{"role": "user", "content": "Say hello"}}]}}'

Without Switchyard (to see what your client does on its own): {straight} (+ /v1 for OpenAI-style)
Rules: {rules}
Log:   {log}""")
    if args.web:
        print(f"mitmweb: {dump.web_url}")
    print(f"\n{what_happens(kind, count)}\n", flush=True)
    shown = 0

    def show_new_events() -> None:
        nonlocal shown
        lines = dump.log().split("\n")[:-1]  # whole lines only: the last may be half-written
        for line in lines[shown:]:
            if EVENT.match(line):
                print(line, flush=True)
        shown = len(lines)

    failed = False
    try:
        while dump.process.poll() is None:
            show_new_events()
            time.sleep(0.2)
        show_new_events()
        # a terminal's Ctrl-C reaches mitmdump too, which may stop first: that is no failure
        if dump.process.returncode != 0:
            failed = True
            print(f"mitmdump exited ({dump.process.returncode}); its log: {log}", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        dump.stop()
        provider.stop()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
