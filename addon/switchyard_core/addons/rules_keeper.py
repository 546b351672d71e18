"""Owns the active rules: the `switchyard_rules` option, reloads, hot edits.

A broken file at start-up is an ERROR log line naming file, line and field,
which makes mitmdump exit.  A broken edit during a run keeps the last good
rules and says why.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from mitmproxy import addonmanager, command, ctx, exceptions

from .. import observe
from ..attempts.outages import Outages
from ..faults import FaultPlan
from ..rules import SHIPPED_RULES, Rules, RulesError, default_rules_path, load_rules

WATCH_INTERVAL_S = 1.0


class RulesKeeper:
    def __init__(self) -> None:
        self.rules: Rules | None = None
        self.faults: FaultPlan | None = None  # counts restart with each new set of rules
        # what requests learnt of upstreams' outages: each set of rules starts with none
        # (what runs on the old rules, a WebSocket's turns, reports to the old memory)
        self.outages = Outages()
        self._mtime: float | None = None
        self._watcher: asyncio.Task[None] | None = None

    def load(self, loader: addonmanager.Loader) -> None:
        loader.add_option(
            name="switchyard_rules",
            typespec=str,
            default="",
            help="Path of Switchyard's rules.yaml. Default: ./rules.yaml if present, "
            "else the rules.yaml shipped with the addon.",
        )

    @property
    def path(self) -> Path:
        configured = ctx.options.switchyard_rules
        return Path(configured).expanduser() if configured else default_rules_path()

    @property
    def watched(self) -> Path:
        """The file reloads read: the one in use.  Without the option, a ./rules.yaml
        gone for a moment (a checkout, an editor that deletes and rewrites) must not
        bring back the shipped rules; one that appears while they are in use is taken."""
        if ctx.options.switchyard_rules or self.rules is None or self.rules.source == SHIPPED_RULES:
            return self.path
        return self.rules.source

    def configure(self, updated: set[str]) -> None:
        if "switchyard_rules" not in updated:
            return
        if self.rules is not None and self.path.resolve() == self.rules.source.resolve():
            self._reload(reason="option set")  # same file (or a rollback to it): keep on error
            return
        try:
            self._apply(load_rules(self.path))
        except RulesError as exc:
            if self.rules is None:
                # At start-up an ERROR log makes mitmdump exit with status 1.  Raw, not
                # `observe.emit`: the file's problems are listed one per line
                observe.log.error("switchyard.rules_invalid %s", observe.printable(str(exc)))
                return
            raise exceptions.OptionsError(f"switchyard: {exc} (keeping the last good rules)") from None

    def running(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())

    def done(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    @command.command("switchyard.reload")
    def reload(self) -> str:
        """Read the rules file again; a broken file keeps the last good rules (and
        the command fails, saying why)."""
        problem = self._reload(reason="command")
        if problem is not None:
            kept = " (keeping the last good rules)" if self.rules is not None else ""
            raise exceptions.CommandError(f"switchyard: {problem}{kept}")
        assert self.rules is not None
        return self.summary(self.rules)

    def _reload(self, *, reason: str) -> str | None:
        """None once the file is applied, else what is wrong with it."""
        try:
            rules = load_rules(self.watched)
        except RulesError as exc:
            self._mtime = self._current_mtime()
            observe.emit(logging.ERROR if self.rules is None else logging.WARNING,
                         "switchyard.rules_invalid", reason=reason, error=str(exc),
                         kept="last good rules" if self.rules else None)
            return str(exc)
        self._apply(rules)
        return None

    @staticmethod
    def summary(rules: Rules) -> str:
        routes = ",".join(route.name for route in rules.routes) or "(none)"
        return f"rules {rules.source}: routes {routes}; faults {len(rules.faults) or 'none'}"

    def _apply(self, rules: Rules) -> None:
        first = self.rules is None
        self.rules = rules
        if self.faults is not None:
            # what is in flight on the old rules (a WebSocket's turns) fails no more, but for faults still in the file
            self.faults.retire(rules.faults)
        self.faults = FaultPlan(rules.faults) if rules.faults else None
        self.outages = Outages()
        self._mtime = self._current_mtime()
        for warning in rules.warnings:
            observe.emit(logging.WARNING, "switchyard.rules_warning", warning=warning)
        observe.emit(
            logging.INFO,
            "switchyard.rules_loaded" if first else "switchyard.rules_reloaded",
            path=str(rules.source),
            routes=",".join(route.name for route in rules.routes) or "(none)",
            faults=len(rules.faults) or None,
        )
        if self.faults is not None:
            # failures made on purpose fail real requests for as long as they are in the file
            for line in self.faults.describe():  # already key=value, as `switchyard.status` shows it
                observe.log.warning("switchyard.fault_active %s", observe.printable(line))

    def _current_mtime(self) -> float | None:
        try:
            return self.watched.stat().st_mtime
        except OSError:
            return None

    async def _watch(self) -> None:
        """Apply edits of the rules file while running (polling: no extra dependency)."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            mtime = self._current_mtime()
            if mtime is None or mtime == self._mtime:
                continue
            try:
                self._reload(reason="file changed")
            except Exception:  # a bug of ours must not end the watching: later edits still apply
                self._mtime = mtime
                observe.log.exception("switchyard.rules_watch_failed path=%s", self.watched)
