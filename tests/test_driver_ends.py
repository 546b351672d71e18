"""The attempt core's driver with scripted upstreams (tests/support/loop_playbook.py):
whatever goes wrong inside an attempt's I/O, the exchange ends and the client hears it."""

from __future__ import annotations

import asyncio
import json

from tests.support.loop_playbook import ScriptedUpstreams, play, upstream

PRIMARY, BACKUP = "primary.example", "backup.example"


async def test_an_attempt_whose_io_raises_what_no_event_reports_still_ends_the_exchange() -> None:
    """A request that cannot be written (a header with a line break: `_request_head`'s
    ValueError) is no transport failure: it costs this exchange, told in the API's
    shape, instead of a client waiting for an event that never comes."""
    upstreams = ScriptedUpstreams({PRIMARY: [ValueError("header 'x-note' holds a line break or colon; not sent")]})
    exchange, client = await asyncio.wait_for(play(upstreams, upstream(PRIMARY), upstream(BACKUP)), 10)
    assert client.status == 502 and client.whole
    assert json.loads(client.body)["error"]["code"] == "switchyard_internal_error"
    assert exchange.outcome == "internal_error"
