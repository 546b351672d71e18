"""Where mitmproxy reads a routed flow's answer from: its own end of the relay connection.

The relay hands its answers to that reader in-process (relay/direct_line.py),
skipping the kernel hop.  mitmproxy has no public way to reach it, so this
follows mitmproxy 12's own structures: the `proxyserver` addon's handler for
the flow's client connection, and that handler's reader and writer for the
flow's server connection.  Every step is looked up defensively: whatever a
later mitmproxy changes, the answer then simply goes through the socket.
"""

from __future__ import annotations

import asyncio

from mitmproxy import ctx, http


def relay_streams(flow: http.HTTPFlow) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """mitmproxy's reader and writer of the flow's current server connection, or None."""
    proxyserver = ctx.master.addons.get("proxyserver")
    connections = getattr(proxyserver, "connections", None)
    if not isinstance(connections, dict):
        return None
    handler = connections.get(flow.client_conn.id)
    transports = getattr(handler, "transports", None)
    if transports is None:
        return None
    io = transports.get(flow.server_conn)
    reader, writer = getattr(io, "reader", None), getattr(io, "writer", None)
    if isinstance(reader, asyncio.StreamReader) and isinstance(writer, asyncio.StreamWriter):
        return reader, writer
    return None
