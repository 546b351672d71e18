#!/usr/bin/env python3
"""A fake LLM provider on loopback: Chat Completions, Responses and Anthropic Messages.

Every upstream is a path prefix: `http://127.0.0.1:PORT/<name>/v1/chat/completions`,
`/<name>/v1/responses`, `/<name>/v1/messages`.  It answers normally (text that
names the upstream) unless told to fail:

    scripts/fake_provider.py --port 9100 --port 9101 --fail primary=sse_503:2

makes the first two requests to `/primary/...` answer HTTP 200 with a
first-frame 503 error in the API's own shape.  Failure kinds: sse_503, sse_429,
http_503, http_429, http_529, overload_message, response_failed, reset, stall.
Runs until interrupted, or for --seconds.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addon"))

from switchyard_core.faults import error_body, error_frame  # noqa: E402
from switchyard_core.apis.openai_responses import OVERLOAD_OUTPUT_TEXT  # noqa: E402
from tests.support.fake_provider import RESET, FakeProvider, Reply  # noqa: E402

KINDS = ("sse_503", "sse_429", "http_503", "http_429", "http_529", "overload_message", "response_failed", "reset", "stall")
API_PATHS = {"openai-chat": "/v1/chat/completions", "openai-responses": "/v1/responses", "anthropic-messages": "/v1/messages"}


def failing_reply(kind: str, api: str) -> Reply:
    if kind.startswith("sse_"):
        status = int(kind[4:])
        return Reply.sse(error_frame(api, "sse_error", status, "provider overloaded"))
    if kind.startswith("http_"):
        status = int(kind[5:])
        return Reply(status, [error_body(api, status, "provider overloaded")], content_type="application/json")
    if kind == "overload_message":
        return Reply.sse(error_frame(api, "overload_message", 503, OVERLOAD_OUTPUT_TEXT))
    if kind == "response_failed":
        return Reply.sse(error_frame(api, "response_failed", 503, OVERLOAD_OUTPUT_TEXT))
    if kind == "reset":
        return Reply.sse(RESET)
    if kind == "stall":
        return Reply.sse(3600.0)
    raise ValueError(kind)


class ScriptedByApi(FakeProvider):
    """Scripts a failure per upstream name, shaped by the API each request's path names."""

    def __init__(self, failures: dict[str, tuple[str, int]]) -> None:
        super().__init__()
        self.failures = {name: [kind, count] for name, (kind, count) in failures.items()}

    async def _handle(self, request):  # type: ignore[no-untyped-def,override]
        upstream, _, rest = request.path.lstrip("/").partition("/")
        plan = self.failures.get(upstream)
        if plan and plan[1] > 0:
            plan[1] -= 1
            api = next((name for name, path in API_PATHS.items() if ("/" + rest).endswith(path)), "openai-chat")
            self.script(upstream, failing_reply(plan[0], api))
        return await super()._handle(request)


def parse_failure(text: str) -> tuple[str, tuple[str, int]]:
    name, _, spec = text.partition("=")
    kind, _, count = spec.partition(":")
    if not name or kind not in KINDS:
        raise argparse.ArgumentTypeError(f"--fail NAME=KIND[:COUNT], KIND one of {', '.join(KINDS)}")
    return name, (kind, int(count or 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, action="append", help="port to listen on (repeat for a second origin); default: two random ports")
    parser.add_argument("--fail", type=parse_failure, action="append", default=[], help="NAME=KIND[:COUNT]")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until interrupted)")
    args = parser.parse_args()
    provider = ScriptedByApi(dict(args.fail))
    provider.start(ports=args.port or [0, 0])
    print(" ".join(f"http://127.0.0.1:{port}" for port in provider.ports), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait(args.seconds or None)
    provider.stop()


if __name__ == "__main__":
    main()
