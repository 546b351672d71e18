"""Hedged attempts and outage memory, in the attempt core without sockets
(tests/support/core_playbook.py): which upstreams are asked, when, and what the
client gets.  The end-to-end tests show the same with real upstreams and clients."""

from __future__ import annotations

import json

from switchyard_core.attempts.commands import Finished, Open, Stop, Timer
from switchyard_core.attempts.outages import Outages

from tests.support import wire
from tests.support.core_playbook import JSON, Play, only, opened_to, upstream

OVERLOADED = wire.chat_error(503, "provider overloaded")
RATE_LIMITED = json.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}}).encode()


def answer(name: str) -> list[bytes]:
    return wire.chat_stream(f"answer from {name}")


# --- hedging -------------------------------------------------------------------------------

def test_a_slow_start_also_asks_the_next_upstream_and_the_first_output_wins() -> None:
    play = Play(upstream("a"), upstream("b"), upstream("c"), hedge_after_s=2)
    commands = play.start()
    assert opened_to(commands) == ["a"] and Timer("hedge", 1002.0) in commands
    play.at(0.5).opened(1)
    play.data(1, wire.CHAT_ROLE)  # lifecycle only: no output yet
    commands = play.at(2).due("hedge")
    assert opened_to(commands) == ["b"] and not only(commands, Stop)  # the first goes on
    play.opened(2)
    commands = play.at(2.5).data(2, *answer("b")[:2])
    assert Stop(1) in commands  # the slow one is stopped as the winner's first output arrives
    assert play.data(1, *answer("a")) == []  # nothing of the loser reaches the client
    play.data(2, *answer("b")[2:])
    play.ended(2)
    assert play.sink.body == b"".join(answer("b"))
    assert play.outcomes == [("a", "hedge_lost"), ("b", "committed")]
    assert [r.hedge for r in play.exchange.attempts] == [False, True]


def test_the_slow_one_may_still_win_and_the_hedge_is_stopped() -> None:
    play = Play(upstream("a"), upstream("b"), hedge_after_s=2)
    play.start()
    play.opened(1)
    play.at(2).due("hedge")
    play.opened(2)
    commands = play.at(2.1).data(1, *answer("a"))
    assert Stop(2) in commands
    play.ended(1)
    assert play.sink.body == b"".join(answer("a"))
    assert play.outcomes == [("a", "committed"), ("b", "hedge_lost")]


def test_an_answer_that_starts_in_time_is_never_hedged() -> None:
    play = Play(upstream("a"), upstream("b"), hedge_after_s=2)
    play.start()
    play.opened(1)
    commands = play.at(1).data(1, *answer("a")[:2])
    assert Timer("hedge", None) in commands
    assert play.at(2).due("hedge") == []


def test_when_both_hedged_attempts_fail_the_route_goes_on_past_them() -> None:
    play = Play(upstream("a"), upstream("b"), upstream("c"), hedge_after_s=2)
    play.start()
    play.opened(1)
    play.at(2).due("hedge")
    play.opened(2)
    assert not only(play.data(1, OVERLOADED), Open)  # the hedge carries on
    commands = play.data(2, OVERLOADED)
    assert opened_to(commands) == ["c"]
    play.opened(3)
    play.data(3, *answer("c"))
    assert play.sink.body == b"".join(answer("c"))


def test_no_hedge_past_the_last_upstream() -> None:
    play = Play(upstream("a"), hedge_after_s=2)
    assert not only(play.start(), Timer)


# --- outage memory ---------------------------------------------------------------------------

def _route(*upstreams: str, **settings: object) -> Play:
    return Play(*(upstream(name) for name in upstreams), **settings)


def test_a_stated_delay_makes_later_requests_go_straight_to_the_next_upstream() -> None:
    outages = Outages()
    first = Play(upstream("a"), upstream("b"), outages=outages)
    first.start()
    first.opened(1, 429, {**JSON, "Retry-After": "60"})
    assert opened_to(first.read(1, RATE_LIMITED)) == ["b"]
    second = Play(upstream("a"), upstream("b"), outages=outages, start_at=1)
    assert opened_to(second.start()) == ["b"]
    assert second.exchange.skipped and second.exchange.skipped[0].startswith("a: said to wait 60s")
    third = Play(upstream("a"), upstream("b"), outages=outages, start_at=61)
    assert opened_to(third.start()) == ["a"]  # the delay has passed


def test_a_capacity_failure_that_states_no_delay_is_not_remembered() -> None:
    outages = Outages()
    first = Play(upstream("a"), upstream("b"), outages=outages)
    first.start()
    first.opened(1)
    assert opened_to(first.data(1, OVERLOADED)) == ["b"]
    second = Play(upstream("a"), upstream("b"), outages=outages, start_at=1)
    assert opened_to(second.start()) == ["a"] and second.exchange.skipped == []


def test_an_unreachable_upstream_is_skipped_then_probed_by_one_request() -> None:
    outages = Outages()
    first = Play(upstream("a"), upstream("b"), outages=outages, unreachable_skip_s=10)
    first.start()
    assert opened_to(first.open_failed(1, "transport", ConnectionRefusedError("refused"))) == ["b"]
    during = Play(upstream("a"), upstream("b"), outages=outages, unreachable_skip_s=10, start_at=5)
    assert opened_to(during.start()) == ["b"]
    probe = Play(upstream("a"), upstream("b"), outages=outages, unreachable_skip_s=10, start_at=11)
    assert opened_to(probe.start()) == ["a"]  # the one probe
    beside = Play(upstream("a"), upstream("b"), outages=outages, unreachable_skip_s=10, start_at=11.5)
    assert opened_to(beside.start()) == ["b"]  # the others keep skipping it while it is probed
    probe.at(11.6).opened(1)
    probe.data(1, *answer("a"))
    after = Play(upstream("a"), upstream("b"), outages=outages, unreachable_skip_s=10, start_at=12)
    assert opened_to(after.start()) == ["a"]  # it answered: forgotten


def test_when_every_upstream_is_skipped_the_one_due_soonest_is_tried_first() -> None:
    outages = Outages()
    first = Play(upstream("a"), upstream("b"), outages=outages)
    first.start()
    first.opened(1, 429, {**JSON, "Retry-After": "60"})
    first.read(1, RATE_LIMITED)
    first.opened(2, 429, {**JSON, "Retry-After": "20"})
    assert only(first.read(2, RATE_LIMITED), Finished)
    second = Play(upstream("a"), upstream("b"), outages=outages, start_at=1)
    assert opened_to(second.start()) == ["b"]  # never failed without a try
