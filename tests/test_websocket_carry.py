"""Folding output-less turns into the turn that moves to another connection or to HTTP."""

from __future__ import annotations

import json

from switchyard_core.attempts.carry import as_http_body, as_message, fold, parse_create, response_id


def test_a_turn_naming_no_carried_warm_up_is_unchanged() -> None:
    body = {"type": "response.create", "model": "m", "input": "hi", "previous_response_id": "resp_real"}
    assert fold(body, {"resp_other": {"input": "x"}}) is body


def test_a_warm_up_chain_is_folded_in_order_and_the_reference_dropped() -> None:
    first = {"type": "response.create", "model": "m", "instructions": "be brief", "generate": False,
             "input": [{"role": "user", "content": "one"}]}
    second = {"type": "response.create", "model": "m", "generate": False, "previous_response_id": "resp_1",
              "input": "two", "tools": [{"type": "function", "name": "f"}]}
    turn = {"type": "response.create", "model": "m2", "previous_response_id": "resp_2", "input": "three"}
    folded = fold(turn, {"resp_1": first, "resp_2": second})
    assert folded == {
        "type": "response.create", "model": "m2", "instructions": "be brief",
        "tools": [{"type": "function", "name": "f"}],
        "input": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"},
                  {"role": "user", "content": "three"}]}


def test_a_chain_that_goes_beyond_what_was_carried_keeps_its_last_reference() -> None:
    warm = {"type": "response.create", "generate": False, "previous_response_id": "resp_elsewhere", "input": []}
    turn = {"type": "response.create", "previous_response_id": "resp_warm", "input": "x"}
    assert fold(turn, {"resp_warm": warm})["previous_response_id"] == "resp_elsewhere"


def test_a_cycle_of_references_ends() -> None:
    loop = {"type": "response.create", "generate": False, "previous_response_id": "resp_a", "input": []}
    turn = {"type": "response.create", "previous_response_id": "resp_a", "input": "x"}
    assert fold(turn, {"resp_a": loop})["input"] == [{"role": "user", "content": "x"}]


def test_the_http_body_has_no_websocket_fields_and_streams() -> None:
    body = {"type": "response.create", "generate": False, "model": "m", "input": "hi", "stream": False}
    assert json.loads(as_http_body(body)) == {"model": "m", "input": "hi", "stream": True}
    assert json.loads(as_message({"model": "m"})) == {"type": "response.create", "model": "m"}


def test_only_create_messages_are_turns() -> None:
    assert parse_create('{"type":"response.create","model":"m"}') == {"type": "response.create", "model": "m"}
    for text in ('{"type":"response.cancel"}', "not json", '["response.create"]',
                 '{"type":"x","note":"response.create"}'):
        assert parse_create(text) is None


def test_response_ids_are_read_only_from_messages_that_name_a_response() -> None:
    assert response_id(b'{"type":"response.created","response":{"id":"resp_1"}}') == "resp_1"
    assert response_id(b'{"type":"response.output_text.delta","delta":"response"}') is None
    assert response_id(b"not json \"response\"") is None
