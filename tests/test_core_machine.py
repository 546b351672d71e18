"""The attempt core without sockets: events in at chosen times, commands out, and the
exact bytes the client was sent (tests/support/core_playbook.py).  The end-to-end
tests show the same behaviour with real clients; these pin down the decisions."""

from __future__ import annotations

import json

from switchyard_core.attempts.commands import Expect, Finished, Open, Pipe, Read, Stop, Timer, UseHttp
from switchyard_core.attempts.turn_context import TurnContext

from tests.support import wire
from tests.support.core_playbook import JSON, Play, only, opened_to, upstream

OVERLOADED = wire.chat_error(503, "provider overloaded")
HELLO = [wire.CHAT_ROLE, wire.chat_chunk({"content": "Hello"})]
REST = [wire.chat_chunk({"content": " world"}), wire.chat_chunk({}, "stop"), wire.CHAT_DONE]


def test_the_first_attempt_is_opened_at_once_with_its_head_bound_from_the_start() -> None:
    play = Play(upstream("a"), upstream("b"), headers_timeout_s=30, connect_timeout_s=5)
    (open_,) = play.start()
    assert isinstance(open_, Open) and open_.over == "http"
    assert (opened_to([open_]), open_.connect_s, open_.head_by) == (["a"], 5, 1030.0)


def test_a_stream_is_held_until_its_first_output_then_passes_as_it_comes() -> None:
    play = Play(upstream("a"), request_timeout_s=600, first_output_timeout_s=20, idle_timeout_s=60)
    play.start()
    commands = play.at(1).opened(1)
    # nothing before output moves the first output's due time: one fixed bound from the attempt's start
    assert commands == [Expect(1, by=1020.0), Pipe(1)]
    assert play.data(1, wire.CHAT_ROLE) == [] and play.sink.status is None
    assert play.data(1, wire.chat_chunk({"content": "Hello"})) == [Timer("keepalive", None), Expect(1, quiet=60)]
    assert (play.sink.status, play.sink.body) == (200, b"".join(HELLO))
    assert play.sink.header("x-switchyard-upstream") == "a"
    assert play.machine.attempt(1) is not None and play.machine.attempt(1).passes(REST[0])  # type: ignore[union-attr]
    play.data(1, *REST)
    assert only(play.ended(1), Finished)
    assert play.sink.body == b"".join(HELLO + REST) and not play.sink.cut
    assert (play.exchange.outcome, play.outcomes) == ("committed", [("a", "committed")])


def test_a_failure_before_output_moves_on_and_the_client_sees_nothing_of_it() -> None:
    play = Play(upstream("a"), upstream("b"))
    play.start()
    play.opened(1)
    commands = play.data(1, wire.CHAT_ROLE, OVERLOADED)
    assert only(commands, Stop) == [Stop(1)] and opened_to(commands) == ["b"]
    play.opened(2)
    play.data(2, *HELLO, *REST)
    play.ended(2)
    assert play.sink.body == b"".join(HELLO + REST)
    assert play.sink.header("x-switchyard-attempts") == "2"
    assert play.outcomes == [("a", "next_upstream"), ("b", "committed")]


def test_a_retry_waits_its_backoff_then_asks_the_same_upstream() -> None:
    play = Play(upstream("a", retries=1), upstream("b"), backoff_ms=200, max_backoff_ms=200)
    play.start()
    play.opened(1)
    commands = play.data(1, OVERLOADED)
    (timer,) = only(commands, Timer)
    assert timer.name == "backoff" and 1000.15 <= (timer.at or 0) <= 1000.2 and not only(commands, Open)
    assert opened_to(play.at(0.2).due("backoff")) == ["a"]


def test_a_late_event_of_an_attempt_the_core_is_done_with_is_ignored() -> None:
    play = Play(upstream("a"), upstream("b"))
    play.start()
    play.opened(1)
    play.data(1, OVERLOADED)
    assert play.data(1, *HELLO) == [] and play.ended(1) == [] and play.timed_out(1) == []
    assert play.sink.body == b""


def test_a_fatal_error_is_read_and_forwarded_as_sent_and_nothing_else_is_asked() -> None:
    error = json.dumps({"error": {"message": "bad key", "type": "invalid_request_error"}}).encode()
    play = Play(upstream("a", retries=2), upstream("b"))
    play.start()
    assert only(play.opened(1, 401, JSON), Read) == [Read(1, "error", 1024 * 1024, span_s=30.0)]
    commands = play.read(1, error)
    assert only(commands, Finished) and not only(commands, Open)
    assert (play.sink.status, play.sink.body, play.sink.whole) == (401, error, True)
    assert play.outcomes == [("a", "fatal")]


def test_silence_before_output_is_a_timeout_that_moves_on_at_once() -> None:
    play = Play(upstream("a", retries=3), upstream("b"), request_timeout_s=10)
    play.start()
    play.opened(1)
    play.data(1, wire.CHAT_ROLE)
    commands = play.at(10).timed_out(1)
    assert opened_to(commands) == ["b"] and not only(commands, Timer)  # a silent provider is not asked again
    assert play.exchange.attempts[0].message == "no output within 10s"


def test_no_head_in_time_on_the_last_upstream_is_a_504_in_the_apis_shape() -> None:
    play = Play(upstream("a"), headers_timeout_s=5)
    play.start()
    commands = play.at(5).open_failed(1, "head_timeout")
    assert only(commands, Finished)
    assert play.sink.status == 504
    assert json.loads(play.sink.body)["error"]["code"] == "upstream_timeout"


def test_a_stall_after_output_ends_with_an_in_band_error_never_a_clean_end() -> None:
    play = Play(upstream("a"), upstream("b"), idle_timeout_s=3)
    play.start()
    play.opened(1)
    play.data(1, *HELLO)
    commands = play.at(5).timed_out(1)
    assert Stop(1) in commands and only(commands, Finished) and not only(commands, Open)
    assert play.sink.body.startswith(b"".join(HELLO))
    assert b"stream_stalled" in play.sink.body and b"upstream sent nothing for 3s" in play.sink.body


def test_the_pre_answer_keepalive_sends_headers_and_comments_until_the_answer_commits() -> None:
    play = Play(upstream("a"), pre_answer_keepalive_s=15)
    assert Timer("keepalive", 1015.0) in play.start()
    play.opened(1)
    assert play.at(15).due("keepalive") == [Timer("keepalive", 1030.0)]
    assert play.sink.status == 200 and play.sink.body == b": switchyard keepalive\n\n"
    play.data(1, *HELLO)
    assert play.sink.body.endswith(b": switchyard upstream=a attempts=1\n\n" + b"".join(HELLO))
    assert play.at(30).due("keepalive") == []


def test_a_client_that_leaves_stops_every_answer_and_nothing_more_is_written() -> None:
    play = Play(upstream("a"))
    play.start()
    play.opened(1)
    commands = play.machine.client_gone()
    assert Stop(1) in commands and only(commands, Finished)
    assert play.sink.status is None and play.exchange.outcome == "client_gone"


# --- continuation: one more kind of attempt -----------------------------------------------


def test_a_cut_answer_is_finished_by_a_prefill_continuation_without_a_character_twice() -> None:
    play = Play(upstream("a"), upstream("b", prefill=True), continue_after_cut=("prefill",))
    play.start()
    play.opened(1)
    play.data(1, *HELLO)
    commands = play.at(1).ended(1, ConnectionResetError("reset"))
    (open_,) = only(commands, Open)
    assert opened_to([open_]) == ["b"]
    asked = json.loads(open_.request.body)["messages"][-1]
    assert asked == {"role": "assistant", "content": "Hello"}
    play.opened(2)
    play.data(2, wire.chat_chunk({"role": "assistant", "content": ""}), *REST)
    assert only(play.ended(2), Finished)
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                   for line in play.sink.body.decode().split("\n\n") if line.startswith("data: {"))
    assert text == "Hello world"
    assert (play.exchange.outcome, play.outcomes) == ("continued", [("a", "committed"), ("b", "continued")])


def test_a_continuation_whose_first_character_never_comes_is_bounded_from_its_start() -> None:
    play = Play(upstream("a", prefill=True), continue_after_cut=("prefill",), request_timeout_s=20,
                idle_timeout_s=60)
    play.start()
    play.opened(1)
    play.data(1, *HELLO)
    play.at(1).ended(1, ConnectionResetError("reset"))  # the continuation is asked now
    # pings and empty deltas never move it: the bound is fixed from the continuation's start
    assert play.at(2).opened(2) == [Expect(2, by=1021.0), Pipe(2)]
    assert play.data(2, b": ping\n\n", wire.chat_chunk({"role": "assistant", "content": ""})) == []
    commands = play.at(21).timed_out(2)
    assert Stop(2) in commands and only(commands, Finished)
    assert b"stream_cut" in play.sink.body  # the original cut ends the answer
    assert play.outcomes == [("a", "committed"), ("a", "continuation_failed")]


# --- a WebSocket turn -----------------------------------------------------------------------

def _turn(resendable: bool = True, websocket: bool = True, body: dict[str, object] | None = None) -> TurnContext:
    create = body or {"type": "response.create", "model": "gpt-4o", "input": "hi"}
    return TurnContext(1, json.dumps(create), create, resendable, (), lambda u: websocket)


def _responses(text: str) -> list[bytes]:
    return [line.split(b"data: ", 1)[1].strip() for line in wire.responses_stream(text)]


def test_a_turns_first_output_is_due_from_the_attempts_start_whatever_it_sends_before() -> None:
    turn = _turn()
    a, b = upstream("a", api="openai-responses", websocket=None), upstream("b", api="openai-responses")
    turn.upstreams = (a, b)
    play = Play(a, b, api="openai-responses", turn=turn, request_timeout_s=30, first_output_timeout_s=0)
    (open_,) = play.start()
    assert open_.over == "websocket"
    assert play.opened(1, 101, {}) == [Expect(1, by=1030.0), Pipe(1)]
    in_progress = json.dumps({"type": "response.in_progress", "response": {"id": "r1"}}).encode()
    for second in range(1, 30):  # every second: never output, and never a new bound
        assert play.at(second).message(1, in_progress) == []
    commands = play.at(30).timed_out(1)
    assert Stop(1, drop=True) in commands and opened_to(commands) == ["b"]


def test_a_turn_refused_the_upgrade_asks_the_same_upstream_over_http() -> None:
    turn = _turn()
    a = upstream("a", api="openai-responses", websocket=None)
    turn.upstreams = (a,)
    play = Play(a, api="openai-responses", turn=turn)
    play.start()
    commands = play.machine.refused(1, 405, [], b"", play.now)
    assert UseHttp("a", 405) in commands
    (open_,) = only(commands, Open)
    assert open_.over == "http" and open_.attempt == 1  # the refused upgrade was no attempt of the turn
    play.opened(1)
    play.data(1, *wire.responses_stream("hi there"))
    play.ended(1)
    assert play.exchange.outcome == "committed" and turn.output


def test_a_warm_up_bound_for_http_is_answered_here() -> None:
    turn = _turn(websocket=False, body={"type": "response.create", "model": "m", "generate": False})
    a = upstream("a", api="openai-responses")
    turn.upstreams = (a,)
    play = Play(a, api="openai-responses", turn=turn)
    commands = play.start()
    assert only(commands, Finished) and not only(commands, Open)
    messages = [json.loads(m) for m in play.sink.body.splitlines()]
    assert [m["type"] for m in messages] == ["response.created", "response.completed"]
    assert turn.response_id == messages[0]["response"]["id"] and not turn.output


def test_a_turn_that_may_not_be_resent_passes_its_messages_from_the_first() -> None:
    turn = _turn(resendable=False)
    a = upstream("a", api="openai-responses")
    turn.upstreams = (a,)
    play = Play(a, api="openai-responses", turn=turn)
    play.start()
    play.opened(1, 101, {})
    first = json.dumps({"type": "response.created", "response": {"id": "r9"}}).encode()
    play.message(1, first)
    assert play.sink.body == first + b"\n"  # not held: nothing of it may be re-sent anyway
    for raw in _responses("ok")[1:]:
        play.message(1, raw)
    assert turn.output and play.exchange.outcome == "committed"
    assert play.exchange.attempts[0].outcome == "passed_through"
