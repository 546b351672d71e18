"""Where a continuation's text joins the client's, whatever the continuation sends (pure):
never a character twice, and text that cannot be placed is not used.  And what a
re-framer keeps of a long continuation: at most its limit, however long it runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchyard_core.continuation import Diverged, Overlap, continuation_body, overlap_for, read_transcript, reframer_for
from switchyard_core.sse import FrameSplitter, SseEvent
from tests.support import wire

CLIENT = "Hello wor"  # what the client has


def taken(overlap: Overlap, pieces: list[str]) -> str:
    out = "".join(overlap.take(piece) for piece in pieces if piece)
    overlap.ended()
    return out


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c for c in cuts if 0 < c < len(text)})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@given(st.sampled_from(["ld, fine.", "Hello world, fine.", "Hello wor" + "ld, fine."]),
       st.lists(st.integers(min_value=0, max_value=20), max_size=6))
def test_a_prefill_answer_is_placed_after_the_clients_text_however_it_is_cut_into_deltas(
        continuation: str, cuts: list[int]) -> None:
    """It goes on where the client's text ends, or restates the text it was given first."""
    assert taken(overlap_for("prefill", CLIENT, restated=CLIENT), split(continuation, cuts)) == "ld, fine."


@given(st.lists(st.integers(min_value=0, max_value=20), max_size=6))
def test_a_prefill_answer_that_begins_like_the_text_and_then_differs_is_not_placed(cuts: list[int]) -> None:
    with pytest.raises(Diverged) as caught:
        taken(overlap_for("prefill", CLIENT, restated=CLIENT), split("Hello wonderful day.", cuts))
    assert (caught.value.matched, caught.value.expected) == (8, 9)


def test_a_prefill_answer_that_stops_inside_a_restatement_is_not_placed() -> None:
    overlap = overlap_for("prefill", CLIENT, restated=CLIENT)
    assert overlap.take("Hello") == ""  # held: the client has it
    with pytest.raises(Diverged):
        overlap.ended()
    overlap = overlap_for("prefill", CLIENT, restated=CLIENT)
    overlap.take("Hel")
    with pytest.raises(Diverged):
        overlap.not_text("a tool call")


def test_anthropics_echoed_whitespace_is_skipped_whether_or_not_the_text_is_restated() -> None:
    """The client has "Hello wor " and the request "Hello wor": the echo is the space."""
    for pieces in (["world"], [" world"], ["Hello wor", " world"], ["Hello wor", "world"], ["Hello wor world"]):
        overlap = overlap_for("prefill", "Hello wor ", echo=" ", restated="Hello wor")
        assert taken(overlap, pieces) == "world", pieces
    assert taken(overlap_for("prefill", " Hi ", echo=" ", restated=" Hi"), [" ", "there"]) == "there"


def test_the_client_prefilled_answer_is_what_a_restating_provider_repeats() -> None:
    """The client ended its request with its own assistant text "Sure:"; the prefill
    request carries that and the client's text, and a restatement repeats both."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "Sure:"}]}).encode()
    wanted = continuation_body("openai-chat", "prefill", body, " here is")
    assert wanted is not None and wanted.restated == "Sure: here is"
    overlap = overlap_for("prefill", " here is", wanted.echo, wanted.restated)
    assert taken(overlap, ["Sure: here is", " the rest"]) == " the rest" and overlap.skipped == len("Sure: here is")


def test_every_api_names_the_text_its_prefill_request_ends_with() -> None:
    bodies = {"openai-chat": {"messages": [{"role": "user", "content": "hi"}]},
              "anthropic-messages": {"messages": [{"role": "user", "content": "hi"}]},
              "openai-responses": {"input": "hi"},
              "google-gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}}
    for api, body in bodies.items():
        wanted = continuation_body(api, "prefill", json.dumps(body).encode(), "Hello wor ")
        assert wanted is not None
        assert wanted.restated + wanted.echo == "Hello wor ", api


def test_regenerate_is_as_before_it_must_begin_with_all_the_client_has() -> None:
    assert taken(overlap_for("regenerate", CLIENT), ["Hello", " world"]) == "ld"
    with pytest.raises(Diverged):
        taken(overlap_for("regenerate", CLIENT), ["ld, fine."])


# --- what a re-framer keeps ---------------------------------------------------------------


def events(frames: list[bytes]) -> list[SseEvent]:
    return [frame.event for frame in FrameSplitter().feed(b"".join(frames))]


def test_a_continuation_longer_than_its_limit_keeps_none_of_its_text_and_still_ends_right() -> None:
    """Responses: past the limit, the `*.done` events say the whole text from the
    continuation's own (the client's text, then all but what the overlap skipped)."""
    original = wire.responses_stream("Hello world, fine.", rid="orig")
    raw = b"".join(original[:wire.first_text_frame(original) + 1])
    transcript = read_transcript("openai-responses", raw, {"input": "hi"})
    rest = "x" * 5000
    reframer = reframer_for(transcript, overlap_for("prefill", transcript.text, restated=transcript.text),
                            keep=len(transcript.text) + 100)
    out = b"".join(reframer.feed(event) for event in events(wire.responses_stream(transcript.text + rest, rid="c")))
    assert reframer.whole_text is None  # not kept: longer than the limit
    done: dict[str, Any] = {}
    for event in events([out]):
        data = event.json()
        if isinstance(data, dict):
            done[data.get("type", "")] = data
    assert done["response.output_item.done"]["item"]["content"][0]["text"] == transcript.text + rest
    assert done["response.completed"]["response"]["output"][-1]["content"][0]["text"] == transcript.text + rest


def test_a_continuation_within_its_limit_says_the_text_the_client_streamed() -> None:
    original = wire.chat_stream("Hello world, fine.", cid="orig")
    transcript = read_transcript("openai-chat", b"".join(original[:3]), {"messages": []})
    reframer = reframer_for(transcript, overlap_for("prefill", transcript.text, restated=transcript.text))
    for event in events(wire.chat_stream(" fine.", cid="c")):
        reframer.feed(event)
    assert reframer.whole_text == "Hello world, fine."
