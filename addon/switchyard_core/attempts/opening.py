"""A new attempt of an exchange: which kind, its request, its record and its bounds.

Over the upstream's WebSocket (a Responses turn, where the upstream speaks it),
over HTTP in the route's API, or over HTTP in another API (the request
translated: docs/translation.md).  A request that cannot be carried into an
upstream's API is no attempt: that upstream is not asked, and its record says why.
"""

from __future__ import annotations

import logging

from .. import observe
from ..apis import ErrorInfo
from ..apis.errors import UNTRANSLATABLE
from ..exchange import AttemptRecord
from ..redaction import env_secrets
from ..rules import Upstream
from ..translate.request import Untranslatable
from ..upstreams.messages import build_request, display_url, secret_header_names
from ..upstreams.translated import translated_display_url, translated_request
from ..upstreams.websocket import websocket_url
from .answer import HttpAttempt
from .attempt import Attempt, Core
from .commands import Open
from .deadlines import Deadlines
from .policy import UpstreamTry
from .socket_turn import SocketAttempt


def speaks_another_api(core: Core, upstream: Upstream) -> str | None:
    """The API an upstream speaks where it is not its route's (its answers are translated)."""
    return upstream.api if upstream.api not in (None, core.api.name) else None


def speaks_websocket(core: Core, upstream: Upstream) -> bool:
    """A WebSocket turn's try of `upstream` goes over its WebSocket (it speaks Responses, and the session lets it)."""
    turn = core.turn
    return turn is not None and speaks_another_api(core, upstream) is None and turn.speaks_websocket(upstream)


def new_attempt(core: Core, step: UpstreamTry, now: float, *, over_http: bool = False, hedge: bool = False,
                replacing: AttemptRecord | None = None) -> tuple[Attempt, Open] | Untranslatable:
    """The attempt and the command that sends it; recorded on the exchange (`replacing`:
    in that record's place and under its number, which no other attempt has)."""
    upstream = step.upstream
    original = core.exchange.request
    speaks = speaks_another_api(core, upstream)
    socket = not over_http and speaks_websocket(core, upstream)
    if speaks is not None:
        try:
            request, translated = translated_request(original, upstream, core.api.name)
        except Untranslatable as refused:
            return refused
        url = translated_display_url(upstream, original.wants_stream)
        if translated.left_out:
            observe.emit(logging.INFO, "switchyard.translated", route=core.route.name, upstream=upstream.name,
                         api=speaks, left_out="; ".join(translated.left_out), **core.log.context)
    else:
        api = None if socket else core.api.name
        request, url = build_request(original, upstream, api), display_url(original, upstream, api)
    turn = core.turn
    records = core.exchange.attempts
    record = AttemptRecord(attempt=replacing.attempt if replacing is not None else len(records) + 1,
                           upstream=upstream.name, url=websocket_url(url) if socket else url, started=now,
                           request_headers=request.headers, secret_headers=secret_header_names(upstream), hedge=hedge,
                           # a socket's request is its upgrade, then the turn's message on it
                           request_method="GET" if socket else request.method,
                           request_body=turn.text.encode() if socket and turn is not None else request.body)
    core.exchange.add(record)
    if replacing is not None:  # in the refused upgrade's place, under its number
        records.pop()
        records[records.index(replacing)] = record
    deadlines = Deadlines.of(core.settings, streams=original.wants_stream, started=now)
    secrets = env_secrets(upstream)
    # the head, or the handshake: within headers_timeout_s, and never past when the first output is due
    head_by = now + deadlines.head if deadlines.head else None
    if socket:
        return (SocketAttempt(step, record, deadlines, secrets, turn=core.turn),
                Open(record.attempt, request, "websocket", deadlines.connect, head_by))
    return (HttpAttempt(step, record, deadlines, secrets, speaks=speaks),
            Open(record.attempt, request, "http", deadlines.connect, head_by))


def untranslatable(core: Core, step: UpstreamTry, now: float, refused: Untranslatable) -> tuple[Attempt, ErrorInfo]:
    """The record of an upstream not asked because the request cannot be carried into its
    API, and the failure that moves the route on (its reason, never the request's content)."""
    upstream = step.upstream
    original = core.exchange.request
    record = AttemptRecord(attempt=len(core.exchange.attempts) + 1, upstream=upstream.name,
                           url=translated_display_url(upstream, original.wants_stream), started=now,
                           secret_headers=secret_header_names(upstream))
    core.exchange.add(record)
    attempt = HttpAttempt(step, record, Deadlines.of(core.settings, streams=original.wants_stream, started=now))
    return attempt, ErrorInfo(status=502, code=UNTRANSLATABLE, event_type="untranslatable",
                              message=f"switchyard: upstream {upstream.name} not asked: {refused.reason}")
