"""Continuing a reasoning model's Responses answer, end to end: a real mitmdump, the
fake provider's loopback upstreams (one cuts the answer in its text after two
finished reasoning items, another continues it), and the openai SDK streaming.

The client assembles the whole text once, keeps the original's reasoning items
(their encrypted content too, which it sends back next turn), never sees the
continuation's own reasoning, and every event's `sequence_number` and
`output_index` is the one a single upstream would have sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from switchyard_core.apis import APIS
from tests.conftest import BODY_MARKER, CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, start_mitmdump

RULES = """\
version: 1
defaults:
  retries: 0
  backoff_ms: 1
  headers_timeout_s: 5
  idle_timeout_s: 0.5
  pre_answer_keepalive_s: 0
routes:
  - name: reasoning
    match: {{path: /r-primary/v1/responses}}
    continue_after_cut: [prefill, regenerate]
    upstreams:
      - {{name: r-primary, url: original}}
      - name: r-backup
        url: http://127.0.0.1:{port}/r-backup/v1/responses
        prefill: true
"""

FULL = "The quick brown fox jumps over the lazy dog, twice."
WORDS = wire.chat_words(FULL)
SENT = "".join(WORDS[:3])  # what the client has when the cut comes
REST = FULL[len(SENT):]
EMPTY = wire.Reasoning("rs_empty", encrypted_content="gAAAAB-empty-thought")
THOUGHT = wire.Reasoning("rs_orig", ("**Answering** with the pangram.",), encrypted_content="gAAAAB-orig-thought")
AGAIN = wire.Reasoning("rs_cont", ("**Continuing** where the text stopped.",), encrypted_content="gAAAAB-cont")
CUT = APIS["openai-responses"].error_event("switchyard: upstream connection broke after output", "stream_cut")
PROMPT = f"say it {BODY_MARKER}"
INPUT = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]


@pytest.fixture(scope="module")
def reasoning_mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("continuation-reasoning")
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(port=provider.ports[1]))
    dump = start_mitmdump(rules, workdir / "mitmdump.log")
    yield dump
    dump.stop()


@pytest.fixture
def renv(env: Env, reasoning_mitm: Mitmdump) -> Env:
    return Env(env.provider, reasoning_mitm, Path(reasoning_mitm.log_path).parent / "rules.yaml")


def answer(text: str, *thoughts: wire.Reasoning, ident: str) -> list[bytes]:
    return wire.responses_stream(text, rid=ident, reasoning=thoughts, item_id=f"{ident}_item")


def cut_in_text(frames: list[bytes], words: int) -> list[bytes]:
    return frames[:wire.first_text_frame(frames) + words]


def stream_with_sdk(renv: Env) -> tuple[list[Any], Any]:
    """Every event the openai SDK yielded, and its final response, for a request as
    the Codex CLI makes it (`store: false`, the reasoning's encrypted content included)."""
    client = openai.OpenAI(api_key=CLIENT_SECRET, base_url=renv.provider.url("r-primary", "/v1"), max_retries=0,
                           http_client=openai.DefaultHttpxClient(proxy=renv.mitm.proxy_url, trust_env=False))
    with client.responses.stream(model="gpt-5", input=INPUT, instructions="Answer briefly.", store=False,  # type: ignore[arg-type]
                                 include=["reasoning.encrypted_content"],
                                 reasoning={"effort": "low", "summary": "auto"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    return events, final


def upstreams(renv: Env) -> list[str]:
    return [call.upstream for call in renv.provider.calls]


def test_a_reasoning_answer_cut_in_its_text_is_finished_with_its_reasoning_carried_back(renv: Env) -> None:
    renv.provider.script("r-primary", Reply.sse(*cut_in_text(answer(FULL, EMPTY, THOUGHT, ident="orig"), 3), RESET))
    renv.provider.script("r-backup", Reply.sse(*answer(REST, AGAIN, ident="cont")))
    mark = renv.mitm.log_mark()
    events, final = stream_with_sdk(renv)

    # the text, once, and nothing of the continuation's reasoning
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == FULL
    assert "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta") == THOUGHT.summary[0]
    assert [e.text for e in events if e.type == "response.output_text.done"] == [FULL]
    # one stream's numbering: sequence numbers without a gap or a repeat, the items where they were
    assert [e.sequence_number for e in events] == list(range(len(events)))
    items = [(e.type.rsplit(".", 1)[1], e.output_index, e.item.id) for e in events
             if e.type in ("response.output_item.added", "response.output_item.done")]
    assert items == [("added", 0, "rs_empty"), ("done", 0, "rs_empty"), ("added", 1, "rs_orig"),
                     ("done", 1, "rs_orig"), ("added", 2, "orig_item"), ("done", 2, "orig_item")]
    assert {(e.output_index, e.item_id) for e in events if e.type == "response.output_text.delta"} == {(2, "orig_item")}
    assert [e.type for e in events].count("response.content_part.added") == 1
    assert [e.type for e in events].count("response.completed") == 1
    # the final response is the one the client streamed: what it sends back next turn
    assert final.id == "orig" and final.status == "completed" and final.output_text == FULL
    assert [(item.type, item.id) for item in final.output] == [
        ("reasoning", "rs_empty"), ("reasoning", "rs_orig"), ("message", "orig_item")]
    assert [item.encrypted_content for item in final.output[:2]] == [EMPTY.encrypted_content, THOUGHT.encrypted_content]

    # the continuation asked for exactly: the conversation, the finished reasoning, the partial text
    assert upstreams(renv) == ["r-primary", "r-backup"]
    original = renv.provider.calls_to("r-primary")[0].json()
    assert isinstance(original, dict) and original["input"] == INPUT
    assert renv.provider.calls_to("r-backup")[0].json() == {**original, "input": [
        *INPUT,
        {"type": "reasoning", "id": "rs_empty", "summary": [], "encrypted_content": EMPTY.encrypted_content},
        {"type": "reasoning", "id": "rs_orig", "summary": [{"type": "summary_text", "text": THOUGHT.summary[0]}],
         "encrypted_content": THOUGHT.encrypted_content},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": SENT}]},
    ]}
    log = renv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert (f"switchyard.continued_after_cut route=reasoning upstream=r-backup attempt=2 strategy=prefill "
            f"chars_sent={len(SENT)} ") in log
    assert THOUGHT.encrypted_content not in log and SENT not in log and BODY_MARKER not in log


def test_a_regenerated_reasoning_answer_is_matched_on_its_text_and_its_new_reasoning_dropped(renv: Env) -> None:
    rejected = Reply.json(400, {"error": {"type": "invalid_request_error", "code": None, "param": "input",
                                          "message": "An assistant message cannot be continued."}})
    renv.provider.script("r-primary", Reply.sse(*cut_in_text(answer(FULL, THOUGHT, ident="orig"), 3), RESET),
                         Reply.sse(*answer(FULL, AGAIN, ident="again")))
    renv.provider.script("r-backup", rejected)
    mark = renv.mitm.log_mark()
    events, final = stream_with_sdk(renv)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == FULL
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [(item.type, item.id) for item in final.output] == [("reasoning", "rs_orig"), ("message", "orig_item")]
    assert final.output_text == FULL
    assert upstreams(renv) == ["r-primary", "r-backup", "r-primary"]
    assert renv.provider.calls[2].body == renv.provider.calls[0].body  # regenerate: the request as it was
    log = renv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert "switchyard.continuation_failed route=reasoning upstream=r-backup attempt=2 strategy=prefill" in log
    assert "switchyard.continued_after_cut route=reasoning upstream=r-primary attempt=3 strategy=regenerate" in log


def curl(renv: Env) -> bytes:
    body = {"model": "gpt-5", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
            "input": INPUT}
    result = renv.curl(renv.provider.url("r-primary", "/v1/responses"), json.dumps(body).encode())
    assert result.status == 200
    return result.body


def inside_reasoning(thought: wire.Reasoning) -> list[bytes]:
    """The answer up to its reasoning item's `done`, which never comes."""
    frames = answer(FULL, thought, ident="orig")
    return frames[:next(i for i, f in enumerate(frames) if b'"response.output_item.done"' in f)]


def test_a_cut_inside_a_reasoning_item_ends_with_the_clean_error_and_nothing_is_asked(renv: Env) -> None:
    """Its summary had begun (output, so never replayed) when the stream broke."""
    sent = inside_reasoning(THOUGHT)
    renv.provider.script("r-primary", Reply.sse(*sent, RESET))
    renv.provider.script("r-backup", Reply.sse(*answer(REST, ident="cont")))
    mark = renv.mitm.log_mark()
    assert curl(renv) == b"".join(sent) + CUT
    assert upstreams(renv) == ["r-primary"]
    log = renv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    assert 'switchyard.not_continued route=reasoning upstream=r-primary reason="the cut came inside a reasoning item"' in log
