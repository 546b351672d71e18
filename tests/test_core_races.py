"""The attempt core where two things meet: a hedge and a forwarded failure, a hedge's
fatal failure beside a slow primary, a hedge and a refused WebSocket upgrade, a whole
(non-streaming) answer and the hedge or outage memory (tests/support/core_playbook.py).
Each test drives an order of events a real exchange can take and asserts what the
client gets, or what later requests are told."""

from __future__ import annotations

import dataclasses
import json

from switchyard_core.attempts.commands import Expect, Finished, Open, Pipe, Stop, Timer
from switchyard_core.attempts.outages import Outages
from switchyard_core.attempts.turn_context import TurnContext
from switchyard_core.exchange import OriginalRequest

from tests.support import wire
from tests.support.core_playbook import JSON, Play, only, opened_to, upstream

INVALID = wire.data({"error": {"message": "unknown parameter", "type": "invalid_request_error",
                               "code": "unknown_parameter"}})

BAD_KEY = json.dumps({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                "code": "invalid_api_key"}}).encode()


def _answer(name: str) -> list[bytes]:
    return wire.chat_stream(f"answer from {name}")


def _whole(name: str) -> bytes:
    return json.dumps(wire.chat_completion(f"answer from {name}")).encode()


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


def test_a_hedges_fatal_failure_does_not_cost_the_slow_primarys_answer() -> None:
    """A backup with a wrong key answers the hedge 401 at once: without the hedge the
    primary's slow answer would have been the client's, and so it still is."""
    play = Play(upstream("a"), upstream("b"), hedge_after_s=2)
    play.start()
    play.opened(1)
    play.at(2).due("hedge")
    play.opened(2, 401, JSON)
    commands = play.read(2, BAD_KEY)
    assert Stop(2) in commands and Stop(1) not in commands and not only(commands, Finished)
    play.at(5).data(1, *_answer("a"))
    assert only(play.ended(1), Finished)
    assert (play.sink.status, play.sink.body) == (200, b"".join(_answer("a")))
    assert play.outcomes == [("a", "committed"), ("b", "fatal")]


def test_the_primarys_own_fatal_failure_is_still_forwarded_and_the_hedge_stopped() -> None:
    play = Play(upstream("a"), upstream("b"), hedge_after_s=2)
    play.start()
    play.at(2).due("hedge")
    play.opened(1, 401, JSON)
    commands = play.read(1, BAD_KEY)
    assert Stop(2) in commands and only(commands, Finished)
    assert (play.sink.status, play.sink.body) == (401, BAD_KEY)


def test_a_whole_answer_that_wins_a_hedge_stops_the_other_as_lost() -> None:
    play = Play(upstream("a"), upstream("b"), hedge_after_s=2, stream=False)
    play.start()
    play.opened(1, 200, JSON)
    play.at(2).due("hedge")
    play.opened(2, 200, JSON)
    commands = play.read(2, _whole("b"))
    assert Stop(1) in commands and only(commands, Finished)
    assert (play.sink.status, play.sink.body, play.sink.whole) == (200, _whole("b"), True)
    assert play.outcomes == [("a", "hedge_lost"), ("b", "committed")]


def test_a_whole_answer_from_a_probed_upstream_ends_its_outage_memory() -> None:
    """Non-streaming requests are most SDK calls: the probe that a whole answer won must
    clear the memory, as a stream's first output does, or the upstream stays listed as
    skipped and concurrent requests keep going around it."""
    outages = Outages()
    first = Play(upstream("a"), upstream("b"), outages=outages, stream=False, unreachable_skip_s=10)
    first.start()
    first.open_failed(1, "transport", ConnectionRefusedError("refused"))
    probe = Play(upstream("a"), upstream("b"), outages=outages, stream=False, unreachable_skip_s=10, start_at=11)
    assert opened_to(probe.start()) == ["a"]
    probe.opened(1, 200, JSON)
    probe.read(1, _whole("a"))
    assert outages.status(1012.0) == []
    beside = Play(upstream("a"), upstream("b"), outages=outages, stream=False, unreachable_skip_s=10, start_at=12)
    assert opened_to(beside.start()) == ["a"] and beside.exchange.skipped == []


def test_an_upstream_not_asked_because_the_request_cannot_be_carried_there_keeps_its_outage_memory() -> None:
    """A request with audio cannot go to an Anthropic backup: it was not asked, so nothing
    was learnt of it.  Its memory (it cannot be reached) stays for later requests, and
    the probe this request held goes to the next one."""
    outages = Outages()
    claude = dataclasses.replace(upstream("b", api="anthropic-messages"), api="anthropic-messages", model="claude-x")
    first = Play(claude, upstream("a"), outages=outages, unreachable_skip_s=10)
    first.start()
    first.open_failed(1, "transport", ConnectionRefusedError("refused"))
    audio = Play(claude, upstream("a"), outages=outages, unreachable_skip_s=10, start_at=11)  # b's probe is due
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]}
    audio.exchange.request = OriginalRequest.of("POST", "https://origin.example/v1/chat/completions",
                                                (("Content-Type", "application/json"),), json.dumps(body).encode(), body)
    assert opened_to(audio.start()) == ["a"]
    assert audio.outcomes == [("b", "next_upstream"), ("a", "pending")]
    assert outages.status(1011.5) == ["route=r upstream=b skipped: cannot be reached (connection refused or "
                                      "unreachable); the next request probes it"]


def test_a_turns_first_output_bound_covers_its_websocket_handshake_as_it_covers_an_http_head() -> None:
    """first_output_timeout_s counts from the attempt's start on every transport: an
    upstream whose handshake hangs is moved past when the first output is due, as one
    whose HTTP head hangs is, not after headers_timeout_s."""
    create = {"type": "response.create", "model": "gpt-4o", "input": "hi"}
    a = upstream("a", api="openai-responses", websocket=None)
    b = upstream("b", api="openai-responses", websocket=None)
    turn = TurnContext(1, json.dumps(create), create, True, (a, b), lambda u: True)
    play = Play(a, b, api="openai-responses", turn=turn, first_output_timeout_s=5, headers_timeout_s=30)
    (opening,) = only(play.start(), Open)
    assert (opening.over, opening.head_by) == ("websocket", 1005.0)
    commands = play.at(5).open_failed(1, "head_timeout")
    assert opened_to(commands) == ["b"]
    assert play.exchange.attempts[0].message == "no output within 5s"


def test_a_stream_whose_head_never_comes_is_bounded_by_request_timeout_s_when_headers_timeout_s_is_off() -> None:
    """headers_timeout_s: 0 lifts the head's own bound, not the first output's: that is
    due request_timeout_s from the attempt's start, and a head must come before it.
    (Behind the pre-answer keepalive a client never gives up on its own.)"""
    play = Play(upstream("a"), upstream("b"), headers_timeout_s=0, first_output_timeout_s=0, request_timeout_s=600)
    (opening,) = only(play.start(), Open)
    assert opening.head_by == 1600.0
    assert opened_to(play.at(600).open_failed(1, "head_timeout")) == ["b"]
    assert play.exchange.attempts[0].message == "no output within 600s"
