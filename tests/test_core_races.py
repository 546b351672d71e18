"""The attempt core where two things race: a hedge and a forwarded failure, a hedge and
a refused WebSocket upgrade (tests/support/core_playbook.py).  Each test drives an
order of events that a real exchange can take and asserts what the client gets."""

from __future__ import annotations

import json

from switchyard_core.attempts.commands import Expect, Finished, Open, Pipe, Stop, Timer
from switchyard_core.attempts.turn_context import TurnContext

from tests.support import wire
from tests.support.core_playbook import Play, only, opened_to, upstream

INVALID = wire.data({"error": {"message": "unknown parameter", "type": "invalid_request_error",
                               "code": "unknown_parameter"}})


def _messages(text: str, rid: str) -> list[bytes]:
    """A Responses answer as WebSocket messages."""
    return [line.split(b"data: ", 1)[1].strip() for line in wire.responses_stream(text, rid=rid)
            if line.startswith(b"event:")]


def test_a_fatal_failure_forwarded_in_stream_is_never_followed_by_a_hedge() -> None:
    """A fatal error frame is the client's answer, as sent, and nothing else is asked:
    the hedge timer that was running for the attempt must not ask the next upstream."""
    play = Play(upstream("a"), upstream("b"), hedge_after_s=2)
    play.start()
    play.opened(1)
    commands = play.at(1).data(1, wire.CHAT_ROLE, INVALID)
    assert Timer("hedge", None) in commands and not only(commands, Open)
    assert play.at(2).due("hedge") == []
    assert only(play.ended(1), Finished)
    assert play.sink.body == wire.CHAT_ROLE + INVALID  # a's answer, as sent, and nothing of b's
    assert play.outcomes == [("a", "fatal")]


def test_a_refused_upgrade_reopened_over_http_keeps_clear_of_the_hedge_beside_it() -> None:
    """The refused upgrade's try goes over HTTP under its own number: the hedge opened
    meanwhile keeps its own, and its answer reaches the client whole."""
    create = {"type": "response.create", "model": "gpt-4o", "input": "hi"}
    a = upstream("a", api="openai-responses", websocket=None)
    b = upstream("b", api="openai-responses", websocket=None)
    turn = TurnContext(1, json.dumps(create), create, True, (a, b), lambda u: True)
    play = Play(a, b, api="openai-responses", turn=turn, hedge_after_s=2, request_timeout_s=600)
    play.start()
    assert [o.attempt for o in only(play.at(2).due("hedge"), Open)] == [2]
    commands = play.at(2.5).machine.refused(1, 405, [], b"", play.now)
    (reopened,) = only(commands, Open)
    assert (reopened.over, reopened.attempt, opened_to([reopened])) == ("http", 1, ["a"])
    assert play.opened(2, 101, {}) == [Expect(2, by=1602.0), Pipe(2)]  # b's socket, still b's attempt
    messages = _messages("answer from b", "resp_b")
    commands = [command for raw in messages for command in play.message(2, raw)]
    assert Stop(1) in commands and only(commands, Finished)  # the HTTP try of a lost
    assert play.sink.body == b"".join(m + b"\n" for m in messages)
    assert [(r.attempt, r.upstream, r.outcome) for r in play.exchange.attempts] == [
        (1, "a", "hedge_lost"), (2, "b", "committed")]
