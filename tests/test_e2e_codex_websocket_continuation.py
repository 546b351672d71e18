"""The real Codex CLI over WebSocket (its built-in provider), through a mitmdump whose
route finishes cut answers: the upstream closes the WebSocket in the text of a
reasoning answer, Switchyard asks for the rest over HTTP (a prefill carrying the
finished reasoning back), and Codex prints the whole answer once, never
re-sending the turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mitm import mitmdump_on
from tests.support.ws_provider import CLOSE, WsProvider, event, warm_up_turn
from tests.test_e2e_codex_websocket import codex

RULES = """\
version: 1
defaults: {retries: 0, backoff_ms: 1, idle_timeout_s: 5}
routes:
  - name: codex
    match: {path: /v1/responses}
    continue_after_cut: [prefill, regenerate]
    upstreams:
      - {name: primary, url: original, prefill: true}
"""

WHOLE = "Switchyard finished this WebSocket answer after the cut, every word of it once."
SENT = WHOLE[:30]
THOUGHT = {"id": "rs_codex", "type": "reasoning", "summary": [{"type": "summary_text", "text": "**Greeting**"}],
           "encrypted_content": "gAAAAB-codex-thought"}


def answer(rid: str, text: str, thought: dict[str, object], *, cut: bool = False) -> list[str | float]:
    """A reasoning answer as OpenAI streams it; `cut`: only up to `SENT`, then the close."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    item_id = f"msg_{rid}"
    where = {"item_id": item_id, "output_index": 1, "content_index": 0}
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
    head = [
        event("response.created", sequence_number=0, response=response),
        event("response.output_item.added", sequence_number=1, output_index=0, item={**thought, "summary": []}),
        event("response.output_item.done", sequence_number=2, output_index=0, item=thought),
        event("response.output_item.added", sequence_number=3, output_index=1,
              item={**item, "status": "in_progress", "content": []}),
        event("response.content_part.added", sequence_number=4, **where, part={**part, "text": ""}),
    ]
    if cut:
        return [*head, event("response.output_text.delta", sequence_number=5, **where, delta=SENT[:12]),
                event("response.output_text.delta", sequence_number=6, **where, delta=SENT[12:]), CLOSE]
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 15}
    return [
        *head,
        event("response.output_text.delta", sequence_number=5, **where, delta=text),
        event("response.output_text.done", sequence_number=6, **where, text=text),
        event("response.content_part.done", sequence_number=7, **where, part=part),
        event("response.output_item.done", sequence_number=8, output_index=1, item=item),
        event("response.completed", sequence_number=9,
              response={**response, "status": "completed", "output": [thought, item], "usage": usage}),
    ]


@pytest.fixture
def primary() -> Iterator[WsProvider]:
    provider = WsProvider().start()
    yield provider
    provider.stop()


def test_codex_over_websocket_prints_an_answer_cut_in_its_text_whole_and_once(tmp_path: Path,
                                                                            primary: WsProvider) -> None:
    again = {"id": "rs_again", "type": "reasoning", "summary": [], "encrypted_content": "gAAAAB-again"}
    primary.script(warm_up_turn("resp_warm"), answer("resp_cut", WHOLE, THOUGHT, cut=True),
                   answer("resp_rest", WHOLE[len(SENT):], again))  # the last: the POSTed prefill's answer
    with mitmdump_on(tmp_path, RULES, reverse_target=f"http://127.0.0.1:{primary.port}") as dump:
        run = codex(tmp_path, dump, "say hi")
        log = dump.wait_for_log("switchyard.websocket_closed")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == WHOLE
    assert "Reconnecting" not in run.stderr
    warm_up, real = (json.loads(text) for text in primary.creates)  # Codex sent its turn once
    assert warm_up["generate"] is False and real["previous_response_id"] == "resp_warm"
    assert real["store"] is False
    [asked] = (json.loads(body) for body in primary.posts)
    # the turn as HTTP (the warm-up folded in), the finished reasoning and the text Codex has after its input
    fields = {k: v for k, v in {**warm_up, **real}.items() if k not in ("type", "generate", "previous_response_id")}
    assert asked == {**fields, "stream": True, "input": [
        *warm_up.get("input", []), *real["input"],
        {"type": "reasoning", "id": "rs_codex", "summary": THOUGHT["summary"],
         "encrypted_content": THOUGHT["encrypted_content"]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": SENT}]}]}
    assert ("switchyard.continued_after_cut route=codex upstream=primary attempt=2 strategy=prefill "
            f"chars_sent={len(SENT)}") in log
    assert "switchyard.stream_cut_after_output" not in log
