"""The pure parts of finishing a cut answer: what the client has, the request for
the rest, matching regenerated text, and re-framing into the original stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchyard_core.continuation import (
    Diverged,
    NotContinuable,
    Overlap,
    continuation_body,
    read_transcript,
    reframer_for,
)
from switchyard_core.sse import FrameSplitter
from tests.support import wire

CHAT_REQUEST = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES_REQUEST = {"model": "claude", "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES_REQUEST = {"model": "gpt-4o", "stream": True, "input": "hi"}

TEXT = "Hello from primary, all good."


def frames_of(raw: bytes) -> list[Any]:
    return [frame.event for frame in FrameSplitter().feed(raw)]


def cut(frames: list[bytes], content_frames: int, lifecycle: int) -> bytes:
    return b"".join(frames[:lifecycle + content_frames])


def played(transcript: Any, overlap: Overlap, frames: list[bytes]) -> bytes:
    reframer = reframer_for(transcript, overlap)
    return b"".join(reframer.feed(event) for event in frames_of(b"".join(frames)))


def chat_text(raw: bytes) -> str:
    out = []
    for event in frames_of(raw):
        if event.comment_only or event.data == "[DONE]":
            continue
        for choice in event.json()["choices"]:
            out.append(choice["delta"].get("content") or "")
    return "".join(out)


# --- what the client has -------------------------------------------------------------


def test_chat_transcript_is_the_text_and_the_ids_of_the_stream() -> None:
    raw = cut(wire.chat_stream(TEXT, cid="chatcmpl-orig"), 3, 1)
    transcript = read_transcript("openai-chat", raw, CHAT_REQUEST)
    assert transcript.text == "Hello from primary,"
    assert (transcript.response_id, transcript.model, transcript.created) == ("chatcmpl-orig", "gpt-4o-2024-08-06", 1727346168)


AZURE_FILTER = wire.data({"choices": [], "created": 0, "id": "", "model": "", "object": "",
                          "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]})


def test_an_azure_continuation_carries_the_answers_ids_not_the_prompt_filter_chunks() -> None:
    sent = AZURE_FILTER + cut(wire.chat_stream(TEXT, cid="chatcmpl-azure"), 3, 1)
    transcript = read_transcript("openai-chat", sent, CHAT_REQUEST)
    out = played(transcript, Overlap("", strict=False), [AZURE_FILTER, *wire.chat_stream(" all good.", cid="other")])
    chunks = [e.json() for e in frames_of(out) if e.data != "[DONE]"]
    assert {(c["id"], c["model"], c["created"]) for c in chunks} == {("chatcmpl-azure", "gpt-4o-2024-08-06", 1727346168)}
    assert chat_text(sent) + chat_text(out) == TEXT


def test_responses_transcript_knows_item_indexes_and_the_last_sequence_number() -> None:
    raw = cut(wire.responses_stream(TEXT, rid="resp_orig"), 2, 4)
    transcript = read_transcript("openai-responses", raw, RESPONSES_REQUEST)
    assert (transcript.text, transcript.response_id, transcript.item_id) == ("Hello from", "resp_orig", "msg_1")
    assert (transcript.output_index, transcript.content_index, transcript.sequence_number) == (0, 0, 5)


def test_anthropic_transcript_knows_the_message_and_its_text_block() -> None:
    raw = cut(wire.anthropic_stream(TEXT, mid="msg_orig"), 1, 3)
    transcript = read_transcript("anthropic-messages", raw, MESSAGES_REQUEST)
    assert (transcript.text, transcript.response_id, transcript.content_index) == ("Hello", "msg_orig", 0)


def tool_call_chunks() -> bytes:
    return (wire.CHAT_ROLE
            + wire.chat_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                               "function": {"name": "get_weather", "arguments": ""}}]})
            + wire.chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"loc"}}]}))


@pytest.mark.parametrize("api,raw,request_body,reason", [
    ("openai-chat", tool_call_chunks(), CHAT_REQUEST, "a tool call"),
    ("openai-chat", wire.CHAT_ROLE + wire.chat_chunk({"reasoning_content": "hmm"}), CHAT_REQUEST, "reasoning"),
    ("openai-chat", wire.CHAT_ROLE + wire.chat_chunk({"refusal": "no"}), CHAT_REQUEST, "a refusal"),
    ("openai-chat", wire.CHAT_ROLE + wire.chat_chunk({"content": "Hi"}), {**CHAT_REQUEST, "n": 2}, "n > 1"),
    ("openai-chat", wire.CHAT_ROLE + wire.chat_chunk({"content": "Hi"}), {**CHAT_REQUEST, "logprobs": True}, "logprobs"),
    ("openai-chat", wire.CHAT_ROLE + wire.chat_chunk({"content": "Hi"}) + wire.chat_chunk({}, "stop"), CHAT_REQUEST,
     "ended"),
    ("openai-chat", wire.CHAT_ROLE, CHAT_REQUEST, "no plain text"),
    ("anthropic-messages",
     wire.event("message_start", {"type": "message_start", "message": {"id": "m"}})
     + wire.event("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "thinking", "thinking": ""}})
     + wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "thinking_delta", "thinking": "hm"}}),
     MESSAGES_REQUEST, "thinking"),
    ("anthropic-messages",
     wire.event("message_start", {"type": "message_start", "message": {"id": "m"}})
     + wire.event("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}})
     + wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "input_json_delta", "partial_json": "{"}}),
     MESSAGES_REQUEST, "tool_use"),
    ("openai-responses", cut(wire.responses_stream(TEXT), 2, 4), {**RESPONSES_REQUEST, "top_logprobs": 2}, "logprobs"),
    ("openai-responses",
     wire.event("response.created", {"type": "response.created", "sequence_number": 0, "response": {"id": "r"}})
     + wire.event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                                 "output_index": 0, "item": {"id": "fc_1", "type": "function_call"}})
     + wire.event("response.function_call_arguments.delta",
                  {"type": "response.function_call_arguments.delta", "sequence_number": 2, "item_id": "fc_1",
                   "delta": "{"}),
     RESPONSES_REQUEST, "function_call"),
    ("openai-chat", wire.CHAT_ROLE + b'data: {"id":"c","choi', CHAT_REQUEST, "part of a frame"),
])
def test_only_plain_text_continues(api: str, raw: bytes, request_body: dict[str, Any], reason: str) -> None:
    with pytest.raises(NotContinuable) as caught:
        read_transcript(api, raw, request_body)
    assert reason in caught.value.reason


# --- the continuation request --------------------------------------------------------


def test_prefill_for_chat_ends_with_the_partial_text_and_carries_the_upstreams_keys() -> None:
    wanted = continuation_body("openai-chat", "prefill", json.dumps(CHAT_REQUEST).encode(), "Hello from",
                               prefill_body={"continue_final_message": True, "add_generation_prompt": False},
                               prefill_message={"prefix": True})
    assert wanted is not None and wanted.echo == ""
    body = json.loads(wanted.body)
    assert body["messages"] == [*CHAT_REQUEST["messages"], {"role": "assistant", "content": "Hello from", "prefix": True}]
    assert (body["continue_final_message"], body["add_generation_prompt"], body["stream"]) == (True, False, True)


def test_prefill_for_anthropic_leaves_trailing_whitespace_to_the_echo() -> None:
    wanted = continuation_body("anthropic-messages", "prefill", json.dumps(MESSAGES_REQUEST).encode(), "Hello from ")
    assert wanted is not None and wanted.echo == " "
    assert json.loads(wanted.body)["messages"][-1] == {"role": "assistant", "content": "Hello from"}


def test_prefill_continues_an_assistant_message_the_client_prefilled_itself() -> None:
    request = {**MESSAGES_REQUEST, "messages": [*MESSAGES_REQUEST["messages"], {"role": "assistant", "content": "{"}]}
    wanted = continuation_body("anthropic-messages", "prefill", json.dumps(request).encode(), '"a": 1')
    assert wanted is not None
    assert json.loads(wanted.body)["messages"][-1] == {"role": "assistant", "content": '{"a": 1'}


def test_a_responses_prefill_ends_the_input_with_the_partial_text_and_regenerate_is_the_request_as_it_was() -> None:
    original = json.dumps(RESPONSES_REQUEST).encode()
    prefill = continuation_body("openai-responses", "prefill", original, "Hello")
    assert prefill is not None and json.loads(prefill.body) == {**RESPONSES_REQUEST, "input": [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}]}
    assert continuation_body("openai-responses", "prefill", json.dumps({**RESPONSES_REQUEST, "input": 3}).encode(),
                             "Hello") is None
    regenerated = continuation_body("openai-responses", "regenerate", original, "Hello")
    assert regenerated is not None and regenerated.body == original


# --- matching ------------------------------------------------------------------------


@given(st.text(min_size=1), st.text(), st.lists(st.integers(min_value=1, max_value=7)))
def test_regenerated_text_that_begins_with_the_sent_text_forwards_exactly_the_rest(sent: str, rest: str,
                                                                                  sizes: list[int]) -> None:
    whole, pieces, at = sent + rest, [], 0
    for size in sizes:
        pieces.append(whole[at:at + size])
        at += size
    pieces.append(whole[at:])
    overlap = Overlap(sent, strict=True)
    forwarded = "".join(overlap.take(piece) for piece in pieces if piece)
    assert overlap.covered and forwarded == rest


def test_regenerated_text_that_differs_is_dropped_with_how_far_it_matched() -> None:
    overlap = Overlap("Hello from primary", strict=True)
    assert overlap.take("Hello ") == ""
    with pytest.raises(Diverged) as caught:
        overlap.take("there")
    assert (caught.value.matched, caught.value.expected) == (6, 18)


def test_a_regenerated_answer_shorter_than_the_sent_text_diverges() -> None:
    overlap = Overlap("Hello from", strict=True)
    overlap.take("Hello")
    with pytest.raises(Diverged):
        overlap.ended()


def test_a_prefills_echo_is_skipped_only_as_far_as_it_matches() -> None:
    assert Overlap(" ", strict=False).take(" world") == "world"
    assert Overlap(" ", strict=False).take("world") == "world"


# --- re-framing ----------------------------------------------------------------------


def test_chat_continuation_carries_the_original_ids_and_no_second_role_chunk() -> None:
    sent = cut(wire.chat_stream(TEXT, cid="chatcmpl-orig"), 3, 1)
    transcript = read_transcript("openai-chat", sent, CHAT_REQUEST)
    out = played(transcript, Overlap("", strict=False), wire.chat_stream(" all good.", cid="chatcmpl-other"))
    events = frames_of(out)
    assert events[-1].data == "[DONE]"
    chunks = [e.json() for e in events[:-1]]
    assert {c["id"] for c in chunks} == {"chatcmpl-orig"}
    assert not any(ch["delta"].get("role") for c in chunks for ch in c["choices"])
    assert chat_text(sent) + chat_text(out) == TEXT
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"]][-1] == "stop"
    assert "usage" in chunks[-1]


def test_chat_regenerate_forwards_only_what_follows_the_sent_text() -> None:
    sent = cut(wire.chat_stream(TEXT), 2, 1)
    transcript = read_transcript("openai-chat", sent, CHAT_REQUEST)
    out = played(transcript, Overlap(transcript.text, strict=True), wire.chat_stream(TEXT, cid="chatcmpl-again"))
    assert chat_text(sent) + chat_text(out) == TEXT


def test_chat_regenerate_that_diverges_raises_before_anything_is_forwarded() -> None:
    sent = cut(wire.chat_stream(TEXT), 3, 1)
    transcript = read_transcript("openai-chat", sent, CHAT_REQUEST)
    reframer = reframer_for(transcript, Overlap(transcript.text, strict=True))
    out = []
    with pytest.raises(Diverged) as caught:
        for event in frames_of(b"".join(wire.chat_stream("Hello from backup, all good."))):
            out.append(reframer.feed(event))
    assert b"".join(out) == b"" and caught.value.matched == len("Hello from ")


def test_responses_regenerate_keeps_ids_indexes_and_counts_sequence_numbers_on() -> None:
    sent = cut(wire.responses_stream(TEXT, rid="resp_orig"), 2, 4)
    transcript = read_transcript("openai-responses", sent, RESPONSES_REQUEST)
    again = [f.replace(b'"msg_1"', b'"msg_other"') for f in wire.responses_stream(TEXT, rid="resp_other")]
    out = played(transcript, Overlap(transcript.text, strict=True), again)
    events = [e.json() for e in frames_of(out)]
    kinds = [e["type"] for e in events]
    assert "response.created" not in kinds and "response.output_item.added" not in kinds
    assert kinds[-1] == "response.completed" and events[-1]["response"]["id"] == "resp_orig"
    assert events[-1]["response"]["output"][0]["id"] == "msg_1"
    assert [e["sequence_number"] for e in events] == list(range(6, 6 + len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert transcript.text + deltas == TEXT
    assert {e["item_id"] for e in events if "item_id" in e} == {"msg_1"}


def test_anthropic_prefill_continuation_lands_in_the_original_text_block() -> None:
    sent = cut(wire.anthropic_stream(TEXT, mid="msg_orig"), 2, 3)
    transcript = read_transcript("anthropic-messages", sent, MESSAGES_REQUEST)
    assert transcript.text == "Hello from"
    continuation = wire.anthropic_stream(" primary, all good.", mid="msg_other")
    continuation = [f.replace(b'"index":0', b'"index":2') for f in continuation]  # its own numbering
    out = played(transcript, Overlap("", strict=False), continuation)
    events = [e.json() for e in frames_of(out)]
    kinds = [e["type"] for e in events]
    assert "message_start" not in kinds and "content_block_start" not in kinds
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert {e["index"] for e in events if "index" in e} == {0}
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert transcript.text + text == TEXT


def test_anthropic_prefill_that_ended_in_whitespace_never_shows_it_twice() -> None:
    frames = wire.anthropic_stream("Hello from primary", mid="msg_orig")
    sent = b"".join(frames[:3]) + wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                                     "delta": {"type": "text_delta", "text": "Hello "}})
    transcript = read_transcript("anthropic-messages", sent, MESSAGES_REQUEST)
    wanted = continuation_body("anthropic-messages", "prefill", json.dumps(MESSAGES_REQUEST).encode(), transcript.text)
    assert wanted is not None and json.loads(wanted.body)["messages"][-1]["content"] == "Hello"
    for continued in (" from primary", "from primary"):  # the model repeats the space, or does not
        out = played(transcript, Overlap(wanted.echo, strict=False), wire.anthropic_stream(continued, mid="m2"))
        text = "".join(e.json()["delta"]["text"] for e in frames_of(out) if e.json()["type"] == "content_block_delta")
        assert transcript.text + text == "Hello from primary"


def test_an_emoji_split_across_two_frames_is_forwarded_as_it_came() -> None:
    """Half of a surrogate pair per frame (`\\ud83d`, then `\\ude00`) has no UTF-8 of its
    own: such a frame goes out escaped, the text it holds unchanged."""
    sent = cut(wire.chat_stream(TEXT), 1, 1)
    transcript = read_transcript("openai-chat", sent, CHAT_REQUEST)
    halves = [b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" \\ud83d"},"finish_reason":null}]}\n\n',
              b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"\\ude00!"},"finish_reason":null}]}\n\n']
    continuation = wire.chat_stream("", cid="c")
    out = played(transcript, Overlap("", strict=False), [continuation[0], *halves, *continuation[2:]])
    assert chat_text(out) == " \ud83d\ude00!"
    assert frames_of(out)[-1].data == "[DONE]"


def test_a_prefill_of_text_that_ends_in_half_an_emoji_is_a_request_all_the_same() -> None:
    wanted = continuation_body("openai-chat", "prefill", json.dumps(CHAT_REQUEST).encode(), "Hi \ud83d")
    assert wanted is not None
    assert json.loads(wanted.body)["messages"][-1] == {"role": "assistant", "content": "Hi \ud83d"}


def test_a_chat_continuation_with_a_second_choice_forwards_only_the_first() -> None:
    """A prefill_body that asks for `n: 2`, or a provider that sends more than asked:
    the second choice's text never lands in the client's one."""
    sent = cut(wire.chat_stream(TEXT, cid="chatcmpl-orig"), 3, 1)
    transcript = read_transcript("openai-chat", sent, CHAT_REQUEST)
    first = wire.chat_stream(" all good.", cid="c")
    second = [f.replace(b'"index":0', b'"index":1').replace(b"good", b"BAD!") for f in first[1:-3]]
    out = played(transcript, Overlap("", strict=False), [first[0], *[x for pair in zip(first[1:-3], second)
                                                                    for x in pair], *first[-3:]])
    assert chat_text(sent) + chat_text(out) == TEXT


# --- a Responses answer that reasoned before its text ---------------------------------

EMPTY_THOUGHT = wire.Reasoning("rs_empty", encrypted_content="gAAAA-empty")
THOUGHT = wire.Reasoning("rs_orig", ("**Greeting** the user warmly.",), encrypted_content="gAAAA-orig")
CODEX_REQUEST = {"model": "gpt-5", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
                 "instructions": "Be brief.",
                 "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}


def reasoned(text: str, *thoughts: wire.Reasoning, rid: str = "resp_orig", item_id: str = "msg_1") -> list[bytes]:
    return wire.responses_stream(text, rid=rid, reasoning=thoughts, item_id=item_id)


def cut_in_text(frames: list[bytes], words: int) -> bytes:
    return b"".join(frames[:wire.first_text_frame(frames) + words])


def test_a_responses_transcript_keeps_the_reasoning_items_the_client_got_whole() -> None:
    sent = cut_in_text(reasoned(TEXT, EMPTY_THOUGHT, THOUGHT), 2)
    transcript = read_transcript("openai-responses", sent, CODEX_REQUEST)
    assert (transcript.text, transcript.item_id, transcript.output_index) == ("Hello from", "msg_1", 2)
    assert transcript.reasoning == (EMPTY_THOUGHT.item(), THOUGHT.item())
    assert transcript.reasoning[1]["summary"] == [{"type": "summary_text", "text": "**Greeting** the user warmly."}]


def thought_open(frames: list[bytes]) -> bytes:
    """Everything up to the reasoning item's `done`, which never came."""
    return b"".join(frames[:next(i for i, f in enumerate(frames) if b'"response.output_item.done"' in f)])


def thought_done(frames: list[bytes]) -> bytes:
    """Everything up to the reasoning item's `done`, and that."""
    return b"".join(frames[:next(i for i, f in enumerate(frames) if b'"response.output_item.done"' in f) + 1])


@pytest.mark.parametrize("raw,reason", [
    (thought_open(reasoned(TEXT, THOUGHT)), "inside a reasoning item"),  # in its summary's text
    (thought_open(reasoned(TEXT, EMPTY_THOUGHT)), "inside a reasoning item"),  # added, never done
    # a message that begins before the reasoning item ended
    (thought_open(reasoned(TEXT, THOUGHT)) + reasoned(TEXT)[2], "response.output_item.added inside a reasoning item"),
    (b"".join(reasoned(TEXT, THOUGHT)[:-4]) + wire.event(
        "response.output_item.added", {"type": "response.output_item.added", "sequence_number": 40,
                                       "output_index": 1, "item": {"id": "rs_2", "type": "reasoning", "summary": []}}),
     "more than one output item"),  # reasoning after the text began
    (thought_done(reasoned("", THOUGHT)), "no message item"),  # the reasoning is all the client has
    (thought_done(reasoned("", THOUGHT)) + wire.event(
        "response.output_item.added", {"type": "response.output_item.added", "sequence_number": 40, "output_index": 1,
                                       "item": {"id": "fc_1", "type": "function_call", "arguments": ""}})
     + wire.event("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta",
                                                             "sequence_number": 41, "item_id": "fc_1", "delta": "{"}),
     "function_call"),
])
def test_a_cut_in_or_around_reasoning_that_is_not_plain_text_after_it_is_not_continued(raw: bytes, reason: str) -> None:
    with pytest.raises(NotContinuable) as caught:
        read_transcript("openai-responses", raw, CODEX_REQUEST)
    assert reason in caught.value.reason


def test_a_responses_prefill_carries_the_finished_reasoning_then_the_partial_text() -> None:
    sent = cut_in_text(reasoned(TEXT, EMPTY_THOUGHT, THOUGHT), 2)
    transcript = read_transcript("openai-responses", sent, CODEX_REQUEST)
    wanted = continuation_body("openai-responses", "prefill", json.dumps(CODEX_REQUEST).encode(), transcript.text,
                               prefill_body={"reasoning": {"effort": "low"}}, prefill_message={"phase": "draft"},
                               reasoning=transcript.reasoning)
    assert wanted is not None and wanted.echo == ""
    body = json.loads(wanted.body)
    assert body["input"] == [
        *CODEX_REQUEST["input"],
        {"type": "reasoning", "id": "rs_empty", "summary": [], "encrypted_content": "gAAAA-empty"},
        {"type": "reasoning", "id": "rs_orig", "summary": [{"type": "summary_text", "text": "**Greeting** the user warmly."}],
         "encrypted_content": "gAAAA-orig"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello from"}],
         "phase": "draft"},
    ]
    assert {k: v for k, v in body.items() if k != "input"} == {
        **{k: v for k, v in CODEX_REQUEST.items() if k != "input"}, "reasoning": {"effort": "low"}}


def test_reasoning_without_encrypted_content_is_carried_by_id_only_where_it_was_stored() -> None:
    plain = wire.Reasoning("rs_stored", ("thinking",))
    sent = cut_in_text(reasoned(TEXT, plain), 1)
    request = {**RESPONSES_REQUEST, "model": "o4-mini"}
    transcript = read_transcript("openai-responses", sent, request)
    partial = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}
    stored = continuation_body("openai-responses", "prefill", json.dumps(request).encode(), "Hello",
                               reasoning=transcript.reasoning)
    assert stored is not None and json.loads(stored.body)["input"] == [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_stored", "summary": [{"type": "summary_text", "text": "thinking"}]}, partial]
    # store: false keeps nothing to find it by: the upstream reasons again instead
    unstored = continuation_body("openai-responses", "prefill", json.dumps({**request, "store": False}).encode(),
                                 "Hello", reasoning=transcript.reasoning)
    assert unstored is not None and json.loads(unstored.body)["input"] == [{"role": "user", "content": "hi"}, partial]


def test_a_responses_prefill_continues_an_assistant_message_the_client_prefilled_itself() -> None:
    request = {**RESPONSES_REQUEST, "input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]}
    wanted = continuation_body("openai-responses", "prefill", json.dumps(request).encode(), '"a": 1')
    assert wanted is not None
    assert json.loads(wanted.body)["input"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": '{"a": 1'}]


def client_events(sent: bytes, out: bytes) -> list[dict[str, Any]]:
    return [e.json() for e in frames_of(sent + out) if not e.comment_only]


def test_a_prefilled_continuation_that_reasons_again_shows_the_client_only_the_rest_of_its_text() -> None:
    sent = cut_in_text(reasoned(TEXT, EMPTY_THOUGHT, THOUGHT), 2)
    transcript = read_transcript("openai-responses", sent, CODEX_REQUEST)
    again = wire.Reasoning("rs_cont", ("Continuing the greeting.",), encrypted_content="gAAAA-cont")
    out = played(transcript, Overlap("", strict=False),
                 reasoned(" primary, all good.", again, rid="resp_cont", item_id="msg_cont"))
    got = client_events(sent, out)
    assert b"rs_cont" not in out and b"Continuing" not in out and b"resp_cont" not in out and b"msg_cont" not in out
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    kinds = [e["type"] for e in got]
    for once in ("response.created", "response.content_part.added", "response.output_text.done",
                 "response.content_part.done", "response.completed"):
        assert kinds.count(once) == 1, kinds
    assert kinds.count("response.output_item.added") == 3 and kinds.count("response.output_item.done") == 3
    assert {e["output_index"] for e in got if e["type"].startswith("response.output_text")} == {2}
    items = [e for e in got if e["type"] in ("response.output_item.added", "response.output_item.done")]
    assert [(e["output_index"], e["item"]["id"]) for e in items] == [
        (0, "rs_empty"), (0, "rs_empty"), (1, "rs_orig"), (1, "rs_orig"), (2, "msg_1"), (2, "msg_1")]
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == TEXT
    # every `done` says the whole text, as if one upstream had written it
    assert [e["text"] for e in got if e["type"] == "response.output_text.done"] == [TEXT]
    assert [e["part"]["text"] for e in got if e["type"] == "response.content_part.done"] == [TEXT]
    assert items[-1]["item"]["content"][0]["text"] == TEXT
    completed = got[-1]["response"]
    assert completed["id"] == "resp_orig"
    assert completed["output"] == [EMPTY_THOUGHT.item(), THOUGHT.item(), {**items[-1]["item"]}]


def test_a_regenerated_answer_that_reasons_again_is_matched_on_its_text_alone() -> None:
    sent = cut_in_text(reasoned(TEXT, THOUGHT), 3)
    transcript = read_transcript("openai-responses", sent, CODEX_REQUEST)
    again = reasoned(TEXT, wire.Reasoning("rs_again", ("Other thoughts.",)), rid="resp_again", item_id="msg_again")
    out = played(transcript, Overlap(transcript.text, strict=True), again)
    got = client_events(sent, out)
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == TEXT
    assert b"rs_again" not in out
    assert got[-1]["response"]["output"][0] == THOUGHT.item()
    with pytest.raises(Diverged):  # its text is what is matched: other text is another answer
        played(transcript, Overlap(transcript.text, strict=True), reasoned("Hello there", THOUGHT, rid="r2"))


def test_a_plain_answer_continued_by_one_that_reasons_gets_no_reasoning_item() -> None:
    sent = cut(wire.responses_stream(TEXT, rid="resp_orig"), 2, 4)
    transcript = read_transcript("openai-responses", sent, RESPONSES_REQUEST)
    out = played(transcript, Overlap("", strict=False),
                 reasoned(" primary, all good.", THOUGHT, rid="resp_cont", item_id="msg_cont"))
    got = client_events(sent, out)
    assert b"rs_orig" not in out
    assert {e["output_index"] for e in got if "output_index" in e} == {0}
    assert [item["id"] for item in got[-1]["response"]["output"]] == ["msg_1"]
    assert got[-1]["response"]["output"][0]["content"][0]["text"] == TEXT


@given(st.integers(min_value=1, max_value=len(TEXT.split(" ")) - 1), st.integers(0, 2), st.integers(0, 2),
       st.booleans())
def test_any_cut_after_reasoning_is_joined_into_one_stream(words: int, before: int, again: int, strict: bool) -> None:
    """Wherever the text was cut, however many reasoning items the original and the
    continuation had: the client's text is whole, its sequence numbers run without a
    gap, every event of the message has its output_index, and the final output is
    what it streamed."""
    thoughts = [wire.Reasoning(f"rs_{i}", (f"thought {i}",), encrypted_content=f"enc_{i}") for i in range(before)]
    sent = cut_in_text(reasoned(TEXT, *thoughts), words)
    transcript = read_transcript("openai-responses", sent, CODEX_REQUEST)
    rest = TEXT if strict else TEXT[len(transcript.text):]
    theirs = [wire.Reasoning(f"rs_new_{i}", (f"other {i}",)) for i in range(again)]
    out = played(transcript, Overlap(transcript.text if strict else "", strict=strict),
                 reasoned(rest, *theirs, rid="resp_new", item_id="msg_new"))
    got = client_events(sent, out)
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == TEXT
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert {e["output_index"] for e in got if e.get("item_id") == "msg_1"} == {before}
    assert b"rs_new" not in out and b"msg_new" not in out
    final = got[-1]["response"]
    assert [item["id"] for item in final["output"]] == [*(t.id for t in thoughts), "msg_1"]
    assert final["output"][-1]["content"][0]["text"] == TEXT
