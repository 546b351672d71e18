"""What a long continuation costs, through a real mitmdump: as much as an uncut answer.

The same 64 MiB of text (1 KiB deltas) is streamed twice: once uncut, once as
the continuation that finishes an answer cut after two words.  The peak
memory of the real mitmdump process (VmHWM) may grow by the continuation no
more than a user would notice next to the uncut answer's (docs/security.md).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLIENT_SECRET
from tests.support import wire
from tests.support.fake_provider import RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, mitmdump_on
from tests.test_load import memory_kib

RULES = """\
version: 1
defaults: {{retries: 0, headers_timeout_s: 10, idle_timeout_s: 10, pre_answer_keepalive_s: 0}}
routes:
  - name: long
    match: {{path: /m-primary/v1/chat/completions}}
    continue_after_cut: [prefill]
    upstreams:
      - {{name: m-primary, url: original}}
      - {{name: m-backup, url: "http://127.0.0.1:{port}/m-backup/v1/chat/completions", prefill: true}}
"""
DELTAS = 64 * 1024  # of 1 KiB each: 64 MiB of text
PIECE = "0123456789abcdef" * 64
BATCH = 256  # frames per write of the fake provider (its own cost is not what is measured)
GROWTH_BOUND_MB = 24  # over the uncut answer's peak; every continued piece kept would take 64 MiB and more


@pytest.fixture(scope="module")
def dump(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("continuation-memory"), RULES.format(port=provider.ports[1])) as proxy:
        yield proxy


def long_answer(cid: str, *, lead: tuple[str, ...] = ()) -> list[bytes | float | str]:
    """A role chunk, `lead`'s words, DELTAS pieces of text in batches, the end."""
    frames: list[bytes | float | str] = [wire.chat_chunk({"role": "assistant", "content": ""}, cid=cid)]
    frames += [wire.chat_chunk({"content": word}, cid=cid) for word in lead]
    one = wire.chat_chunk({"content": PIECE}, cid=cid)
    frames += [one * BATCH] * (DELTAS // BATCH)
    frames += [wire.chat_chunk({}, "stop", cid=cid), wire.CHAT_DONE]
    return frames


def streamed_text(dump: Mitmdump, url: str) -> tuple[str, int]:
    """curl through mitmdump, its answer read as it comes: the sha256 of the text the
    client assembled, and how many `[DONE]`s it got."""
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]})
    args = ["curl", "-sS", "-N", "--max-time", "120", "-x", dump.proxy_url, "--noproxy", "", "-X", "POST",
            "--data-binary", body, "-H", "Content-Type: application/json",
            "-H", f"Authorization: Bearer {CLIENT_SECRET}", url]
    digest = hashlib.sha256()
    done = 0
    with subprocess.Popen(args, stdout=subprocess.PIPE) as curl:
        assert curl.stdout is not None
        for line in curl.stdout:
            if line.startswith(b"data: [DONE]"):
                done += 1
            elif line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices") or ():
                    digest.update((choice.get("delta") or {}).get("content", "").encode())
    return digest.hexdigest(), done


def expected(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
    return digest.hexdigest()


def test_a_long_continuation_costs_what_the_same_answer_uncut_costs(provider: FakeProvider, dump: Mitmdump) -> None:
    provider.reset()
    url = provider.url("m-primary", "/v1/chat/completions")
    provider.script("m-primary", Reply.sse(*long_answer("uncut", lead=("Hello", " wor"))))
    assert streamed_text(dump, url) == (expected("Hello wor", PIECE * DELTAS), 1)
    uncut_mb = memory_kib(dump.process.pid, "VmHWM") / 1024

    provider.script("m-primary", Reply.sse(*long_answer("orig", lead=("Hello", " wor"))[:3], RESET))
    provider.script("m-backup", Reply.sse(*long_answer("cont", lead=("ld,",))))
    got = streamed_text(dump, url)
    grown_mb = memory_kib(dump.process.pid, "VmHWM") / 1024 - uncut_mb
    print(f"peak after the uncut answer {uncut_mb:.0f} MB; the continuation raised it by {grown_mb:.1f} MB")
    assert [c.upstream for c in provider.calls] == ["m-primary", "m-primary", "m-backup"]
    assert got == (expected("Hello wor", "ld,", PIECE * DELTAS), 1)  # whole, once
    assert grown_mb < GROWTH_BOUND_MB, f"the continuation raised mitmdump's peak by {grown_mb:.0f} MB"
    assert "switchyard.continued_after_cut" in dump.log()
