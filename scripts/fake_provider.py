#!/usr/bin/env python3
"""A fake LLM provider on loopback: Chat Completions, Responses, Anthropic Messages, Gemini.

Every upstream is a path prefix: `http://127.0.0.1:PORT/<name>/v1/chat/completions`,
`/<name>/v1/responses`, `/<name>/v1/messages`,
`/<name>/v1beta/models/<model>:streamGenerateContent`.  It answers normally (text
that names the upstream) unless told to fail:

    scripts/fake_provider.py --port 9100 --port 9101 --fail primary=sse_503:2

makes the first two streaming-API requests to `/primary/...` (POST to
chat/completions, responses, messages or a Gemini model's :streamGenerateContent)
answer HTTP 200 with a first-frame 503 error in the API's own shape; COUNT
`always` fails every one.  Other requests
never use a failure up: HEAD gets headers without a body, GET .../models a model
list, POST .../count_tokens a token count, a GET of an API's path (a WebSocket
upgrade too: these ports speak HTTP only, see --ws) a 405.

Failure kinds:
  sse_503, sse_429, sse_529  HTTP 200, then an error as the first frame (Anthropic's
                         overloaded_error for 503 and 529)
  lifecycle_error        the lifecycle frames (role chunk, response.created,
                         message_start + ping), then an in-stream 503 error
  response_failed        Responses: response.created, then response.failed
                         server_is_overloaded; other APIs: their in-stream error
  overload_message       an error with only "Our servers are currently overloaded."
  http_503, http_429, http_529   an HTTP error with the API's JSON error body
  reset, lifecycle_reset the connection dropped (after the lifecycle frames)
  stall, lifecycle_stall silence after the headers (after the lifecycle frames)

--ws also serves the Responses API over WebSocket, on a port of its own (its
ws://127.0.0.1:WSPORT/v1/responses URL is printed after the HTTP ones), as a
provider does: a `generate: false` warm-up (Codex's first message on every
connection) gets an output-less response, and every other turn a whole answer
("Hello from websocket, all good.").  --ws-fail N makes the first N turns that
are not warm-ups fail before output (an error, then response.failed).  Its port
also answers POST /v1/responses (HTTP SSE) the same way.
Runs until interrupted, or for --seconds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _in_project_venv() -> None:
    """Run on the project's own venv, with the fake provider's server installed there
    (`scripts/bootstrap demo`, at once when it is), whatever python started us."""
    import subprocess

    subprocess.run([str(ROOT / "scripts" / "bootstrap"), "demo"], check=True)
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        return
    venv_python = ROOT / ".venv" / "bin" / "python"
    os.execv(str(venv_python), [str(venv_python), str(Path(__file__).resolve()), *sys.argv[1:]])


if __name__ == "__main__":
    _in_project_venv()

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

sys.path.insert(0, str(ROOT))

from tests.support import wire  # noqa: E402
from tests.support.fake_provider import FAILURES, ScriptedByApi  # noqa: E402,F401  (ScriptedByApi: for try.py, demo.py)
from tests.support.ws_provider import WsProvider, full_answer_turn, overload_turn, warm_up_turn  # noqa: E402

ALWAYS = -1


class ProviderWs(WsProvider):
    """The Responses API over WebSocket as a provider speaks it: a `generate: false`
    warm-up gets an output-less response and is no turn a user means; each other turn
    is answered whole (its item and part `done` events, the finished response: what
    Codex prints its answer from), after the first `fail` of them failed before output."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.fail = fail
        self.turns = 0  # turns a user means, on every connection

    def answer(self, create: str, turn: int) -> list[str | bytes | float]:
        try:
            asked = json.loads(create)
        except ValueError:
            asked = {}
        with self._lock:
            self.turns += 0 if asked.get("generate") is False else 1
            number = self.turns
        if asked.get("generate") is False:
            return list(warm_up_turn(f"resp_warmup{turn}"))
        if number <= self.fail:
            return list(overload_turn(f"resp_failed{number}"))
        return list(full_answer_turn(f"resp_ws{number}", wire.answer_text("websocket")))


def parse_failure(text: str) -> tuple[str, tuple[str, int]]:
    name, _, spec = text.partition("=")
    kind, _, count = spec.partition(":")
    if not name or kind not in FAILURES:
        raise argparse.ArgumentTypeError(f"--fail NAME=KIND[:COUNT|always], KIND one of {', '.join(FAILURES)}")
    if count == "always":
        return name, (kind, ALWAYS)
    try:
        return name, (kind, int(count or 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fail {text}: COUNT is a number or 'always'") from None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripts/fake_provider.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, action="append",
                        help="port to listen on (repeat for a second origin); default: two random ports")
    parser.add_argument("--fail", type=parse_failure, action="append", default=[], metavar="NAME=KIND[:COUNT]",
                        help="fail upstream NAME's first COUNT API requests (default 1; 'always')")
    parser.add_argument("--pace-ms", type=float, default=0, help="pause between the frames of a normal answer")
    parser.add_argument("--ws", action="store_true", help="also serve the Responses API over WebSocket")
    parser.add_argument("--ws-fail", type=int, default=0, metavar="N",
                        help="fail the first N WebSocket turns (a generate: false warm-up is none)")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until interrupted)")
    return parser


def main() -> None:
    args = parser().parse_args()
    provider = ScriptedByApi(dict(args.fail))
    provider.pace_s = args.pace_ms / 1000
    provider.start(ports=args.port or [0, 0])
    ws = None
    if args.ws:
        ws = ProviderWs(fail=args.ws_fail).start()
    print(" ".join(f"http://127.0.0.1:{port}" for port in provider.ports), flush=True)
    if ws is not None:
        print(ws.url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait(args.seconds or None)
    provider.stop()
    if ws is not None:
        ws.stop()


if __name__ == "__main__":
    main()
