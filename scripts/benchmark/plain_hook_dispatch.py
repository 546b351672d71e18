"""Loaded into plain mitmdump by the benchmark's `--plain-hook-dispatch`: Switchyard's
hook dispatch (addon/switchyard_core/addons/hook_dispatch.py) and nothing else of
Switchyard.  That dispatch speeds up every flow in its process, routed or not, so
against plain mitmdump given the same dispatch, the ratios show what Switchyard
itself costs (docs/benchmarks.md)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "addon"))

from switchyard_core.addons import hook_dispatch  # noqa: E402


class PlainHookDispatch:
    def running(self) -> None:
        why = hook_dispatch.install()
        if why is not None:  # the comparison would not be the one asked for
            raise RuntimeError(f"Switchyard's hook dispatch cannot be installed: {why}")
        logging.getLogger("switchyard.bench").warning("plain mitmdump runs with Switchyard's hook dispatch")

    def done(self) -> None:
        hook_dispatch.uninstall()


addons = [PlainHookDispatch()]
