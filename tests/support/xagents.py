"""Beds for the real agents falling back to an upstream of another API (issue 25): a fake
provider whose primary is overloaded on every answer, a backup that speaks another API
(and, for Claude Code's tool-using task, decides its answer by the request's messages, as
a model would), and a real mitmdump in reverse mode in front of both.

The fake's upstreams are path prefixes, as in tests/support/fake_provider.py: `primary`
on its first port, the backup on its second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support import wire
from tests.support.client_bed import OFF_LOOPBACK, ClientBed
from tests.support.fake_provider import Call, FakeProvider, Reply, failing_reply, is_api_request
from tests.support.mitm import start_mitmdump

BACKUP_KEY = "sk-xagents-backup-KEY-5150"
READ_CALL_ID = "call_Read0000000000000000000001"


class OverloadedPrimary(FakeProvider):
    """`primary` is overloaded on every answer (in its own API's shape, `kind`); side
    requests (HEAD, models, Gemini CLI's router call) are answered."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        upstream, _, rest = request.path.lstrip("/").partition("/")
        if upstream == "primary" and is_api_request(request.method, "/" + rest):
            self.script(upstream, failing_reply(self.kind, wire.api_of("/" + rest)))
        return await super()._handle(request)


class ReadingChatBackup(OverloadedPrimary):
    """An OpenAI Chat backup that does a reading task as a model would: asked with a `Read`
    tool and no result yet, it calls `Read` on `file_path`; once the request carries that
    call's result (a `tool` message naming the call's id), it answers from the file's text
    (`answer_from(text)`)."""

    def __init__(self, file_path: Path, secret: str) -> None:
        super().__init__("sse_529")
        self.file_path = file_path
        self.secret = secret

    def answer(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        results = [m for m in messages if m.get("role") == "tool" and m.get("tool_call_id") == READ_CALL_ID]
        if results:
            text = json.dumps(results[-1].get("content"))
            return Reply.sse(*wire.chat_stream(self.answer_text(self.secret in text)))
        tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "Read" in tools:
            arguments = json.dumps({"file_path": str(self.file_path)})
            return Reply.sse(*wire.chat_tool_stream("Read", arguments, call_id=READ_CALL_ID))
        return Reply.sse(*wire.chat_stream("I can only read files."))

    def answer_text(self, found: bool) -> str:
        return f"The note says the code word is {self.secret}." if found else "The file did not say."

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        upstream, _, rest = request.path.lstrip("/").partition("/")
        if upstream == "gpt" and request.method == "POST" and rest.endswith("chat/completions"):
            self.script(upstream, self.answer(json.loads(await request.read())))
        return await super()._handle(request)


@contextmanager
def agent_bed(tmp: Path, provider: FakeProvider, routes: str, env: dict[str, str] | None = None) -> Iterator[ClientBed]:
    """`provider` started, a mitmdump in reverse mode at its first port with `routes`
    (`{p1}`, `{p2}`: its two ports), stopped at the end."""
    provider.start()
    rules = tmp / "rules.yaml"
    rules.write_text("version: 1\ndefaults: {backoff_ms: 1, pre_answer_keepalive_s: 0, headers_timeout_s: 10, "
                     "max_skip_s: 0, unreachable_skip_s: 0}\nroutes:\n"
                     + routes.format(p1=provider.ports[0], p2=provider.ports[1]))
    dump = start_mitmdump(rules, tmp / "mitmdump.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                          env={"SWY_XAGENTS_KEY": BACKUP_KEY, **(env or {})},
                          extra_args=["--set", f"block_list={OFF_LOOPBACK}"])
    try:
        yield ClientBed(provider, dump, tmp)
    finally:
        dump.stop()
        provider.stop()


def posts(bed: ClientBed, upstream: str) -> list[Call]:
    """The API requests `upstream` got (not HEAD, models, a Gemini router's call)."""
    return [c for c in bed.provider.calls_to(upstream) if is_api_request(c.method, c.path)]
