"""Continuation upstreams that misbehave, through a real mitmdump and the openai SDK.

A prefill upstream that restates the text it was given before going on (some
OpenAI-compatible servers do), or one that begins like it and goes another
way; continuation upstreams that send a role chunk and then only comments or
empty deltas.  The client never sees a character twice, and never waits on a
continuation past the bounds docs/security.md states.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, mitmdump_on

RULES = """\
version: 1
defaults: {{retries: 0, headers_timeout_s: 5, idle_timeout_s: 5, pre_answer_keepalive_s: 0}}
routes:
  - name: placed
    match: {{path: /h-primary/v1/chat/completions}}
    continue_after_cut: [prefill, regenerate]
    request_timeout_s: 20
    first_output_timeout_s: 1
    upstreams:
      - {{name: h-primary, url: original}}
      - {{name: h-backup, url: "http://127.0.0.1:{port}/h-backup/v1/chat/completions", prefill: true}}
  - name: effort
    match: {{path: /e-primary/v1/chat/completions}}
    continue_after_cut: [prefill, regenerate]
    request_timeout_s: 2
    upstreams:
      - {{name: e-primary, url: original}}
      - {{name: e-backup, url: "http://127.0.0.1:{port}/e-backup/v1/chat/completions", prefill: true}}
"""
SENT = ["Hello", " wor"]  # what the client has when the cut comes
FULL = "Hello world, fine."
ROLE = wire.chat_chunk({"role": "assistant", "content": ""}, cid="other")
PINGS = {  # what a stalling continuation sends after its role chunk, every 0.1 s for 8 s
    "comment": b": ping\n\n",
    "empty-delta": wire.chat_chunk({"content": ""}, cid="other"),
    "role-chunk": ROLE,
}


@pytest.fixture(scope="module")
def dump(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("continuation-hostile"), RULES.format(port=provider.ports[1])) as proxy:
        yield proxy


@pytest.fixture
def henv(provider: FakeProvider, dump: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, dump, Path(dump.log_path).parent / "rules.yaml")
    provider.reset()


def cut(cid: str = "orig") -> Reply:
    """The original answer: its role chunk and SENT, then a reset."""
    return Reply.sse(wire.chat_chunk({"role": "assistant", "content": ""}, cid=cid),
                     *[wire.chat_chunk({"content": word}, cid=cid) for word in SENT], RESET)


def text_reply(*pieces: str, lead: list[bytes | float] | None = None) -> Reply:
    """A stream of `pieces` as content deltas, after `lead`."""
    return Reply.sse(ROLE, *(lead or []), *[wire.chat_chunk({"content": p}, cid="other") for p in pieces],
                     wire.chat_chunk({}, "stop", cid="other"), wire.CHAT_DONE)


def sdk_text(henv: Env, prefix: str) -> tuple[str, str | None]:
    """What the openai SDK assembled, and the error its stream ended with, if any."""
    oai = openai.OpenAI(api_key=CLIENT_SECRET, base_url=henv.provider.url(prefix, "/v1"), max_retries=0,
                        timeout=30, http_client=openai.DefaultHttpxClient(proxy=henv.mitm.proxy_url, trust_env=False))
    text: list[str] = []
    try:
        for chunk in oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                                  stream=True):
            text.extend(c.delta.content or "" for c in chunk.choices)
    except openai.APIError as exc:
        return "".join(text), exc.message
    return "".join(text), None


def upstreams(henv: Env) -> list[str]:
    return [call.upstream for call in henv.provider.calls]


# --- 5: never a character twice ---------------------------------------------------------


@pytest.mark.parametrize("pieces", [["Hello", " world", ", fine."], ["Hello wor", "ld, fine."], ["Hello world, fine."]],
                         ids=["by-word", "at-the-cut", "whole"])
def test_a_prefill_answer_that_restates_the_text_it_was_given_is_placed_after_it(henv: Env,
                                                                                  pieces: list[str]) -> None:
    henv.provider.script("h-primary", cut())
    henv.provider.script("h-backup", text_reply(*pieces))
    mark = henv.mitm.log_mark()
    assert sdk_text(henv, "h-primary") == (FULL, None)  # not "Hello worHello world, fine."
    assert upstreams(henv) == ["h-primary", "h-backup"]
    line = henv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert "upstream=h-backup" in line and "strategy=prefill" in line


def test_a_prefill_answer_that_cannot_be_placed_is_not_used_and_regenerate_finishes(henv: Env) -> None:
    """It begins like the text it was given ("Hello wo…") and goes another way: as a
    continuation it would show "Hello wo" twice; as a restatement it is another answer."""
    henv.provider.script("h-primary", cut(), Reply.sse(*wire.chat_stream(FULL, cid="again")))
    henv.provider.script("h-backup", text_reply("Hello", " wonderful", " day."))
    mark = henv.mitm.log_mark()
    assert sdk_text(henv, "h-primary") == (FULL, None)
    assert upstreams(henv) == ["h-primary", "h-backup", "h-primary"]
    log = henv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    failed = next(line for line in log.splitlines() if "switchyard.continuation_failed" in line)
    assert "upstream=h-backup" in failed and "strategy=prefill" in failed
    assert 'message="the continuation restates part of the text it was given, then differs (matched 8 of 9' in failed
    assert "strategy=regenerate" in next(line for line in log.splitlines() if "continued_after_cut" in line)


# --- 6: a continuation's wait is bounded -------------------------------------------------


@pytest.mark.parametrize("ping", list(PINGS))
def test_a_continuation_that_sends_only_pings_is_given_up_at_first_output_timeout_s(henv: Env, ping: str) -> None:
    """The prefill upstream answers, then sends nothing but `ping` for 8 s before its text:
    its first continued character was due 1 s after it began, and the next strategy
    finishes the answer."""
    henv.provider.script("h-primary", cut(), Reply.sse(*wire.chat_stream(FULL, cid="again")))
    henv.provider.script("h-backup", text_reply("ld, fine.", lead=[PINGS[ping], 0.1] * 80))
    mark = henv.mitm.log_mark()
    assert sdk_text(henv, "h-primary") == (FULL, None)
    assert upstreams(henv) == ["h-primary", "h-backup", "h-primary"]
    log = henv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    failed = next(line for line in log.splitlines() if "switchyard.continuation_failed" in line)
    assert "upstream=h-backup" in failed and 'message="no continued text within 1s"' in failed
    assert "strategy=regenerate" in next(line for line in log.splitlines() if "continued_after_cut" in line)


def test_the_whole_continuation_effort_ends_request_timeout_s_after_the_cut(henv: Env) -> None:
    """Every continuation upstream stalls: the first try has the effort's whole time, no
    other try begins after it, and the client gets the original cut's error."""
    stalling = text_reply("ld, fine.", lead=[b": ping\n\n", 0.1] * 80)
    henv.provider.script("e-primary", cut(), stalling)
    henv.provider.script("e-backup", stalling)
    mark = henv.mitm.log_mark()
    text, error = sdk_text(henv, "e-primary")
    assert text == "".join(SENT) and error is not None and "upstream connection broke after output" in error
    assert upstreams(henv) == ["e-primary", "e-backup"]  # regenerate was never begun
    log = henv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    failed = next(line for line in log.splitlines() if "switchyard.continuation_failed" in line)
    assert 'message="no continued text within 2s of the cut"' in failed
