"""Idle upstream connections kept for reuse, per origin.

A connection comes back here once an answer on it was read to its end and the
upstream allows keep-alive; the next request for the same origin takes it
instead of opening one.  An idle connection that is not reused soon, or that
the upstream closes, leaves.
"""

from __future__ import annotations

import asyncio

from .connection import Key, UpstreamConnection

IDLE_KEEP_S = 15.0  # a pooled connection unused this long is closed


class ConnectionPool:
    """One client's idle connections; `release` and `discard` are called by the connections."""

    def __init__(self) -> None:
        self._idle: dict[Key, list[UpstreamConnection]] = {}
        self._closed = False

    def take(self, key: Key) -> UpstreamConnection | None:
        """An idle connection for `key` that is still open, if there is one."""
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.transport is not None and not connection.transport.is_closing():
                connection.reuse()
                return connection
        return None

    def release(self, connection: UpstreamConnection) -> None:
        """An answer was read to its end on a keep-alive connection: keep it for the next."""
        if self._closed or connection.transport is None or connection.transport.is_closing():
            connection.close()
            return
        if connection.transport.is_reading() is False:
            connection.transport.resume_reading()  # paused for a slow client: idle, it must see a close
        connection.idle(asyncio.get_running_loop().call_later(IDLE_KEEP_S, connection.close))
        self._idle.setdefault(connection.key, []).append(connection)

    def discard(self, connection: UpstreamConnection) -> None:
        """The connection closed: it is no longer there to reuse."""
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    def __len__(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in list(idle):
                connection.close()
        self._idle.clear()
