"""The pure parts of finishing a cut Gemini answer: what the client has, the prefill
request, and a continuation's chunks re-framed into the original stream."""

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
from tests.support import gemini_wire

API = "google-gemini"
REQUEST = {"contents": [{"role": "user", "parts": [{"text": "say it"}]}],
           "generationConfig": {"temperature": 0}}
TEXT = "The quick brown fox jumps over the lazy dog, twice."


def frames_of(raw: bytes) -> list[Any]:
    return [frame.event for frame in FrameSplitter().feed(raw)]


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    """Every frame's `GenerateContentResponse`, as a Gemini SDK parses them (each `data:`
    line JSON, nothing else)."""
    out = []
    for event in frames_of(raw):
        assert not event.comment_only, "an SSE comment is a JSON error to google-genai"
        out.append(json.loads(event.data))
    return out


def text_of(raw: bytes) -> str:
    """What google-genai's `chunk.text` adds up to: the text parts of candidate 0, thoughts aside."""
    return "".join(part.get("text", "") for chunk in chunks_of(raw) for cand in chunk.get("candidates", [])
                   for part in cand.get("content", {}).get("parts", []) if not part.get("thought"))


def stream(text: str, response_id: str = "orig", model: str = gemini_wire.MODEL_VERSION) -> list[bytes]:
    return gemini_wire.stream(text, response_id, model)


def played(transcript: Any, overlap: Overlap, frames: list[bytes]) -> bytes:
    reframer = reframer_for(transcript, overlap)
    return b"".join(reframer.feed(event) for event in frames_of(b"".join(frames)))


def part_frame(*parts: dict[str, Any], finish: str | None = None) -> bytes:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return gemini_wire.frame({"candidates": [candidate], "modelVersion": "gemini-2.5-pro", "responseId": "orig"})


# --- what the client has -------------------------------------------------------------


def test_the_transcript_is_candidate_zeros_text_and_the_streams_ids() -> None:
    sent = b"".join(stream(TEXT)[:3])
    transcript = read_transcript(API, sent, REQUEST)
    assert transcript.text == "The quick brown"
    assert (transcript.response_id, transcript.model) == ("orig", gemini_wire.MODEL_VERSION)


def test_a_text_part_with_a_thought_signature_is_plain_text() -> None:
    sent = part_frame({"text": "Hi", "thoughtSignature": "c2ln"}) + part_frame({"text": " there", "thought": False})
    assert read_transcript(API, sent, REQUEST).text == "Hi there"


THOUGHT = part_frame({"text": "Let me think.", "thought": True})


@pytest.mark.parametrize("sent,request_body,reason", [
    (THOUGHT, REQUEST, "thinking (a thought part)"),
    (THOUGHT + part_frame({"text": "Hello"}), REQUEST, "thinking (a thought part)"),
    (part_frame({"text": "Hello"}, {"functionCall": {"name": "get_weather", "args": {}}}), REQUEST,
     "a function call"),
    (part_frame({"inlineData": {"mimeType": "image/png", "data": "iVBO"}}), REQUEST, "inline data"),
    (part_frame({"text": "Hello"}), {**REQUEST, "generationConfig": {"candidateCount": 2}}, "candidateCount > 1"),
    (part_frame({"text": "Hello"}), {**REQUEST, "generationConfig": {"responseLogprobs": True}}, "logprobs"),
    (gemini_wire.frame({"candidates": [{"content": {"parts": [{"text": "A"}]}, "index": 0},
                                       {"content": {"parts": [{"text": "B"}]}, "index": 1}]}), REQUEST,
     "several candidates"),
    (part_frame({"text": "Hello"}, finish="STOP"), REQUEST, "ended"),
    (part_frame({"text": ""}), REQUEST, "no plain text"),
    (part_frame({"text": "Hello"}) + gemini_wire.error_frame(503, "UNAVAILABLE", "busy"), REQUEST, "an error"),
])
def test_only_plain_text_in_one_candidate_continues(sent: bytes, request_body: dict[str, Any], reason: str) -> None:
    with pytest.raises(NotContinuable) as caught:
        read_transcript(API, sent, request_body)
    assert reason in caught.value.reason


# --- the request for the rest --------------------------------------------------------


def test_prefill_ends_contents_with_the_partial_text_as_the_models_turn() -> None:
    body = json.dumps(REQUEST).encode()
    asked = continuation_body(API, "prefill", body, "The quick", prefill_body={"cachedContent": "c1"},
                              prefill_message={"x-note": 1})
    assert asked is not None and asked.echo == ""
    assert json.loads(asked.body) == {**REQUEST, "cachedContent": "c1", "contents": [
        *REQUEST["contents"], {"x-note": 1, "role": "model", "parts": [{"text": "The quick"}]}]}


def test_prefill_continues_a_model_turn_the_client_prefilled_itself() -> None:
    own = {"contents": [*REQUEST["contents"], {"role": "model", "parts": [{"text": "Sure:"}]}]}
    asked = continuation_body(API, "prefill", json.dumps(own).encode(), " the fox")
    assert asked is not None
    assert json.loads(asked.body)["contents"] == [
        *REQUEST["contents"], {"role": "model", "parts": [{"text": "Sure:"}, {"text": " the fox"}]}]


def test_prefill_keeps_the_contents_built_here_whatever_prefill_body_says() -> None:
    asked = continuation_body(API, "prefill", json.dumps(REQUEST).encode(), "Hi",
                              prefill_body={"contents": []}, prefill_message={"role": "user", "parts": []})
    assert asked is not None
    assert json.loads(asked.body)["contents"][-1] == {"role": "model", "parts": [{"text": "Hi"}]}


def test_regenerate_is_the_request_as_it_was() -> None:
    body = json.dumps(REQUEST).encode()
    asked = continuation_body(API, "regenerate", body, "The quick")
    assert asked is not None and asked.body == body


# --- re-framing ----------------------------------------------------------------------


def test_a_prefilled_continuation_carries_the_original_ids_and_its_end() -> None:
    sent = b"".join(stream(TEXT)[:3])
    transcript = read_transcript(API, sent, REQUEST)
    out = played(transcript, Overlap("", strict=False), stream(TEXT[len(transcript.text):], "other", "gemini-2.5-pro"))
    chunks = chunks_of(out)
    assert {(c["responseId"], c["modelVersion"]) for c in chunks} == {("orig", gemini_wire.MODEL_VERSION)}
    assert text_of(sent + out) == TEXT
    assert [c["candidates"][0].get("finishReason") for c in chunks][-1] == "STOP"
    assert sum(1 for c in chunks if c["candidates"][0].get("finishReason")) == 1
    assert chunks[-1]["usageMetadata"] == gemini_wire.usage(len(gemini_wire.words(TEXT[len(transcript.text):])))
    assert out.endswith(b"\r\n\r\n") and b"\n\n" not in out.replace(b"\r\n\r\n", b"")


def test_a_regenerated_answer_forwards_only_what_follows_the_sent_text_even_inside_a_chunk() -> None:
    sent = part_frame({"text": "The qu"})
    transcript = read_transcript(API, sent, REQUEST)
    out = played(transcript, Overlap(transcript.text, strict=True), stream(TEXT, "again"))
    assert chunks_of(out)[0]["candidates"][0]["content"]["parts"] == [{"text": "ick"}]
    assert text_of(sent + out) == TEXT


def test_a_regenerated_answer_that_differs_raises_before_anything_is_forwarded() -> None:
    transcript = read_transcript(API, b"".join(stream(TEXT)[:3]), REQUEST)
    reframer = reframer_for(transcript, Overlap(transcript.text, strict=True))
    frames = frames_of(b"".join(stream("The quick red fox.")))
    assert reframer.feed(frames[0]) == b"" and reframer.feed(frames[1]) == b""
    with pytest.raises(Diverged) as caught:
        reframer.feed(frames[2])
    assert caught.value.matched == len("The quick ")


def test_a_regenerated_answer_with_a_function_call_first_diverges() -> None:
    transcript = read_transcript(API, part_frame({"text": "Hello"}), REQUEST)
    reframer = reframer_for(transcript, Overlap(transcript.text, strict=True))
    with pytest.raises(Diverged):
        reframer.feed(frames_of(part_frame({"functionCall": {"name": "f", "args": {}}}))[0])


def test_a_continuations_thoughts_never_reach_the_client() -> None:
    transcript = read_transcript(API, part_frame({"text": "The quick"}), REQUEST)
    rest = TEXT[len("The quick"):]
    out = played(transcript, Overlap(transcript.text, strict=True),
                 [part_frame({"text": "Planning the answer.", "thought": True}),
                  part_frame({"text": "", "thoughtSignature": "c2ln", "thought": True}), *stream(TEXT)])
    assert b"Planning" not in out and b'"thought"' not in out
    assert text_of(out) == rest


def test_a_continuation_that_is_only_the_end_gives_the_client_one_end() -> None:
    """The cut came after the last word: the regenerated answer adds only its end."""
    sent = b"".join(stream(TEXT)[:-1]) + part_frame({"text": gemini_wire.words(TEXT)[-1]})
    transcript = read_transcript(API, sent, REQUEST)
    assert transcript.text == TEXT
    out = played(transcript, Overlap(TEXT, strict=True), stream(TEXT, "again"))
    chunks = chunks_of(out)
    assert len(chunks) == 1 and chunks[0]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[0]["candidates"][0]["content"]["parts"] == [{"text": ""}]
    assert text_of(sent + out) == TEXT


def test_a_second_candidate_in_a_continuation_is_left_out() -> None:
    transcript = read_transcript(API, part_frame({"text": "The quick"}), REQUEST)
    two = gemini_wire.frame({"candidates": [
        {"content": {"parts": [{"text": " brown"}], "role": "model"}, "index": 0},
        {"content": {"parts": [{"text": " other"}], "role": "model"}, "index": 1}]})
    out = played(transcript, Overlap("", strict=False), [two])
    assert [c["index"] for c in chunks_of(out)[0]["candidates"]] == [0] and text_of(out) == " brown"


def test_usage_alone_before_the_text_is_dropped_and_after_it_forwarded() -> None:
    transcript = read_transcript(API, part_frame({"text": "Hi"}), REQUEST)
    usage = gemini_wire.frame({"usageMetadata": gemini_wire.usage(3), "responseId": "r2"})
    reframer = reframer_for(transcript, Overlap("", strict=False))
    assert reframer.feed(frames_of(usage)[0]) == b""
    reframer.feed(frames_of(part_frame({"text": " there"}))[0])
    assert chunks_of(reframer.feed(frames_of(usage)[0])) == [{"usageMetadata": gemini_wire.usage(3),
                                                               "responseId": "orig"}]


@given(st.integers(min_value=1, max_value=len(gemini_wire.words(TEXT)) - 1), st.booleans(),
       st.integers(min_value=0, max_value=4))
def test_any_cut_point_gives_the_client_the_whole_text_once(words: int, strict: bool, inside: int) -> None:
    """Wherever the text was cut (between chunks or inside one), by either strategy: what
    the client assembles from the original's chunks and the continuation's is the whole
    text, once, with one end, every chunk carrying the original's ids."""
    frames = stream(TEXT)
    head = frames[:words]
    piece = gemini_wire.words(TEXT)[words]
    split = min(inside, len(piece))
    sent = b"".join(head) + (part_frame({"text": piece[:split]}) if split else b"")
    transcript = read_transcript(API, sent, REQUEST)
    rest = TEXT[len(transcript.text):]
    continuation = stream(TEXT if strict else rest, "other", "gemini-2.5-pro")
    out = played(transcript, Overlap(transcript.text if strict else "", strict=strict), continuation)
    assert text_of(sent + out) == TEXT
    chunks = chunks_of(out)
    assert sum(1 for c in chunks for cand in c["candidates"] if cand.get("finishReason")) == 1
    assert {c["responseId"] for c in chunks} == {"orig"}
