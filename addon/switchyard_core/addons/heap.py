"""The objects that live as long as the proxy, kept out of full garbage collections.

CPython's cyclic collector walks every tracked object on a full collection,
and mitmproxy's process holds about a hundred thousand from start-up alone
(its own modules and addons, and with Switchyard pydantic's schemas, httptools,
the rules).  Streamed flows promote their objects into the oldest generation
as they outlive younger collections, so under a burst a full collection comes
along and stops the event loop for tens of milliseconds: every request in
flight waits for it, before its first token as much as after.

Frozen once, after start-up, those objects are never walked again, and a full
collection costs only what is alive in the flows.  (An object frozen here that
later became cyclic garbage would never be collected: that is why it is done
once, when mitmproxy has just started and holds no flows.)
"""

from __future__ import annotations

import gc

_frozen = False  # per process: a reloaded script imports this package's modules once


def freeze_startup_heap(flows_held: int) -> bool:
    """Collect what start-up left behind, then freeze the rest; once per process,
    and only while no flows are held (mitmweb's list, a script loaded late)."""
    global _frozen
    if _frozen or flows_held or not gc.isenabled():
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True
