"""The attempt loop driven directly, without sockets (tests/support/loop_playbook.py):
scripted upstream answers in, the client's exact bytes and the attempts' records out."""

from __future__ import annotations

import json

from switchyard_core.apis import ErrorInfo, ErrorPolicy
from switchyard_core.attempts.policy import first_try, judge, next_try
from switchyard_core.retry import Plan
from switchyard_core.rules import AttemptSettings

from tests.support import wire
from tests.support.loop_playbook import JSON, Scripted, ScriptedUpstreams, play, upstream

PRIMARY, BACKUP = "primary.example", "backup.example"
OVERLOADED = wire.chat_error(503, "provider overloaded")


async def test_a_failure_before_output_goes_to_the_backup_and_the_client_gets_only_its_answer() -> None:
    answer = wire.normal_frames("/v1/chat/completions", "backup")
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(pieces=[wire.CHAT_ROLE, OVERLOADED])],
                                   BACKUP: [Scripted(pieces=answer)]})
    exchange, client = await play(upstreams, upstream(PRIMARY), upstream(BACKUP))
    assert upstreams.calls == [PRIMARY, BACKUP]
    assert (client.status, client.body, client.cut) == (200, b"".join(answer), False)
    assert (client.header("x-switchyard-upstream"), client.header("x-switchyard-attempts")) == ("backup", "2")
    assert [(r.upstream, r.outcome, r.phase, r.status) for r in exchange.attempts] == [
        ("primary", "next_upstream", "staging", 503), ("backup", "committed", "output", 200)]
    assert (exchange.outcome, exchange.answered_by) == ("committed", "backup")


async def test_a_retryable_http_error_is_retried_on_the_same_upstream_within_its_budget() -> None:
    answer = wire.normal_frames("/v1/chat/completions", "primary")
    error = json.dumps({"error": {"message": "overloaded", "type": "server_error"}}).encode()
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(503, JSON, [error]), Scripted(pieces=answer)]})
    exchange, client = await play(upstreams, upstream(PRIMARY, retries=1), upstream(BACKUP))
    assert upstreams.calls == [PRIMARY, PRIMARY]
    assert client.body == b"".join(answer)
    assert [r.outcome for r in exchange.attempts] == ["retry", "committed"]


async def test_a_fatal_error_is_forwarded_as_sent_and_nothing_else_is_tried() -> None:
    error = json.dumps({"error": {"message": "bad key", "type": "invalid_request_error",
                                  "code": "invalid_api_key"}}).encode()
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(401, JSON, [error])]})
    exchange, client = await play(upstreams, upstream(PRIMARY, retries=2), upstream(BACKUP))
    assert upstreams.calls == [PRIMARY]
    assert (client.status, client.body, client.whole) == (401, error, True)
    assert [r.outcome for r in exchange.attempts] == ["fatal"]
    assert (exchange.outcome, exchange.answered_by) == ("gave_up", "primary")


async def test_when_no_upstream_answers_the_client_gets_a_502_in_the_apis_shape() -> None:
    upstreams = ScriptedUpstreams({PRIMARY: [ConnectionRefusedError("refused")],
                                   BACKUP: [ConnectionRefusedError("refused")]})
    exchange, client = await play(upstreams, upstream(PRIMARY), upstream(BACKUP))
    assert upstreams.calls == [PRIMARY, BACKUP]
    assert client.status == 502 and client.whole
    error = json.loads(client.body)["error"]
    assert error["code"] == "upstream_unavailable" and error["message"].startswith("switchyard: no upstream answered")
    assert [(r.outcome, r.phase) for r in exchange.attempts] == [("next_upstream", "connect"), ("give_up", "connect")]
    assert exchange.outcome == "exhausted"


async def test_a_failure_after_output_is_forwarded_and_never_replayed() -> None:
    frames = [wire.CHAT_ROLE, wire.chat_chunk({"content": "Hello"}), OVERLOADED]
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(pieces=frames)], BACKUP: []})
    exchange, client = await play(upstreams, upstream(PRIMARY), upstream(BACKUP))
    assert upstreams.calls == [PRIMARY]
    assert client.body.startswith(b"".join(frames))
    (record,) = exchange.attempts
    assert (record.outcome, record.status, record.message) == ("committed", 503, "provider overloaded")
    assert exchange.suppressed_failover


async def test_a_stream_that_breaks_after_output_ends_with_an_in_band_error_never_a_replay() -> None:
    frames = [wire.CHAT_ROLE, wire.chat_chunk({"content": "Hel"})]
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(pieces=frames, broken=ConnectionResetError("reset"))],
                                   BACKUP: []})
    exchange, client = await play(upstreams, upstream(PRIMARY), upstream(BACKUP))
    assert upstreams.calls == [PRIMARY]
    head, _, tail = client.body.partition(b"".join(frames))
    assert head == b"" and b"upstream connection broke after output" in tail and b"stream_cut" in tail
    assert exchange.outcome == "stream_cut"


async def test_a_non_streaming_answer_commits_whole() -> None:
    body = json.dumps(wire.chat_completion("hi")).encode()
    upstreams = ScriptedUpstreams({PRIMARY: [Scripted(200, JSON, [body[:10], body[10:]])]})
    exchange, client = await play(upstreams, upstream(PRIMARY), stream=False)
    assert (client.status, client.body, client.whole) == (200, body, True)
    assert [(r.outcome, r.phase) for r in exchange.attempts] == [("committed", "output")]


def test_which_upstream_comes_next_is_a_value() -> None:
    primary, backup = upstream(PRIMARY, retries=1), upstream(BACKUP)
    first = first_try((primary, backup))
    assert (first.upstream, first.tries, first.has_next) == (primary, 1, True)
    again = next_try((primary, backup), first, Plan("retry", 0.1))
    assert again is not None and (again.upstream, again.tries) == (primary, 2)
    moved = next_try((primary, backup), again, Plan("next_upstream"))
    assert moved is not None and (moved.upstream, moved.tries, moved.has_next) == (backup, 1, False)
    assert next_try((primary, backup), moved, Plan("give_up")) is None


def test_a_failures_verdict_weighs_the_budget_and_retry_after() -> None:
    settings = AttemptSettings()
    policy = ErrorPolicy(settings.retry_on)
    turn = first_try((upstream(PRIMARY, retries=1), upstream(BACKUP)))
    overloaded = ErrorInfo(status=503, message="overloaded")
    verdict = judge(overloaded, turn, settings, policy, headers={"retry-after": "2"})
    assert (verdict.outcome, verdict.plan.delay_s) == ("retry", 2.0)
    assert judge(overloaded, turn, settings, policy, headers={"retry-after": "60"}).outcome == "next_upstream"
    assert judge(overloaded, turn, settings, policy, timed_out=True).outcome == "next_upstream"
    assert judge(ErrorInfo(status=401, message="bad key"), turn, settings, policy).outcome == "fatal"
