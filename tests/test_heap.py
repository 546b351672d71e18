"""Full collections moved to where no flow waits for its head (addons/heap.py).

The policy is driven here with a collector of the test's own, whose counts the
test sets, on a real event loop; the real `gc` module only for the thresholds
it leaves behind.  In a real mitmdump, the start-up line says it is active
(tests/test_e2e_direct.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterator

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from switchyard_core.addons import heap
from switchyard_core.addons.heap import DEFERRAL, QuietCollections


class Collector:
    """A `gc` stand-in: its counts are the test's; full collections are recorded."""

    def __init__(self, threshold: tuple[int, int, int] = (700, 10, 10)) -> None:
        self.threshold = threshold
        self.count = (0, 0, 0)
        self.full: list[int] = []  # len(full) collections, each noted with the count it ran at
        self.enabled = True

    def isenabled(self) -> bool:
        return self.enabled

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, threshold0: int, threshold1: int = 10, threshold2: int = 10, /) -> None:
        self.threshold = (threshold0, threshold1, threshold2)

    def get_count(self) -> tuple[int, int, int]:
        return self.count

    def collect(self, generation: int = 2) -> int:
        assert generation == 2
        self.full.append(self.count[2])
        self.count = (0, 0, 0)
        return 0


def flow(flow_id: str, live: bool = True) -> http.HTTPFlow:
    made = tflow.tflow(live=live)
    made.id = flow_id
    return made


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.fixture
def collector() -> Collector:
    return Collector()


@pytest.fixture
def quiet(collector: Collector) -> Iterator[QuietCollections]:
    addon = QuietCollections(collector)
    assert addon.defer() is None
    yield addon
    addon.restore()


def test_cpython_waits_longer_for_a_full_collection_and_gets_its_schedule_back(collector: Collector) -> None:
    addon = QuietCollections(collector)
    assert addon.defer() is None
    assert collector.threshold == (700, 10, 10 * DEFERRAL)
    assert addon.defer() is None and collector.threshold == (700, 10, 10 * DEFERRAL)  # once
    addon.restore()
    assert collector.threshold == (700, 10, 10)


def test_a_second_switchyard_script_defers_nothing_more(collector: Collector) -> None:
    first, second = QuietCollections(collector), QuietCollections(collector)
    assert first.defer() is None
    assert second.defer() == "another Switchyard script's QuietCollections moves them"
    assert collector.threshold == (700, 10, 10 * DEFERRAL)
    second.restore()  # changes nothing: it moved nothing
    assert collector.threshold == (700, 10, 10 * DEFERRAL)
    first.restore()
    assert collector.threshold == (700, 10, 10)
    assert second.defer() is None  # the first one unloaded: the next may
    second.restore()


def test_a_schedule_someone_else_changed_since_is_left_as_they_set_it(collector: Collector) -> None:
    addon = QuietCollections(collector)
    addon.defer()
    collector.set_threshold(1000, 20, 5)
    addon.restore()
    assert collector.threshold == (1000, 20, 5)


@pytest.mark.parametrize("threshold, enabled, reason", [
    ((700, 10, 0), True, "full collections are switched off"),
    ((700, 10, 10), False, "the garbage collector is disabled"),
])
def test_a_collector_it_cannot_move_is_left_alone_and_says_why(threshold: tuple[int, int, int], enabled: bool,
                                                                reason: str) -> None:
    collector = Collector(threshold)
    collector.enabled = enabled
    addon = QuietCollections(collector)
    assert addon.defer() == reason
    assert collector.threshold == threshold
    addon.requestheaders(flow("a"))  # nothing is tracked
    assert not addon._waiting


async def test_a_due_collection_waits_until_no_flow_waits_for_its_head(
        collector: Collector, quiet: QuietCollections) -> None:
    quiet.requestheaders(flow("a"))
    quiet.requestheaders(flow("b"))
    collector.count = (0, 0, 11)  # due by CPython's own threshold (more than 10)
    quiet.responseheaders(flow("a"))
    await settle()
    assert collector.full == []  # b still waits
    quiet.responseheaders(flow("b"))
    assert collector.full == []  # not in the pass that writes b's head
    await settle()
    assert collector.full == [11] and quiet.collections == 1


async def test_nothing_is_collected_before_it_is_due(collector: Collector, quiet: QuietCollections) -> None:
    quiet.requestheaders(flow("a"))
    collector.count = (0, 0, 10)
    quiet.responseheaders(flow("a"))
    await settle()
    assert collector.full == []


async def test_a_request_that_comes_before_the_collection_runs_puts_it_off(
        collector: Collector, quiet: QuietCollections) -> None:
    quiet.requestheaders(flow("a"))
    collector.count = (0, 0, 11)
    quiet.responseheaders(flow("a"))
    quiet.requestheaders(flow("b"))  # in the same pass
    await settle()
    assert collector.full == []
    quiet.error(flow("b"))  # a flow that failed waits no more either
    await settle()
    assert collector.full == [11]


async def test_an_answer_given_by_an_addon_ends_the_wait_too(collector: Collector, quiet: QuietCollections) -> None:
    quiet.requestheaders(flow("a"))
    collector.count = (0, 0, 11)
    quiet.response(flow("a"))  # no `responseheaders` for it
    await settle()
    assert collector.full == [11]
    quiet.responseheaders(flow("a"))  # its hooks after that change nothing
    quiet.response(flow("a"))
    await settle()
    assert collector.full == [11]


async def test_flows_read_from_a_file_are_not_waited_for(collector: Collector, quiet: QuietCollections) -> None:
    quiet.requestheaders(flow("old", live=False))
    quiet.requestheaders(flow("a"))
    collector.count = (0, 0, 11)
    quiet.responseheaders(flow("a"))
    await settle()
    assert collector.full == [11]


async def test_a_flow_whose_end_went_unseen_stops_counting_after_the_limit(
        collector: Collector, quiet: QuietCollections, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(heap.time, "monotonic", lambda: clock[0])
    quiet.requestheaders(flow("lost"))
    clock[0] += 10
    quiet.requestheaders(flow("a"))
    quiet.requestheaders(flow("b"))
    collector.count = (0, 0, 11)
    quiet.responseheaders(flow("a"))
    await settle()
    assert collector.full == []  # "lost" still counts
    clock[0] += heap.WAIT_LIMIT_S - 5  # "lost" past the limit, "b" not
    quiet.requestheaders(flow("c"))
    quiet.responseheaders(flow("c"))
    await settle()
    assert collector.full == [] and list(quiet._waiting) == ["b"]
    quiet.responseheaders(flow("b"))
    await settle()
    assert collector.full == [11]


def test_the_real_collectors_schedule_is_deferred_and_given_back() -> None:
    before = gc.get_threshold()
    addon = QuietCollections()
    why = addon.defer()
    try:
        if sys.version_info >= (3, 14):  # (the project's Pythons are 3.12 and 3.13)
            assert why is not None and "incremental" in why and gc.get_threshold() == before
        else:
            assert why is None and gc.get_threshold() == (before[0], before[1], before[2] * DEFERRAL)
    finally:
        addon.restore()
    assert gc.get_threshold() == before
