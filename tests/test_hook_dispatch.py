"""mitmproxy's hook dispatch without its ceremony for entries that have no such hook
(addons/hook_dispatch.py): for any addon chain, the same hooks run in the same order
and the same errors are logged as with mitmproxy's own `trigger_event`; installed
only over mitmproxy's own, and put back when the last Router is done."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import exceptions, hooks
from mitmproxy.addonmanager import AddonManager

from switchyard_core.addons import hook_dispatch
from switchyard_core.rules import SHIPPED_RULES
from tests.test_hooks import routing

MITMPROXYS = AddonManager.__dict__["trigger_event"]
Dispatch = Callable[[AddonManager, hooks.Hook], Coroutine[Any, Any, None]]
# each hook attribute a sample entry can have; "addons" children are drawn separately
KINDS = ["absent", "falsy", "plain", "awaits", "raises", "halts", "not_callable", "module", "unreadable"]


class Entry:
    """An addon whose hook (`update`, or `configure`) behaves as its kind says."""

    def __init__(self, ident: int, kind: str, hook: str, calls: list[str], children: list[Any] | None) -> None:
        self.ident, self.kind, self.calls = ident, kind, calls
        if children is not None:
            self.addons = children
        if kind == "falsy":
            setattr(self, hook, 0)
        elif kind in ("plain", "raises", "halts"):
            setattr(self, hook, self._plain)
        elif kind == "awaits":
            setattr(self, hook, self._awaits)
        elif kind == "not_callable":
            setattr(self, hook, 5)  # mitmproxy reports it as an addon error
        elif kind == "module":
            setattr(self, hook, types.ModuleType(hook))  # mitmproxy skips it

    def _plain(self, *_args: Any) -> None:
        self.calls.append(f"{self.ident}")
        if self.kind == "raises":
            raise ValueError(f"entry {self.ident} failed")
        if self.kind == "halts":
            raise exceptions.AddonHalt()

    async def _awaits(self, *_args: Any) -> None:
        await asyncio.sleep(0)
        self.calls.append(f"{self.ident} awaited")

    def __repr__(self) -> str:
        return f"Entry({self.ident})"


class Unreadable(Entry):
    """Reading its hook attribute raises: mitmproxy's `getattr` meets it and reports it."""

    def __getattr__(self, name: str) -> Any:
        if name in ("update", "configure"):
            raise RuntimeError(f"entry {self.ident} cannot be read")
        raise AttributeError(name)


@st.composite
def chains(draw: st.DrawFn) -> tuple[str, list[tuple[str, Any]]]:
    """A hook name and a chain's shape: (kind, children or None or "broken") per entry."""

    def shape(depth: int) -> tuple[str, Any]:
        kind = draw(st.sampled_from(KINDS))
        children: Any = None
        if depth < 2 and draw(st.integers(0, 3)) == 0:
            children = [shape(depth + 1) for _ in range(draw(st.integers(0, 3)))]
        elif draw(st.integers(0, 15)) == 0:
            children = "broken"  # an `addons` that is not a list: mitmproxy's walk fails on it
        return kind, children

    return draw(st.sampled_from(["update", "configure"])), [shape(0) for _ in range(draw(st.integers(0, 6)))]


def build(hook: str, shapes: list[tuple[str, Any]], calls: list[str], counter: Iterator[int]) -> list[Any]:
    built = []
    for kind, children in shapes:
        kids = 5 if children == "broken" else None if children is None else build(hook, children, calls, counter)
        cls = Unreadable if kind == "unreadable" else Entry
        built.append(cls(next(counter), kind, hook, calls, kids))
    return built


@contextmanager
def logged_errors() -> Iterator[list[str]]:
    """What mitmproxy's `safecall` logs while inside."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("mitmproxy.addonmanager")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def dispatch(function: Dispatch, hook: str, shapes: list[tuple[str, Any]]) -> tuple[list[str], list[str]]:
    """Which hooks ran, in order, and what was logged, with `function` as `trigger_event`."""
    calls: list[str] = []
    manager = AddonManager.__new__(AddonManager)
    manager.chain = build(hook, shapes, calls, iter(range(1000)))
    event = hooks.UpdateHook([]) if hook == "update" else hooks.ConfigureHook(set())
    with logged_errors() as errors:
        asyncio.run(function(manager, event))
    return calls, errors


@settings(max_examples=300, deadline=None)
@given(chains())
def test_any_chain_runs_the_same_hooks_in_the_same_order_with_the_same_errors(
        drawn: tuple[str, list[tuple[str, Any]]]) -> None:
    hook, shapes = drawn
    assert dispatch(hook_dispatch.trigger_event, hook, shapes) == dispatch(MITMPROXYS, hook, shapes)


def test_a_hook_that_raises_is_reported_and_the_chain_goes_on_and_addonhalt_stops_it() -> None:
    """The cases the equivalence test draws, spelled out once, with what a user sees."""
    shapes = [("absent", None), ("raises", None), ("absent", [("awaits", None), ("not_callable", None)]),
              ("module", None), ("halts", None), ("plain", None)]
    calls, errors = dispatch(hook_dispatch.trigger_event, "update", shapes)
    assert calls == ["1", "2 awaited", "6"]  # (children are numbered before their parent)
    assert errors == ["Addon error: entry 1 failed", "Addon error: Addon handler update (Entry(3)) not callable"]


def test_installed_over_mitmproxys_own_and_put_back() -> None:
    try:
        assert hook_dispatch.install() is None
        assert AddonManager.__dict__["trigger_event"] is hook_dispatch.trigger_event
        assert hook_dispatch.install() is None  # once is enough
    finally:
        hook_dispatch.uninstall()
    assert AddonManager.__dict__["trigger_event"] is MITMPROXYS


def test_a_dispatch_wrapped_after_ours_is_not_unwrapped_when_ours_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another addon (a profiler, say) that wrapped the dispatch after Switchyard
    installed its own keeps its wrapper when Switchyard is unloaded."""
    monkeypatch.setattr(AddonManager, "trigger_event", MITMPROXYS)  # what the test's end puts back
    assert hook_dispatch.install() is None
    try:
        async def wrapper(self: AddonManager, event: hooks.Hook) -> None:
            await hook_dispatch.trigger_event(self, event)

        monkeypatch.setattr(AddonManager, "trigger_event", wrapper)
    finally:
        hook_dispatch.uninstall()
    assert AddonManager.__dict__["trigger_event"] is wrapper


def test_a_dispatch_someone_else_replaced_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    async def theirs(self: AddonManager, event: hooks.Hook) -> None:
        await MITMPROXYS(self, event)

    monkeypatch.setattr(AddonManager, "trigger_event", theirs)
    why = hook_dispatch.install()
    assert why == "AddonManager.trigger_event is not mitmproxy's own (something else replaced it)"
    assert AddonManager.__dict__["trigger_event"] is theirs


def test_a_mitmproxy_that_dispatches_differently_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A later mitmproxy whose dispatch no longer matches this one (here: the chain
    backwards) fails the check at start-up, and dispatches as it does."""

    async def backwards(self: AddonManager, event: hooks.Hook) -> None:
        for addon in reversed(self.chain):
            try:
                await self.invoke_addon(addon, event)
            except exceptions.AddonHalt:
                return

    backwards.__module__ = "mitmproxy.addonmanager"
    monkeypatch.setattr(AddonManager, "trigger_event", backwards)
    why = hook_dispatch.install()
    assert why is not None and why.startswith("mitmproxy dispatches hooks differently than this version expects")
    assert AddonManager.__dict__["trigger_event"] is backwards


async def test_the_router_puts_it_in_place_while_it_runs(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(SHIPPED_RULES.read_text())
    with routing(rules) as router:
        router.running()
        try:
            assert AddonManager.__dict__["trigger_event"] is hook_dispatch.trigger_event
        finally:
            router.done()
        assert AddonManager.__dict__["trigger_event"] is MITMPROXYS
