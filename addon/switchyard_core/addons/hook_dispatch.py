"""mitmproxy's hook dispatch, without its ceremony for addons that have no such hook.

Every hook of every flow (and the `update` mitmproxy triggers after each) goes
through `AddonManager.trigger_event`, which visits every entry of the addon
chain the same way: it enters `safecall` (a generator-based context manager),
creates and awaits an `invoke_addon` coroutine, and walks the entry's tree
with two generators looking for the hook, whether or not anything there has
it.  Most entries of mitmdump's chain have none of a flow's hooks, so that
ceremony is most of what a hook costs, and a flow has many hooks: measured,
a large share of a burst's time to its first tokens, in plain mitmdump and
in Switchyard alike, and on the first token's path wherever a hook is
(docs/benchmarks.md, "Sixth pass").  Switchyard holds each answer's head in
a hook until the answer is decided, so the rest of that hook's dispatch and
its `update` are on every first token's path.

`trigger_event` here first asks each entry, with plain `getattr`, whether
anything in its tree has the hook: a truthy attribute of that name, which is
what mitmproxy's `_iter_hooks` looks for before it decides to call it, skip
it (a module of that name) or complain about it (anything else).  Only those
entries go through mitmproxy's own `invoke_addon` inside its own `safecall`,
in chain order, and `AddonHalt` ends the dispatch as before.  An entry whose
attributes cannot even be read is left to mitmproxy's path, which reports
the error as it always did.  So the same hooks run in the same order with
the same errors logged; an entry with nothing to run is passed by.

`install` puts it in place only if `trigger_event` is still mitmproxy's own
and dispatches a sample chain exactly as this one does (checked once, at
start-up); `uninstall` puts mitmproxy's back.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Coroutine
from typing import Any

from mitmproxy import exceptions, hooks
from mitmproxy.addonmanager import AddonManager, safecall


def _has_hook(addon: Any, name: str) -> bool:
    """Whether mitmproxy's `_iter_hooks` finds anything in `addon`'s tree to call or report."""
    try:
        if getattr(addon, name, None):
            return True
        return hasattr(addon, "addons") and any(_has_hook(child, name) for child in addon.addons)
    except Exception:  # noqa: BLE001 -- mitmproxy's own path meets it again and reports it
        return True


async def trigger_event(self: AddonManager, event: hooks.Hook) -> None:
    """mitmproxy's `AddonManager.trigger_event`, passing by entries with nothing to run."""
    name = event.name
    for addon in self.chain:
        try:  # `_has_hook`, unrolled for the chain's own entries: most have neither
            if not getattr(addon, name, None) and not (hasattr(addon, "addons") and _has_hook(addon, name)):
                continue
        except Exception:  # noqa: BLE001 -- as in `_has_hook`
            pass
        try:
            with safecall():
                await self.invoke_addon(addon, event)
        except exceptions.AddonHalt:
            return


# --- the check at start-up --------------------------------------------------------


class _Calls:
    """A sample entry's `update` hook: records its name, then maybe ends the dispatch."""

    def __init__(self, calls: list[str], name: str, *, halt: bool = False, awaited: bool = False) -> None:
        self.calls, self.name, self.halt = calls, name, halt
        self.update: Callable[[Any], Any] = self._awaited if awaited else self._plain

    def _plain(self, _flows: Any) -> None:
        self.calls.append(self.name)
        if self.halt:
            raise exceptions.AddonHalt()

    async def _awaited(self, flows: Any) -> None:
        self._plain(flows)


class _Holder:
    """A sample entry with no hook of its own, and children (like a loaded script)."""

    def __init__(self, addons: list[Any], update: Any = None) -> None:
        self.addons = addons
        if update is not None:
            self.update = update


def _sample(calls: list[str]) -> list[Any]:
    return [
        _Holder([]),  # nothing at all
        _Holder([], update=0),  # falsy: no hook
        _Holder([_Calls(calls, "nested"), _Holder([_Calls(calls, "deeper", awaited=True)])]),
        _Holder([], update=types.ModuleType("update")),  # a module of the hook's name: skipped
        _Calls(calls, "halts", halt=True),
        _Calls(calls, "never"),  # after AddonHalt
    ]


def _dispatch(function: Callable[[AddonManager, hooks.Hook], Coroutine[Any, Any, None]]) -> list[str]:
    """The sample chain's calls, as `function` makes them (nothing in it waits)."""
    calls: list[str] = []
    manager = AddonManager.__new__(AddonManager)  # trigger_event reads only `chain`
    manager.chain = _sample(calls)
    coroutine = function(manager, hooks.UpdateHook([]))
    try:
        coroutine.send(None)
    except StopIteration:
        return calls
    coroutine.close()
    raise RuntimeError("the sample dispatch waited")


_installed: Callable[..., Any] | None = None  # mitmproxy's own trigger_event, while ours is in place


def install() -> str | None:
    """Put `trigger_event` in place: None once it is in use, else why not (then
    mitmproxy dispatches as it always does)."""
    global _installed
    if _installed is not None:
        return None
    original = AddonManager.__dict__.get("trigger_event")
    if getattr(original, "__module__", None) != "mitmproxy.addonmanager" or not callable(original):
        return "AddonManager.trigger_event is not mitmproxy's own (something else replaced it)"
    try:
        theirs, ours = _dispatch(original), _dispatch(trigger_event)
    except Exception as exc:  # noqa: BLE001 -- any surprise means: leave mitmproxy's as it is
        return f"mitmproxy's hook dispatch moved: {type(exc).__name__}: {exc}"
    if theirs != ours:
        return f"mitmproxy dispatches hooks differently than this version expects ({theirs} != {ours})"
    setattr(AddonManager, "trigger_event", trigger_event)
    _installed = original
    return None


def uninstall() -> None:
    """mitmproxy's own again (the script is unloaded), unless something replaced ours
    since: then that stays, and keeps calling ours."""
    global _installed
    if _installed is not None:
        if AddonManager.__dict__.get("trigger_event") is trigger_event:
            setattr(AddonManager, "trigger_event", _installed)
        _installed = None
