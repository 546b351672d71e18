"""The pure parts of finishing a WebSocket turn's cut answer: a message kept as the
SSE event of the same text, the turn's bounded transcript, and the answer carried
into the next turn that names the cut response."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from switchyard_core.apis import APIS
from switchyard_core.attempts.carry import fold, with_answer
from switchyard_core.attempts.client_stream import ClientStream
from switchyard_core.continuation import answer_input, read_transcript
from switchyard_core.sse import FrameSplitter, data_event
from tests.support.ws_provider import answer_turn


@given(st.text(min_size=1))
def test_a_message_is_kept_as_one_event_whose_data_is_its_text(text: str) -> None:
    frames = FrameSplitter().feed(data_event(text.encode()))
    assert len(frames) == 1
    assert frames[0].event.data == text.replace("\r\n", "\n").replace("\r", "\n")


def test_an_empty_message_is_kept_as_an_event_nobody_acts_on() -> None:
    [frame] = FrameSplitter().feed(data_event(b""))
    assert frame.event.comment_only


class _Sink:
    headers_sent = True

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def message(self, data: bytes) -> None:
        self.written.append(data)


def test_a_turns_transcript_is_its_messages_up_to_the_limit() -> None:
    messages = [m.encode() for m in answer_turn("resp_1", "Hello there")[:-1]]  # all but the end
    client = ClientStream(_Sink(), APIS["openai-responses"])  # type: ignore[arg-type]
    client.keep_transcript(1 << 20)
    for message in messages:
        client.message(message)
    assert client.transcript is not None
    transcript = read_transcript("openai-responses", bytes(client.transcript), {"input": "hi"})
    assert (transcript.text, transcript.response_id, transcript.item_id, transcript.sequence_number) == (
        "Hello there", "resp_1", "msg_resp_1", 5)
    small = ClientStream(_Sink(), APIS["openai-responses"])  # type: ignore[arg-type]
    small.keep_transcript(sum(map(len, messages)))  # the framing makes them longer
    for message in messages:
        small.message(message)
    assert small.transcript is None  # past the limit: nothing is kept, and the cut is not continued


def test_the_next_turn_naming_a_continued_response_gets_the_whole_answer_as_input() -> None:
    turn = {"type": "response.create", "model": "m", "store": False, "previous_response_id": "resp_warm",
            "input": [{"role": "user", "content": "hi"}]}
    warm = {"type": "response.create", "model": "m", "generate": False, "instructions": "be brief", "input": []}
    thought = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAAAB"}
    answered = with_answer(turn, answer_input([thought], "Hello, world", stored=False))
    later = {"type": "response.create", "model": "m", "store": False, "previous_response_id": "resp_cut",
             "input": "more"}
    assert fold(later, {"resp_warm": warm, "resp_cut": answered}) == {
        "type": "response.create", "model": "m", "store": False, "instructions": "be brief",
        "input": [{"role": "user", "content": "hi"},
                  {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB"},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello, world"}]},
                  {"role": "user", "content": "more"}]}
    assert json.dumps(turn["input"]) == '[{"role": "user", "content": "hi"}]'  # the turn itself is unchanged


def test_reasoning_without_its_content_is_not_carried_when_nothing_is_stored() -> None:
    thought = {"id": "rs_1", "type": "reasoning", "summary": []}
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]}
    assert answer_input([thought], "Hi", stored=False) == [message]
    assert answer_input([thought], "Hi", stored=True) == [{"type": "reasoning", "id": "rs_1", "summary": []}, message]
