"""Each attempt's time bounds, decided once from the route's settings and whether
the client streams, and the message each timeout gives the client and the log."""

from __future__ import annotations

from dataclasses import replace

from switchyard_core.attempts.deadlines import Deadlines, effort_over
from switchyard_core.rules import AttemptSettings

SETTINGS = AttemptSettings()  # connect 10, headers 30, first output off, request 600, idle 60


def test_a_stream_waits_for_its_head_then_for_its_first_output_from_its_start_and_never_for_its_whole_length() -> None:
    d = Deadlines.of(SETTINGS, streams=True, started=100.0)
    assert (d.connect, d.head, d.head_waits_for) == (10.0, 30.0, "response headers")
    assert (d.quiet_staged, d.quiet_after_output, d.first_output) == (600.0, 60.0, None)
    assert d.staged_by == 700.0  # from the start: a comment meanwhile moves nothing
    assert d.no_head().message == "no response headers within 30s"
    assert d.silent_while_staged(now=800.0).message == "no output within 600s"
    assert d.stalled_message() == "upstream sent nothing for 60s after output"


def test_a_first_output_bound_sooner_than_the_head_bound_is_what_the_head_waits_for() -> None:
    d = Deadlines.of(replace(SETTINGS, first_output_timeout_s=5.0), streams=True, started=100.0)
    assert (d.head, d.head_waits_for, d.first_output) == (5.0, "output", 5.0)
    assert d.headers == 30.0  # what a continuation, which continues output, waits for its head
    assert d.stalled_message(after_output=False) == "upstream sent nothing for 60s"
    assert d.no_head().message == "no output within 5s"
    assert d.staged_by == 105.0  # staged: output is due by the sooner bound, from the start
    assert d.silent_while_staged(now=105.0).message == "no output within 5s"  # the sooner bound


def test_a_whole_answer_is_bounded_from_the_start_to_its_last_byte() -> None:
    d = Deadlines.of(SETTINGS, streams=False, started=100.0)
    assert (d.head, d.head_waits_for, d.whole_by) == (600.0, "complete answer", 700.0)
    assert d.no_head().message == "no complete answer within 600s"
    assert d.incomplete().message == "no complete answer within 600s"


def test_zero_is_no_bound() -> None:
    off = replace(SETTINGS, connect_timeout_s=0, headers_timeout_s=0, request_timeout_s=0, idle_timeout_s=0)
    d = Deadlines.of(off, streams=True, started=0.0)
    assert (d.connect, d.head, d.quiet_staged, d.quiet_after_output, d.whole_by) == (None, None, None, None, None)
    assert d.staged_by is None
    assert d.no_head().message == "no response headers within the time limit"


def test_an_error_body_gets_the_head_bound_else_the_whole_answers() -> None:
    assert Deadlines.of(SETTINGS, streams=True, started=0).error_body == 30.0
    no_head = replace(SETTINGS, headers_timeout_s=0)
    assert Deadlines.of(no_head, streams=True, started=0).error_body == 600.0


def test_every_timeout_is_a_retryable_504() -> None:
    d = Deadlines.of(SETTINGS, streams=True, started=0.0)
    for info in (d.no_connection(), d.no_head(), d.incomplete(), d.silent_while_staged(now=0.0)):
        assert (info.status, info.event_type, info.retryable_hint) == (504, "timeout", True)
    assert d.no_connection().message == "no connection within 10s"


def test_a_continuations_first_character_is_due_from_its_start_and_never_past_request_timeout_s_after_the_cut() -> None:
    """Its staged bound from its own start (comments and empty deltas move nothing), and
    every try of the effort within request_timeout_s of the cut together."""
    settings = replace(SETTINGS, request_timeout_s=20.0, first_output_timeout_s=1.0)
    d = Deadlines.of(settings, streams=True, started=105.0)
    assert d.continued_by(cut_at=100.0) == 106.0  # first_output_timeout_s from its start
    assert d.no_continued_text(cut_at=100.0) == "no continued text within 1s"
    late = Deadlines.of(settings, streams=True, started=119.5)
    assert late.continued_by(cut_at=100.0) == 120.0  # the effort's bound comes first
    assert late.no_continued_text(cut_at=100.0) == "no continued text within 20s of the cut"
    assert not effort_over(settings, 100.0, now=119.9) and effort_over(settings, 100.0, now=120.0)
    off = replace(SETTINGS, request_timeout_s=0.0)
    assert Deadlines.of(off, streams=True, started=105.0).continued_by(cut_at=100.0) is None  # 0: no bound
    assert not effort_over(off, 100.0, now=1e9)
