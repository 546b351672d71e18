"""Outage memory and hedged attempts through a real mitmdump, counted at loopback
upstreams: how many requests reach a failed upstream during an outage, what is
never remembered, the cap, the probe; a hedge won by either side with exactly one
upstream's bytes at the client.

Memory lives as long as the rules: each test has a route of its own (its own
path prefix), so what one test teaches the proxy does not reach another.  No test
asserts how fast anything was; timings only choose which rule applies."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import CurlResult, Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import Mitmdump, mitmdump_on, refused_port

ROUTE = """\
  - name: {name}
    match: {{path: /{name}/v1/chat/completions}}
{extra}    upstreams:
      - {{name: {name}, url: original, retries: 1}}
      - {{name: backup-{name}, url: "http://127.0.0.1:{port}/backup-{name}/v1/chat/completions"}}
"""

ROUTES = {
    "stated": "",  # a 429 with Retry-After
    "capacity": "",  # a 503 that states no delay
    "capped": "    max_skip_s: 1\n",
    "hung": "    headers_timeout_s: 0.5\n    unreachable_skip_s: 1.5\n",
    "hedged": "    hedge_after_s: 0.4\n",
    "hedgelost": "    hedge_after_s: 0.4\n",
}


@pytest.fixture(scope="module")
def remembering(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    routes = "".join(ROUTE.format(name=name, extra=extra, port=provider.ports[1]) for name, extra in ROUTES.items())
    dead = refused_port()
    routes += ("  - name: refused\n    match: {path: /refused/v1/chat/completions}\n    unreachable_skip_s: 30\n"
               f"    upstreams:\n      - {{name: dead, url: \"http://127.0.0.1:{dead}/dead/v1/chat/completions\"}}\n"
               f"      - {{name: backup-refused, url: \"http://127.0.0.1:{provider.ports[1]}/backup-refused"
               "/v1/chat/completions\"}\n")
    text = ("version: 1\ndefaults: {backoff_ms: 1, max_backoff_ms: 300, pre_answer_keepalive_s: 0}\nroutes:\n"
            + routes)
    with mitmdump_on(tmp_path_factory.mktemp("outages"), text,
                     reverse_target=f"http://127.0.0.1:{provider.ports[0]}") as dump:
        yield dump


@pytest.fixture
def oenv(provider: FakeProvider, remembering: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, remembering, remembering.log_path.parent / "rules.yaml")
    provider.reset()


def ask(oenv: Env, route: str) -> CurlResult:
    return oenv.curl(oenv.provider.url(route, "/v1/chat/completions"), oenv.chat_body())


def answer(upstream: str) -> bytes:
    return b"".join(wire.chat_stream(wire.answer_text(upstream)))


def posts(oenv: Env, upstream: str) -> int:
    return len(oenv.provider.calls_to(upstream))


def rate_limited(seconds: str) -> Reply:
    return Reply.json(429, {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}},
                      headers={"Retry-After": seconds})


def test_an_upstream_that_said_to_wait_is_asked_once_during_its_outage(oenv: Env) -> None:
    oenv.provider.script("stated", *[rate_limited("60")] * 10)
    mark = oenv.mitm.log_mark()
    for _ in range(5):
        assert ask(oenv, "stated").body == answer("backup-stated")
    assert posts(oenv, "stated") == 1  # not five, and not retried: it said to wait a minute
    assert posts(oenv, "backup-stated") == 5
    log = oenv.mitm.wait_for_log("switchyard.skipped", mark)
    assert log.count("switchyard.skipped route=stated upstream=stated") == 4
    assert 'why="said to wait 60s (429 rate_limit_exceeded)"' in log


def test_a_capacity_failure_that_states_no_delay_costs_only_its_own_request(oenv: Env) -> None:
    overloaded = Reply.sse(wire.chat_error(503, "provider overloaded"))
    oenv.provider.script("capacity", *[overloaded] * 6)
    for _ in range(3):
        assert ask(oenv, "capacity").body == answer("backup-capacity")
    assert posts(oenv, "capacity") == 6  # every request asks it again (and retries once): never cooled down
    assert "switchyard.skipped route=capacity" not in oenv.mitm.log_since(0)


def test_a_stated_delay_is_honoured_only_up_to_max_skip_s(oenv: Env) -> None:
    oenv.provider.script("capped", rate_limited("3600"))
    assert ask(oenv, "capped").body == answer("backup-capped")
    assert ask(oenv, "capped").body == answer("backup-capped")
    assert posts(oenv, "capped") == 1
    time.sleep(1.2)  # past max_skip_s: asked again (and it answers now)
    assert ask(oenv, "capped").body == answer("capped")
    assert posts(oenv, "capped") == 2


def test_a_hung_upstream_costs_one_request_then_is_probed_by_one(oenv: Env) -> None:
    hung = Reply.sse(*wire.chat_stream("too late"))
    hung.delay_headers_s = 3.0
    oenv.provider.script("hung", hung, hung)
    mark = oenv.mitm.log_mark()
    assert ask(oenv, "hung").body == answer("backup-hung")  # this one waits headers_timeout_s
    for _ in range(3):
        assert ask(oenv, "hung").body == answer("backup-hung")  # these go straight to the backup
    assert posts(oenv, "hung") == 1
    time.sleep(1.6)  # unreachable_skip_s passed: the next request probes it (it is still hung)
    assert ask(oenv, "hung").body == answer("backup-hung")
    assert posts(oenv, "hung") == 2
    log = oenv.mitm.log_since(mark)
    assert 'switchyard.skipped route=hung upstream=hung why="did not answer' in log


def test_an_unreachable_upstream_is_skipped_by_later_requests(oenv: Env) -> None:
    mark = oenv.mitm.log_mark()
    for _ in range(3):
        assert ask(oenv, "refused").body == answer("backup-refused")
    log = oenv.mitm.wait_for_log("switchyard.skipped", mark)
    failed = [line for line in log.splitlines() if "switchyard.attempt_failed route=refused upstream=dead" in line]
    assert len(failed) == 2  # the first request's try and its retry; none after
    assert log.count("switchyard.skipped route=refused upstream=dead") == 2


def test_a_slow_start_is_hedged_and_the_hedge_answers(oenv: Env) -> None:
    slow = Reply.sse(wire.CHAT_ROLE, 3.0, *wire.chat_stream("SLOW PRIMARY")[1:])
    oenv.provider.script("hedged", slow)
    mark = oenv.mitm.log_mark()
    result = ask(oenv, "hedged")
    assert result.body == answer("backup-hedged")  # exactly one upstream's bytes
    assert result.headers["x-switchyard-upstream"] == "backup-hedged"
    log = oenv.mitm.wait_for_log("switchyard.hedge_lost", mark)
    assert "switchyard.hedged route=hedged upstream=hedged attempt=1 also=backup-hedged" in log
    deadline = time.monotonic() + 10
    while oenv.provider.cancelled < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert oenv.provider.cancelled == 1  # the slow one was let go


def test_a_hedged_slow_start_may_still_win_and_the_hedge_is_let_go(oenv: Env) -> None:
    slower = Reply.sse(wire.CHAT_ROLE, 3.0, *wire.chat_stream("SLOWER BACKUP")[1:])
    oenv.provider.script("hedgelost", Reply.sse(wire.CHAT_ROLE, 0.8, *wire.chat_stream(wire.answer_text("hedgelost"))[1:]))
    oenv.provider.script("backup-hedgelost", slower)
    mark = oenv.mitm.log_mark()
    result = ask(oenv, "hedgelost")
    assert result.body == answer("hedgelost")
    assert b"SLOWER" not in result.body
    log = oenv.mitm.wait_for_log("switchyard.hedge_lost route=hedgelost upstream=backup-hedgelost", mark)
    assert "switchyard.hedged route=hedgelost" in log
