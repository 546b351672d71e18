"""mitmproxy's "Streaming response from …" line, one loop pass late for relayed flows.

mitmproxy logs that line the moment it sends a streamed answer's head.  For a
flow Switchyard relays to an HTTP/1 client, that moment is the first token's:
the head waits until the answer is decided (see `Router.responseheaders`).  The
line's cost there (formatting, the terminal write, and mitmproxy's `add_log`
hook over every addon) is paid by the first token.  So it is held back and
logged unchanged, with its original time, one loop pass later: after mitmproxy
has written the first token.

This leans on mitmproxy's private parts: the logger its connection handlers
write to, which hands the client's address as the record's `client`, and the
line's wording.  `unusable` checks the logger once, at load; a reworded line is
simply logged at its usual time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

MESSAGE_PREFIX = "Streaming response from "
LOGGER = "mitmproxy.proxy.server"  # where mitmproxy's connection handlers log
_DEFERRED = "switchyard_deferred"


def unusable() -> str | None:
    """Why the line cannot be held back on this mitmproxy, or None if it can."""
    try:
        from mitmproxy.proxy import server
    except ImportError:
        return "mitmproxy.proxy.server is gone"
    logger = getattr(server, "logger", None)
    if not isinstance(logger, logging.Logger) or logger.name != LOGGER:
        return f"mitmproxy's connection handlers no longer log to {LOGGER}"
    return None


class StreamingNoteDeferral(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._clients: set[Any] = set()  # client addresses whose next note waits a pass

    def install(self) -> None:
        logging.getLogger(LOGGER).addFilter(self)

    def uninstall(self) -> None:
        logging.getLogger(LOGGER).removeFilter(self)
        self._clients.clear()

    def expect(self, client: Any) -> None:
        """This client's answer head goes out now, with its first token."""
        self._clients.add(client)

    def forget(self, client: Any) -> None:
        self._clients.discard(client)

    def filter(self, record: logging.LogRecord) -> bool:
        client = getattr(record, "client", None)
        if (client not in self._clients or getattr(record, _DEFERRED, False)
                or not str(record.msg).startswith(MESSAGE_PREFIX)):
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return True
        self._clients.discard(client)
        setattr(record, _DEFERRED, True)
        # the relay wrote the first token in the pass that decided the head, so
        # mitmproxy reads it in this pass, after this hook; the reader task that
        # read wakes is queued ahead of a timer due now
        loop.call_later(0, logging.getLogger(record.name).handle, record)
        return False
