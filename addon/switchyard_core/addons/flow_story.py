"""What mitmweb shows of a routed flow: the truth, never the relay.

The flow is put back to the upstream that answered (or the client's own
request), with its story in metadata, a comment and a mark; each failed attempt
becomes a flow of its own, credentials redacted.  Display only: nothing here
may cost the client its answer.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from mitmproxy import connection, ctx, http
from mitmproxy import flow as mitmflow
from mitmproxy.http import Headers

from .. import observe
from ..exchange import AttemptRecord, Exchange, OriginalRequest
from ..observe import METADATA_KEY
from ..redaction import env_secrets, redact_cut, redact_headers
from ..relay import TOKEN_HEADER
from ..upstreams.messages import build_request, is_cross_origin, redact_query

DISPLAY_LIMIT = 1024 * 1024  # bytes of a streamed answer, or of a failed attempt's, kept for mitmweb
TRUNCATED_HEADER = "x-switchyard-truncated"


class DisplayCopy:
    """A stream callback that passes bytes through and keeps a bounded copy."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def __call__(self, data: bytes) -> bytes:
        if self.size < DISPLAY_LIMIT:
            self.chunks.append(data)
            self.size += len(data)
        return data


class FlowAddress(NamedTuple):
    """A flow's request fields (mitmproxy's raw values) before the Router re-aimed it
    at the relay: what the flow is shown with again once answered."""

    scheme: bytes
    host: str
    port: int
    authority: bytes
    path: bytes
    method: bytes


@dataclass(slots=True)
class FlowView:
    """How mitmweb shows a routed flow: written by the Router's hooks only."""

    address: FlowAddress
    shown_url: str | None = None  # the URL the flow was last restored to


def restore(flow: http.HTTPFlow, exchange: Exchange, view: FlowView) -> None:
    """Display only: a failure here must never cost the client its answer."""
    try:
        _show_answering_upstream(flow, exchange, view)
    except ValueError as exc:
        observe.emit(logging.WARNING, "switchyard.display_failed", route=exchange.route.name, error=str(exc))


def _show_answering_upstream(flow: http.HTTPFlow, exchange: Exchange, view: FlowView) -> None:
    """Show the upstream that answered (or the original) instead of the relay.

    When that upstream is on another origin, the flow also shows the headers
    it was sent, credentials redacted: a flow that paired the client's key
    with another origin's URL would leak it on replay.
    """
    request = flow.request
    original = exchange.request
    answered = exchange.answered_url or original.url
    if view.shown_url == answered:
        return  # already shown (responseheaders, then response)
    view.shown_url = answered
    request.headers.pop(TOKEN_HEADER, None)
    before = view.address
    request.data.method = before.method  # the relay was asked with POST or HEAD
    if answered == original.url:
        # the original destination answered (the common case): put back the fields
        # the request hook changed, as they were (cheaper than parsing the URL again)
        data = request.data
        data.scheme, data.host, data.port, data.authority, data.path = before[:5]
        _restore_host_header(request, original)
        return
    if is_cross_origin(answered, original.url):
        record = next((r for r in reversed(exchange.attempts) if r.url == answered), None)
        shown = [("Host", urlsplit(answered).netloc), *(record.shown_request_headers() if record else [])]
        request.headers = Headers([(k.encode(), v.encode()) for k, v in shown])
        request.url = redact_query(answered)  # a credential it was asked to forward is shown as no other
        upstream = next((u for u in exchange.route.upstreams if record and u.name == record.upstream), None)
        if upstream is not None:
            request.raw_content = build_request(original, upstream, exchange.route.api).body  # with its own model, if it has one
        request.headers["Content-Length"] = str(len(request.raw_content or b""))  # a replay sends it whole
        return
    request.url = answered
    _restore_host_header(request, original)


def _restore_host_header(request: http.Request, original: OriginalRequest) -> None:
    original_host = next((v for k, v in original.headers if k.lower() == "host"), None)
    if original_host is not None:
        request.headers["Host"] = original_host


def annotate(flow: http.HTTPFlow, exchange: Exchange, counters: Counter[str]) -> None:
    """The flow's story (metadata), a comment and a mark for mitmweb; the status counters."""
    attempts = [{**record.as_dict(), "url": redact_query(record.url)} for record in exchange.attempts]
    flow.metadata[METADATA_KEY] = {
        "route": exchange.route.name,
        "api": exchange.route.api,
        "outcome": exchange.outcome,
        "answered_by": exchange.answered_by,
        "attempts": attempts,
        "suppressed_failover": exchange.suppressed_failover,
        **({"skipped": list(exchange.skipped)} if exchange.skipped else {}),
    }
    failed = [r for r in exchange.attempts
              if r.outcome not in ("committed", "pending", "hedge_lost") and not r.continuation]
    if failed:
        counters["failed_attempts"] += len(failed)
        first = failed[0]
        what = _what(first)
        if exchange.answered_by and exchange.outcome == "committed":
            if exchange.answered_by == first.upstream:
                counters["retries_answered"] += 1
                flow.comment = f"{first.upstream}: {what} before output → answered on retry"
            else:
                counters["fallbacks"] += 1
                flow.comment = f"{first.upstream}: {what} before output → {exchange.answered_by} answered"
            flow.marked = ":arrows_counterclockwise:"
        else:
            flow.comment = f"{first.upstream}: {what}; {exchange.outcome}"
    if exchange.suppressed_failover:
        counters["suppressed_failovers"] += 1
        flow.marked = flow.marked or ":warning:"
        last = next((r for r in reversed(exchange.attempts) if r.outcome == "committed"), None)
        if last is not None:
            what = _what(last)
            note = f"{last.upstream}: {what or 'a failure'} after output: forwarded, never replayed"
            flow.comment = f"{flow.comment}; then {note}" if flow.comment else note
    _continuations(flow, exchange, counters)
    hedges = [r for r in exchange.attempts if r.hedge]
    if hedges:
        counters["hedged"] += 1
        won = any(r.outcome == "committed" for r in hedges)
        counters["hedges_won"] += won
        lost = next((r for r in exchange.attempts if r.outcome == "hedge_lost"), None)
        note = (f"hedged: {hedges[0].upstream} asked beside the slow {_slow(exchange)}"
                + (f"; {lost.upstream} lost" if lost else ""))
        flow.comment = f"{flow.comment}; {note}" if flow.comment else note
    if exchange.skipped:
        counters["skipped"] += len(exchange.skipped)
        note = "skipped " + "; ".join(exchange.skipped)
        flow.comment = f"{note}; {flow.comment}" if flow.comment else note
    counters["attempts"] += len(exchange.attempts)


def _slow(exchange: Exchange) -> str:
    first = next((r for r in exchange.attempts if r.hedge), None)
    before = [r for r in exchange.attempts if first is not None and r.attempt < first.attempt]
    return before[-1].upstream if before else "attempt"


def _continuations(flow: http.HTTPFlow, exchange: Exchange, counters: Counter[str]) -> None:
    """After a cut: who finished the answer, or that nothing could."""
    tries = [r for r in exchange.attempts if r.continuation]
    if not tries:
        return
    cut = next((r for r in reversed(exchange.attempts) if r.outcome == "committed"), None)
    what = f"{cut.upstream}: {cut.message or 'cut after output'}" if cut else "cut after output"
    if exchange.outcome == "continued":
        counters["continued_after_cut"] += 1
        last = tries[-1]
        note = f"{what} → {last.upstream} continued it ({last.continuation})"
        flow.marked = ":arrows_counterclockwise:"
    else:
        counters["continuations_failed"] += 1
        note = f"{what} → {len(tries)} continuation(s) failed; {exchange.outcome}"
        flow.marked = ":warning:"
    flow.comment = f"{flow.comment}; then {note}" if flow.comment else note


def show_attempts(flow: http.HTTPFlow, exchange: Exchange) -> None:
    """In mitmweb and the console, each failed attempt becomes a flow of its own."""
    view = ctx.master.addons.get("view")
    if view is None:
        return  # mitmdump: the log lines tell the story
    flows = []
    for record in exchange.attempts:
        if record.outcome in ("committed", "pending"):
            continue
        try:
            flows.append(attempt_flow(flow, exchange, record))
        except ValueError as exc:  # display only
            observe.emit(logging.WARNING, "switchyard.display_failed", route=exchange.route.name, error=str(exc))
    if flows:
        view.add(flows)


def attempt_flow(flow: http.HTTPFlow, exchange: Exchange, record: AttemptRecord) -> http.HTTPFlow:
    """A failed attempt as a flow: credentials redacted, no request body, what came back."""
    url = redact_query(record.url)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    headers = Headers([(name.encode(), value.encode()) for name, value in record.shown_request_headers()])
    request = http.Request.make(exchange.request.method, url, b"", headers)
    request.timestamp_start = request.timestamp_end = flow.request.timestamp_start
    attempt = http.HTTPFlow(flow.client_conn, connection.Server(address=(parts.hostname or "", port)))
    attempt.request = request
    what = _what(record)
    cut = ""
    if record.answer is not None:
        status, answer_headers, body = record.answer
        # whatever an attempt kept, its upstream's own `${VAR}` values are never shown
        secrets = _env_secrets_of(exchange, record.upstream)
        # a failed attempt may have held up to `staging_limit`; a flow keeps what a stream's does
        kept = len(body[:DISPLAY_LIMIT])
        response = http.Response.make(status, redact_cut(body[:DISPLAY_LIMIT], secrets))
        # the headers as the upstream sent them: make() would claim a Content-Length
        # that a streamed answer never had
        response.headers = Headers([(k.encode(), v.encode("utf-8", "surrogateescape"))
                                    for k, v in redact_headers(answer_headers, secrets)])
        if kept < len(body):
            cut = f"; answer cut to its first {kept} of {len(body)} bytes"
            response.headers[TRUNCATED_HEADER] = f"first {kept} of {len(body)} bytes kept"
        attempt.response = response
        if 200 <= status < 300 and record.outcome != "continued":
            # the failure came inside a 2xx answer: mitmweb would list a plain green
            # 200; the error puts a warning on the row, with the failure as its title
            attempt.error = mitmflow.Error(f"failed inside the {status} answer: {what or record.outcome}")
    else:
        attempt.error = mitmflow.Error(record.message or record.outcome)
    attempt.metadata[METADATA_KEY] = {"attempt_of": flow.id, "route": exchange.route.name, "api": exchange.route.api,
                                      **record.as_dict(), "url": url}
    if record.continuation:
        what = f"{record.continuation} continuation{': ' + what if what else ''}"
    attempt.comment = (f"attempt {record.attempt} ({exchange.route.name}): {record.upstream}: {what} → {record.outcome}; "
                       f"request body omitted{cut}")
    attempt.marked = ":arrows_counterclockwise:" if record.outcome == "continued" else ":red_circle:"
    return attempt


def _env_secrets_of(exchange: Exchange, upstream: str) -> tuple[bytes, ...]:
    found = next((u for u in exchange.route.upstreams if u.name == upstream), None)
    return env_secrets(found) if found is not None else ()


def _what(record: AttemptRecord) -> str:
    """What an attempt's failure was, in a flow's comment: `503 server_error overloaded`."""
    return " ".join(str(x) for x in (record.status, record.code, record.message) if x)
