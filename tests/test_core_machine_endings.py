"""The attempt core without sockets, continued: whole answers, every way an exchange
ends, continuations that fail, and a WebSocket turn's endings
(tests/support/core_playbook.py)."""

from __future__ import annotations

import json

from switchyard_core.attempts.commands import CloseClient, Expect, Finished, Open, Pipe, Read, Stop, Timer
from switchyard_core.attempts.turn_context import TurnContext
from switchyard_core.ws_items import Closed

from tests.support import wire
from tests.support.core_playbook import JSON, Play, only, opened_to, upstream

OVERLOADED = wire.chat_error(503, "provider overloaded")
HELLO = [wire.CHAT_ROLE, wire.chat_chunk({"content": "Hello"})]
REST = [wire.chat_chunk({"content": " world"}), wire.chat_chunk({}, "stop"), wire.CHAT_DONE]


def test_a_whole_answer_with_an_error_object_in_its_200_moves_on_and_a_clean_one_is_sent_whole() -> None:
    play = Play(upstream("a"), upstream("b"), stream=False, request_timeout_s=600)
    play.start()
    assert only(play.opened(1, 200, JSON), Read) == [Read(1, "whole", 64 * 1024 * 1024, by=1600.0)]
    error = json.dumps({"error": {"message": "overloaded", "type": "server_error", "code": 503}}).encode()
    assert opened_to(play.read(1, error)) == ["b"]
    answer = json.dumps(wire.chat_completion("hi")).encode()
    play.opened(2, 200, JSON)
    assert only(play.read(2, answer), Finished)
    assert (play.sink.status, play.sink.body, play.sink.whole) == (200, answer, True)


def test_a_whole_answer_too_large_to_hold_is_committed_and_the_rest_passed_through() -> None:
    play = Play(upstream("a"), stream=False, idle_timeout_s=60)
    play.start()
    play.opened(1, 200, JSON)
    commands = play.read(1, b"x" * 100, complete=False)
    assert commands == [Expect(1, quiet=60), Pipe(1)]
    play.data(1, b"yz")
    assert only(play.ended(1), Finished)
    assert (play.sink.status, play.sink.body, play.sink.whole) == (200, b"x" * 100 + b"yz", False)


def test_a_refused_connection_moves_on_and_nothing_answered_at_all_is_switchyards_own_502() -> None:
    play = Play(upstream("a", retries=1), upstream("b"))
    play.start()
    commands = play.open_failed(1, "transport", ConnectionRefusedError())
    assert not only(commands, Open) and [t.name for t in only(commands, Timer)] == ["backoff"]
    play.due("backoff")
    assert opened_to(play.open_failed(2, "transport", ConnectionRefusedError())) == ["b"]
    assert only(play.open_failed(3, "transport", ConnectionRefusedError()), Finished)
    assert play.sink.status == 502
    assert json.loads(play.sink.body)["error"]["code"] == "upstream_unavailable"
    assert [r.phase for r in play.exchange.attempts] == ["connect"] * 3


def test_a_stream_that_ends_before_output_said_nothing_and_the_last_that_said_something_is_forwarded() -> None:
    play = Play(upstream("a"), upstream("b"))
    play.start()
    play.opened(1)
    play.data(1, wire.CHAT_ROLE, OVERLOADED)
    play.opened(2)
    play.data(2, wire.CHAT_ROLE)
    assert only(play.ended(2), Finished)  # an empty answer: never forwarded as an empty success
    assert play.sink.body == wire.CHAT_ROLE + OVERLOADED  # the last failure that said something, as sent
    assert play.exchange.outcome == "exhausted"


def test_keepalive_headers_then_every_upstream_failing_ends_with_an_in_band_error() -> None:
    play = Play(upstream("a"), pre_answer_keepalive_s=1)
    play.start()
    play.at(1).due("keepalive")
    play.opened(1)
    play.data(1, OVERLOADED)
    assert play.sink.status == 200 and not play.sink.whole
    assert play.sink.body.startswith(b": switchyard keepalive\n\n")
    error = json.loads(play.sink.body.rsplit(b"data: ", 1)[1])["error"]
    assert error["message"] == "provider overloaded" and error["code"] == 503


def test_a_capacity_failure_after_output_is_forwarded_rewritten_and_never_replayed() -> None:
    play = Play(upstream("a"), upstream("b"))
    play.start()
    play.opened(1)
    capacity = wire.data({"error": {"message": "Selected model is at capacity", "code": "server_is_overloaded"}})
    commands = play.data(1, *HELLO, capacity)
    assert not only(commands, Open)
    assert play.sink.body == b"".join(HELLO) + capacity.replace(b"server_is_overloaded", b"server_error")
    assert play.exchange.suppressed_failover and play.outcomes == [("a", "committed")]


def test_more_held_than_the_staging_limit_commits() -> None:
    play = Play(upstream("a"), staging_limit=300)
    play.start()
    play.opened(1)
    lifecycle = [wire.CHAT_ROLE] * 3
    play.data(1, *lifecycle)
    assert play.sink.status == 200 and play.sink.body == b"".join(lifecycle)
    assert play.exchange.attempts[0].outcome == "committed"


def test_a_regenerated_answer_that_differs_is_not_used_and_the_cut_ends_the_answer() -> None:
    play = Play(upstream("a"), upstream("b"), continue_after_cut=("regenerate",))
    play.start()
    play.opened(1)
    play.data(1, *HELLO)
    assert opened_to(play.ended(1, ConnectionResetError("reset"))) == ["a"]  # the cut one first
    play.opened(2)
    commands = play.data(2, wire.CHAT_ROLE, wire.chat_chunk({"content": "Goodbye"}))
    assert Stop(2) in commands and opened_to(commands) == ["b"]  # it differs at once: the next one is asked
    play.opened(3)
    commands = play.data(3, wire.CHAT_ROLE, wire.chat_chunk({"content": "Hola"}))
    assert Stop(3) in commands and only(commands, Finished)  # nothing left to ask: the original cut ends it
    assert b"Goodbye" not in play.sink.body and b"Hola" not in play.sink.body
    assert play.sink.body.startswith(b"".join(HELLO)) and b"stream_cut" in play.sink.body
    assert [r.outcome for r in play.exchange.attempts] == ["committed", "continuation_failed", "continuation_failed"]


# --- a WebSocket turn's endings -----------------------------------------------------------

def _turn(resendable: bool = True) -> TurnContext:
    create = {"type": "response.create", "model": "gpt-4o", "input": "hi"}
    return TurnContext(1, json.dumps(create), create, resendable, (), lambda u: True)


def _messages(text: str, rid: str = "resp_1") -> list[bytes]:
    return [line.split(b"data: ", 1)[1].strip() for line in wire.responses_stream(text, rid=rid)]


def test_a_turn_whose_response_failed_keeps_its_socket_and_the_backup_answers() -> None:
    turn = _turn()
    a, b = upstream("a", api="openai-responses"), upstream("b", api="openai-responses")
    turn.upstreams = (a, b)
    play = Play(a, b, api="openai-responses", turn=turn)
    play.start()
    play.opened(1, 101, {})
    failed = json.dumps({"type": "response.failed", "response": {"id": "r1", "status": "failed",
                         "error": {"code": "server_is_overloaded", "message": "Slow down"}}}).encode()
    play.message(1, json.dumps({"type": "response.created", "response": {"id": "r1"}}).encode())
    commands = play.message(1, failed)
    assert Stop(1, drop=False) in commands and opened_to(commands) == ["b"]  # the failed response is over
    play.opened(2, 101, {})
    for raw in _messages("from b", "r2"):
        play.message(2, raw)
    assert turn.output and turn.response_id == "r2" and turn.socket_attempt == 2
    assert b"r1" not in play.sink.body


def test_a_turns_socket_closed_after_output_gives_the_client_the_close() -> None:
    turn = _turn()
    a = upstream("a", api="openai-responses")
    turn.upstreams = (a,)
    play = Play(a, api="openai-responses", turn=turn)
    play.start()
    play.opened(1, 101, {})
    for raw in _messages("partial answer")[:5]:
        play.message(1, raw)
    commands = play.ended(1, Closed(1011, "boom"))  # type: ignore[arg-type]
    assert CloseClient(1011, "boom") in commands and only(commands, Finished)


def test_a_turn_never_resent_that_stays_silent_gets_an_in_band_timeout() -> None:
    turn = _turn(resendable=False)
    a = upstream("a", api="openai-responses")
    turn.upstreams = (a,)
    play = Play(a, api="openai-responses", turn=turn, request_timeout_s=5)
    play.start()
    play.opened(1, 101, {})
    play.message(1, json.dumps({"type": "response.created", "response": {"id": "r9"}}).encode())
    commands = play.at(5).timed_out(1)
    assert Stop(1, drop=True) in commands and only(commands, Finished)
    error = json.loads(play.sink.body.rsplit(b"data: ", 1)[1])
    assert error["code"] == "upstream_timeout"
    assert play.exchange.attempts[0].outcome == "not_resent"
