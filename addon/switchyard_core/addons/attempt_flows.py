"""Each attempt of a routed flow that did not simply answer, as a flow of its own.

What mitmweb and the console show of it is what happened on the wire: the
request that upstream was sent (method, URL, headers, body: a WebSocket
attempt's upgrade and the turn's message on it), what the upstream sent back
(also when it stalled or broke off), and its own times.  Everything shown is
bounded, and credentials (the client's, the upstream's `auth`, whatever its
`${VAR}`s hold) are `[redacted]`.  Display only: nothing here may cost the
client its answer.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from mitmproxy import connection, http
from mitmproxy import flow as mitmflow
from mitmproxy.http import Headers

from ..exchange import AttemptRecord, Exchange
from ..observe import METADATA_KEY
from ..redaction import credential_query_values, env_secrets, redact_cut, redact_headers, secret_values
from ..upstreams.messages import redact_query

DISPLAY_LIMIT = 1024 * 1024  # bytes of a streamed answer, of a failed attempt's, or of a request body, kept for mitmweb
TRUNCATED_HEADER = "x-switchyard-truncated"

# how an attempt ended, if not with the answer the client got: these get a flow of their own
ANSWERED = frozenset({"committed", "passed_through", "pending"})
MARK_FAILED = ":red_circle:"
MARK_CONTINUED = ":arrows_counterclockwise:"
MARK_HEDGE_LOST = ":white_circle:"  # stopped because the other one answered first: no failure


def shows_a_flow(record: AttemptRecord) -> bool:
    return record.outcome not in ANSWERED


def what(record: AttemptRecord) -> str:
    """What an attempt's failure was, in a comment: `503 server_error overloaded`.  A
    timeout's status is the one a client would get, not the upstream's: not said."""
    status = None if record.event_type == "timeout" else record.status
    return " ".join(str(x) for x in (status, record.code, record.message) if x)


class Clock:
    """The records' monotonic times as the wall-clock timestamps flows carry: one
    offset for every time of one display, so that their order and gaps are kept."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()

    def wall(self, monotonic: float | None) -> float | None:
        return None if monotonic is None else monotonic + self.offset


def attempt_flow(flow: http.HTTPFlow, exchange: Exchange, record: AttemptRecord, clock: Clock) -> http.HTTPFlow:
    """One attempt as a flow: its request as sent, what came back, its own times."""
    url = redact_query(record.url)
    parts = urlsplit(url)
    secure = parts.scheme in ("https", "wss")
    port = parts.port or (443 if secure else 80)
    request = http.Request.make(record.request_method, url, b"", _headers(record.shown_request_headers()))
    request.port = port  # (a WebSocket URL has no default port in mitmproxy's eyes)
    body, cut_request = _request_body(exchange, record)
    del request.headers["content-length"]  # (make()'s, of the empty body)
    request.headers["Content-Length"] = str(len(record.request_body))  # as sent, whatever is kept
    request.raw_content = body
    if cut_request:
        request.headers[TRUNCATED_HEADER] = f"first {DISPLAY_LIMIT} of {len(record.request_body)} bytes kept"
    started = clock.wall(record.started)
    request.timestamp_start = started or request.timestamp_start
    request.timestamp_end = clock.wall(record.sent_at) or request.timestamp_start
    ended = clock.wall(record.ended_at)
    server = connection.Server(address=(parts.hostname or "", port))
    server.timestamp_start = started
    attempt = http.HTTPFlow(flow.client_conn, server)
    attempt.request = request
    told = what(record)
    cut = ""
    if record.answer is not None:
        status, answer_headers, answered = record.answer
        # whatever an attempt kept, its upstream's own `${VAR}` values are never shown
        secrets = _env_secrets_of(exchange, record.upstream)
        # a failed attempt may have held up to `staging_limit`; a flow keeps what a stream's does
        kept = len(answered[:DISPLAY_LIMIT])
        response = http.Response.make(status, redact_cut(answered[:DISPLAY_LIMIT], secrets))
        # the headers as the upstream sent them: make() would claim a Content-Length
        # that a streamed answer never had
        response.headers = _headers(redact_headers(answer_headers, secrets))
        if kept < len(answered):
            cut = f"; answer cut to its first {kept} of {len(answered)} bytes"
            response.headers[TRUNCATED_HEADER] = f"first {kept} of {len(answered)} bytes kept"
        response.timestamp_start = clock.wall(record.answered_at) or request.timestamp_end
        response.timestamp_end = ended or response.timestamp_start
        attempt.response = response
        if 200 <= status < 300 and record.outcome not in ("continued", "hedge_lost"):
            # the failure came inside a 2xx answer: mitmweb would list a plain green
            # 200; the error puts a warning on the row, with the failure as its title
            attempt.error = mitmflow.Error(f"failed inside the {status} answer: {told or record.outcome}",
                                           ended or time.time())
    elif record.outcome != "hedge_lost":
        attempt.error = mitmflow.Error(record.message or record.outcome, ended or time.time())
    attempt.metadata[METADATA_KEY] = {"attempt_of": flow.id, "route": exchange.route.name, "api": exchange.route.api,
                                      **record.as_dict(), "url": url}
    if record.continuation:
        told = f"{record.continuation} continuation{': ' + told if told else ''}"
    over = "; its body is the turn's message on the socket" if parts.scheme in ("ws", "wss") else ""
    # what failed first: mitmweb's Comment column is narrow, and the row's URL names the upstream
    attempt.comment = (f"{told or 'no answer'} → {record.outcome}; attempt {record.attempt} "
                       f"({exchange.route.name}: {record.upstream}){over}{cut}")
    attempt.marked = (MARK_CONTINUED if record.outcome == "continued" else
                      MARK_HEDGE_LOST if record.outcome == "hedge_lost" else MARK_FAILED)
    return attempt


def _headers(pairs: list[tuple[str, str]]) -> Headers:
    return Headers([(name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
                    for name, value in pairs])


def _request_body(exchange: Exchange, record: AttemptRecord) -> tuple[bytes, bool]:
    """The body the attempt was sent, at most DISPLAY_LIMIT of it, with every credential
    the exchange carries and the upstream's `${VAR}` values redacted; and whether it was cut."""
    body = record.request_body
    if not body:
        return b"", False
    route = exchange.route
    carried = secret_values(exchange.request.headers, route.upstreams,
                            credential_query_values(exchange.request.url, *(u.url for u in route.upstreams if u.url)))
    secrets = (*_env_secrets_of(exchange, record.upstream), *(value.encode() for value in carried if value))
    return redact_cut(body[:DISPLAY_LIMIT], secrets), len(body) > DISPLAY_LIMIT


def _env_secrets_of(exchange: Exchange, upstream: str) -> tuple[bytes, ...]:
    found = next((u for u in exchange.route.upstreams if u.name == upstream), None)
    return env_secrets(found) if found is not None else ()
