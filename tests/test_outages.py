"""Outage memory (attempts/outages.py): what later requests skip, for how long, the one
probe, what is never remembered, and the order a request tries a route's upstreams in.
The clock is passed in: every time below is a plain number."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from switchyard_core.apis import Decision
from switchyard_core.attempts.outages import FailureKind, Outages, SkipReason, Visit
from switchyard_core.rules import AttemptSettings, Route, Upstream

UNREACHABLE, NO_ANSWER, ANSWERED, FATAL = (FailureKind.UNREACHABLE, FailureKind.NO_ANSWER, FailureKind.ANSWERED,
                                           FailureKind.FATAL)


def route(*names: str, name: str = "chat", **settings: float) -> Route:
    upstreams = tuple(Upstream(n, None, None, 1, None, ()) for n in names)
    return Route(name, "openai-chat", upstreams, replace(AttemptSettings(), **settings))


def tried(visit: Visit) -> list[str]:
    return [u.name for u in visit.order.upstreams]


def passed_over(visit: Visit) -> list[tuple[str, SkipReason, float]]:
    return [(c.upstream.name, c.skip.reason, c.skip.left_s) for c in visit.order.passed_over if c.skip]


CHAT = route("primary", "backup")


# --- nothing remembered -------------------------------------------------------------


def test_with_nothing_remembered_a_request_tries_the_upstreams_in_the_routes_order() -> None:
    visit = Outages().begin(CHAT, now=0.0)
    assert tried(visit) == ["primary", "backup"]
    assert visit.order.passed_over == () and not visit.order.all_skipped
    assert [c.probe for c in visit.order.tried] == [False, False]


# --- a stated delay -----------------------------------------------------------------


def test_a_stated_delay_makes_later_requests_skip_the_upstream_until_it_has_passed() -> None:
    outages = Outages()
    first = outages.begin(CHAT, now=0.0)
    skip = first.failed("primary", ANSWERED, now=1.0, retry_after_s=60, detail="429 rate_limit_error")
    assert skip is not None and (skip.reason, skip.until, skip.left_s) == (SkipReason.STATED_DELAY, 61.0, 60.0)
    later = outages.begin(CHAT, now=31.0)
    assert tried(later) == ["backup"]
    assert passed_over(later) == [("primary", SkipReason.STATED_DELAY, 30.0)]
    assert later.order.passed_over[0].skip.describe() == "said to wait 60s (429 rate_limit_error); 30.0s left"
    # once it has passed, every request goes back to it at once: the upstream said when
    assert tried(outages.begin(CHAT, now=61.0)) == tried(outages.begin(CHAT, now=61.0)) == ["primary", "backup"]
    assert outages.status(now=61.0) == []


def test_a_stated_delay_is_capped_by_max_skip_s_and_the_cap_is_said() -> None:
    outages = Outages()
    skip = outages.begin(route("primary", "backup", max_skip_s=120), now=0.0).failed(
        "primary", ANSWERED, now=0.0, retry_after_s=3600, detail="429")
    assert skip is not None and (skip.until, skip.asked_s, skip.capped) == (120.0, 3600, True)
    assert skip.why == "said to wait 3600s, capped by max_skip_s (429)"
    assert tried(outages.begin(CHAT, now=119.0)) == ["backup"]
    assert tried(outages.begin(CHAT, now=120.0)) == ["primary", "backup"]


def test_max_skip_s_of_zero_keeps_a_stated_delay_within_the_request_that_got_it() -> None:
    outages = Outages()
    no_memory = route("primary", "backup", max_skip_s=0)
    assert outages.begin(no_memory, now=0.0).failed("primary", ANSWERED, now=0.0, retry_after_s=30) is None
    assert tried(outages.begin(no_memory, now=1.0)) == ["primary", "backup"]


def test_the_upstreams_latest_stated_delay_replaces_the_one_before_even_when_shorter() -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", ANSWERED, now=0.0, retry_after_s=120)
    outages.begin(CHAT, now=10.0).failed("primary", ANSWERED, now=10.0, retry_after_s=5)
    assert tried(outages.begin(CHAT, now=15.0)) == ["primary", "backup"]


# --- what is never remembered -------------------------------------------------------


@pytest.mark.parametrize("kind, delay", [
    (ANSWERED, None),  # overloaded_error, a 503 or 529 without Retry-After, an error frame, an empty stream
    (ANSWERED, 0.0),  # Retry-After: 0 says "now"
    (FATAL, 60.0),  # returned as sent: a delay beside it does not turn later requests away
])
def test_a_failure_that_states_no_delay_stays_with_its_request(kind: FailureKind, delay: float | None) -> None:
    outages = Outages()
    assert outages.begin(CHAT, now=0.0).failed("primary", kind, now=0.0, retry_after_s=delay) is None
    assert tried(outages.begin(CHAT, now=0.1)) == ["primary", "backup"]
    assert outages.status(now=0.1) == []


def test_an_answers_kind_comes_from_the_error_policys_decision() -> None:
    assert FailureKind.of_answer(Decision.RETRY) is ANSWERED
    assert FailureKind.of_answer(Decision.NEXT_UPSTREAM) is ANSWERED
    assert FailureKind.of_answer(Decision.FATAL) is FATAL


# --- an upstream that cannot be reached, and its probe --------------------------------


@pytest.mark.parametrize("kind, reason", [(UNREACHABLE, SkipReason.UNREACHABLE), (NO_ANSWER, SkipReason.NO_ANSWER)])
def test_an_unreachable_or_silent_upstream_is_skipped_for_unreachable_skip_s(kind: FailureKind, reason: SkipReason) -> None:
    outages = Outages()
    skip = outages.begin(CHAT, now=0.0).failed("primary", kind, now=2.0, detail="connection refused")
    assert skip is not None and (skip.reason, skip.until) == (reason, 12.0)
    later = outages.begin(CHAT, now=5.0)
    assert tried(later) == ["backup"]
    assert passed_over(later) == [("primary", reason, 7.0)]


def test_after_unreachable_skip_s_one_request_probes_the_upstream_and_the_others_keep_skipping_it() -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0, detail="connection refused")
    probe = outages.begin(CHAT, now=10.0)
    assert tried(probe) == ["primary", "backup"] and [c.probe for c in probe.order.tried] == [True, False]
    assert probe.probes == {"primary"}
    other = outages.begin(CHAT, now=10.5)
    assert tried(other) == ["backup"]
    assert other.order.passed_over[0].skip.describe() == "cannot be reached (connection refused); a probe is in flight"
    assert probe.succeeded("primary", now=11.0) is not None  # the skip that ended, for a log line
    after = outages.begin(CHAT, now=11.5)
    assert tried(after) == ["primary", "backup"] and not any(c.probe for c in after.order.tried)
    assert outages.status(now=11.5) == []


def test_a_probe_that_fails_to_reach_it_again_starts_the_skip_again() -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    probe = outages.begin(CHAT, now=10.0)
    skip = probe.failed("primary", NO_ANSWER, now=40.0, detail="no response headers within 30s")
    assert skip is not None and (skip.reason, skip.until, skip.probing) == (SkipReason.NO_ANSWER, 50.0, False)
    assert probe.probes == frozenset()
    assert tried(outages.begin(CHAT, now=49.0)) == ["backup"]
    assert [c.probe for c in outages.begin(CHAT, now=50.0).order.tried] == [True, False]


@pytest.mark.parametrize("kind", [ANSWERED, FATAL])
def test_an_answer_of_any_kind_ends_the_memory_of_being_unreachable_and_is_not_remembered_itself(kind: FailureKind) -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    probe = outages.begin(CHAT, now=10.0)
    assert probe.failed("primary", kind, now=10.5, detail="503 overloaded_error") is None  # it answered: reachable
    assert tried(outages.begin(CHAT, now=11.0)) == ["primary", "backup"]
    assert outages.status(now=11.0) == []


def test_a_probe_answered_with_a_stated_delay_leaves_that_delay_to_be_honoured() -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    probe = outages.begin(CHAT, now=10.0)
    skip = probe.failed("primary", ANSWERED, now=10.0, retry_after_s=30)
    assert skip is not None and (skip.reason, skip.until) == (SkipReason.STATED_DELAY, 40.0)
    assert tried(outages.begin(CHAT, now=39.0)) == ["backup"]
    at_forty = outages.begin(CHAT, now=40.0)
    assert tried(at_forty) == ["primary", "backup"] and not at_forty.probes  # a stated delay ends for everyone


def test_a_probe_whose_request_ends_without_a_verdict_lets_the_next_request_probe() -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    gone = outages.begin(CHAT, now=10.0)  # the client leaves before the probe's verdict
    assert tried(outages.begin(CHAT, now=10.1)) == ["backup"]
    gone.end()
    assert [c.probe for c in outages.begin(CHAT, now=10.2).order.tried] == [True, False]


def test_a_probe_claimed_by_a_request_that_answers_from_an_earlier_upstream_goes_to_the_next_request() -> None:
    """Nothing is tried after output, so a probe the request would have made later is let go at once."""
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("backup", UNREACHABLE, now=0.0)
    visit = outages.begin(CHAT, now=10.0)
    assert visit.probes == {"backup"}
    assert visit.succeeded("primary", now=10.5) is None  # primary had nothing to forget
    assert outages.begin(CHAT, now=10.6).probes == {"backup"}


def test_a_request_that_finds_it_unreachable_while_another_probes_it_leaves_that_probe_the_one_probe() -> None:
    outages = Outages()
    alone = route("primary")
    outages.begin(alone, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    probe = outages.begin(alone, now=10.0)
    meanwhile = outages.begin(alone, now=11.0)  # its only upstream is skipped: tried anyway, not as a probe
    assert meanwhile.order.all_skipped and not meanwhile.probes
    skip = meanwhile.failed("primary", UNREACHABLE, now=12.0)
    assert skip is not None and (skip.until, skip.probing) == (22.0, True)
    assert not outages.begin(alone, now=23.0).probes  # the first probe has not said yet
    probe.end()
    assert outages.begin(alone, now=24.0).probes == {"primary"}


def test_a_probe_ended_by_another_requests_answer_is_no_longer_held() -> None:
    outages = Outages()
    alone = route("primary")
    outages.begin(alone, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    probe = outages.begin(alone, now=10.0)
    outages.begin(alone, now=10.5).succeeded("primary", now=11.0)  # tried anyway, and it answered
    assert probe.probes == frozenset()
    outages.begin(alone, now=12.0).failed("primary", UNREACHABLE, now=12.0)  # down again
    assert outages.begin(alone, now=22.0).probes == {"primary"}  # the new skip's probe, not the old holder's


def test_unreachable_skip_s_of_zero_remembers_no_unreachable_upstream() -> None:
    outages = Outages()
    off = route("primary", "backup", unreachable_skip_s=0)
    assert outages.begin(off, now=0.0).failed("primary", UNREACHABLE, now=0.0) is None
    assert tried(outages.begin(off, now=0.1)) == ["primary", "backup"]


def test_a_stated_delay_is_not_cut_short_by_an_unreachable_skip_that_would_end_sooner() -> None:
    outages = Outages()
    outages.begin(CHAT, now=0.0).failed("primary", ANSWERED, now=0.0, retry_after_s=100)
    skip = outages.begin(CHAT, now=1.0).failed("primary", UNREACHABLE, now=1.0)
    assert skip is not None and (skip.reason, skip.until) == (SkipReason.STATED_DELAY, 100.0)
    assert tried(outages.begin(CHAT, now=50.0)) == ["backup"]


# --- every upstream skipped -----------------------------------------------------------


def test_when_every_upstream_is_skipped_all_are_tried_the_one_due_soonest_first() -> None:
    outages = Outages()
    three = route("a", "b", "c")
    visit = outages.begin(three, now=0.0)
    visit.failed("a", ANSWERED, now=0.0, retry_after_s=50)
    visit.failed("b", UNREACHABLE, now=0.0)  # due at 10
    visit.failed("c", ANSWERED, now=0.0, retry_after_s=20)
    later = outages.begin(three, now=5.0)
    assert later.order.all_skipped and later.order.passed_over == ()
    assert tried(later) == ["b", "c", "a"]
    assert [c.skip.left_s for c in later.order.tried if c.skip] == [5.0, 15.0, 45.0]


def test_when_every_upstream_is_skipped_and_due_together_the_routes_order_holds() -> None:
    outages = Outages()
    visit = outages.begin(CHAT, now=0.0)
    visit.failed("backup", UNREACHABLE, now=0.0)
    visit.failed("primary", UNREACHABLE, now=0.0)
    assert tried(outages.begin(CHAT, now=1.0)) == ["primary", "backup"]


# --- status, forgetting, keys ---------------------------------------------------------


def test_status_lists_each_skipped_upstream_once_with_why_and_what_is_left() -> None:
    outages = Outages()
    visit = outages.begin(route("a", "b", "c"), now=0.0)
    visit.failed("a", ANSWERED, now=0.0, retry_after_s=600, detail="429 rate_limit_error")
    visit.failed("b", NO_ANSWER, now=0.0, detail="no response headers within 30s")
    visit.failed("c", ANSWERED, now=0.0, detail="503 overloaded_error")  # not remembered: not listed
    assert outages.status(now=4.0) == [
        "route=chat upstream=a skipped: said to wait 600s, capped by max_skip_s (429 rate_limit_error); 296.0s left",
        "route=chat upstream=b skipped: did not answer (no response headers within 30s); 6.0s left",
    ]
    assert outages.status(now=11.0)[1] == ("route=chat upstream=b skipped: did not answer (no response headers "
                                           "within 30s); the next request probes it")


def test_forgetting_drops_everything_and_what_earlier_requests_report_afterwards() -> None:
    outages = Outages()
    before = outages.begin(CHAT, now=0.0)
    before.failed("primary", UNREACHABLE, now=0.0)
    outages.forget()  # the rules were reloaded
    assert outages.status(now=1.0) == [] and tried(outages.begin(CHAT, now=1.0)) == ["primary", "backup"]
    assert before.failed("backup", UNREACHABLE, now=2.0) is None  # learnt under the old rules: dropped
    before.end()
    assert tried(outages.begin(CHAT, now=3.0)) == ["primary", "backup"]


def test_memory_is_per_route_even_for_an_upstream_of_the_same_name() -> None:
    outages = Outages()
    other = route("primary", "backup", name="messages")
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    assert tried(outages.begin(other, now=1.0)) == ["primary", "backup"]
    assert tried(outages.begin(CHAT, now=1.0)) == ["backup"]


def test_each_route_remembers_by_its_own_settings() -> None:
    outages = Outages()
    patient = route("primary", "backup", name="patient", unreachable_skip_s=60)
    outages.begin(patient, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    outages.begin(CHAT, now=0.0).failed("primary", UNREACHABLE, now=0.0)
    assert tried(outages.begin(CHAT, now=30.0)) == ["primary", "backup"]  # probed
    assert tried(outages.begin(patient, now=30.0)) == ["backup"]


# --- whatever happens -----------------------------------------------------------------

NAMES = ("a", "b", "c")
KINDS = st.sampled_from(list(FailureKind))
DELAYS = st.none() | st.floats(0, 1000, allow_nan=False)


class Memory(RuleBasedStateMachine):
    """Any sequence of requests, verdicts, ends, reloads and passing time."""

    @initialize(size=st.integers(1, 3), max_skip=st.sampled_from([0.0, 30.0, 300.0]),
                unreachable=st.sampled_from([0.0, 10.0]))
    def start(self, size: int, max_skip: float, unreachable: float) -> None:
        self.outages = Outages()
        self.route = route(*NAMES[:size], max_skip_s=max_skip, unreachable_skip_s=unreachable)
        self.now = 0.0
        self.open: list[Visit] = []
        self.stale: set[int] = set()  # visits begun before the last reload: what they report is dropped

    @rule(seconds=st.floats(0, 400, allow_nan=False))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def a_request_begins(self) -> None:
        live = {r.upstream: r.skip for r in self.outages.remembered(self.now)
                if r.skip.left_s > 0 or r.skip.probing}  # what is skipped, as the status shows it
        visit = self.outages.begin(self.route, self.now)
        order = visit.order
        assert order.tried, "a request is never failed without a try"
        assert sorted(c.upstream.name for c in order.tried + order.passed_over) == sorted(NAMES[:len(self.route.upstreams)])
        not_skipped = [u.name for u in self.route.upstreams if u.name not in live]
        if not_skipped:
            assert tried(visit) == not_skipped, "no upstream with a live skip is tried before one without"
            assert all(c.skip is None for c in order.tried)
        else:
            assert order.all_skipped
            dues = [c.skip.until for c in order.tried if c.skip]
            assert dues == sorted(dues), "when all are skipped, the one due soonest goes first"
        self.open.append(visit)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), kind=KINDS, delay=DELAYS)
    def an_attempt_fails(self, data: st.DataObject, kind: FailureKind, delay: float | None) -> None:
        visit = data.draw(st.sampled_from(self.open))
        upstream = data.draw(st.sampled_from(tried(visit)))
        before = {r.upstream for r in self.outages.remembered(self.now)}
        skip = visit.failed(upstream, kind, self.now, retry_after_s=delay)
        after = {r.upstream for r in self.outages.remembered(self.now)}
        if kind is FATAL or (kind is ANSWERED and not delay):
            assert after <= before, "a failure that states no delay is never remembered"
        if skip is not None:  # up to the float error of `until - now`
            assert skip.left_s <= max(self.route.settings.max_skip_s, self.route.settings.unreachable_skip_s) + 1e-6

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def an_attempt_answers(self, data: st.DataObject) -> None:
        visit = data.draw(st.sampled_from(self.open))
        upstream = data.draw(st.sampled_from(tried(visit)))
        before = {r.upstream for r in self.outages.remembered(self.now)}
        visit.succeeded(upstream, self.now)
        after = {r.upstream for r in self.outages.remembered(self.now)}
        assert after == (before if visit.id in self.stale else before - {upstream}), "an answer ends its memory"
        assert not visit.probes, "nothing is tried after output: its other probes are let go"

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def a_request_ends(self, data: st.DataObject) -> None:
        visit = data.draw(st.sampled_from(self.open))
        visit.end()
        self.open.remove(visit)

    @rule()
    def the_rules_are_reloaded(self) -> None:
        self.outages.forget()
        self.stale |= {visit.id for visit in self.open}
        assert self.outages.remembered(self.now) == []

    @invariant()
    def one_probe_at_a_time(self) -> None:
        claimed = [name for visit in getattr(self, "open", []) for name in visit.probes]
        assert len(claimed) == len(set(claimed))


TestMemory = Memory.TestCase
TestMemory.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
