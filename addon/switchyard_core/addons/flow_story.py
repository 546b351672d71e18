"""What mitmweb shows of a routed flow: the truth, never the relay.

The flow is put back to the upstream that answered (or the client's own
request), with its story in metadata, a comment and a mark; each failed attempt
becomes a flow of its own (attempt_flows.py), shown as it ends (live_story.py).
Display only: nothing here may cost the client its answer.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from mitmproxy import http
from mitmproxy.http import Headers

from .. import observe
from ..exchange import Exchange, OriginalRequest
from ..observe import METADATA_KEY
from ..relay import TOKEN_HEADER
from ..rules import Upstream
from ..translate.request import Untranslatable
from ..upstreams.messages import build_request, is_cross_origin, redact_query
from ..upstreams.translated import translated_request
from .attempt_flows import DISPLAY_LIMIT, shows_a_flow, what


class DisplayCopy:
    """A stream callback that passes bytes through and keeps a bounded copy."""

    __slots__ = ("chunks", "size", "seen")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.seen = 0  # bytes passed through: mitmproxy writes each to the client once this returns

    def __call__(self, data: bytes) -> bytes:
        self.seen += len(data)
        if self.size < DISPLAY_LIMIT:
            self.chunks.append(data)
            self.size += len(data)
        return data


class FlowAddress(NamedTuple):
    """A flow's request fields (mitmproxy's raw values) before the Router re-aimed it
    at the relay: what the flow is shown with again once answered.  `sent`: the
    headers, body and trailers the client sent, where the relay was asked without
    them (`lean_relay_request`)."""

    scheme: bytes
    host: str
    port: int
    authority: bytes
    path: bytes
    method: bytes
    sent: "tuple[Headers, bytes | None, Headers | None] | None" = None


def lean_relay_request(request: http.Request, address: FlowAddress, token: str) -> FlowAddress:
    """Ask the relay with the token only: it reads nothing else, so mitmproxy need not
    write the client's headers and body to it, nor the relay read them again (an
    agent's turn carries its whole conversation).  They are put back by `restore`,
    which the Router's `responseheaders` hook runs first, before the client's answer
    (docs/architecture.md, "Speed")."""
    data = request.data
    kept = address._replace(sent=(data.headers, data.content, data.trailers))
    data.headers = Headers([(b"content-length", b"0"), (TOKEN_HEADER.encode(), token.encode("ascii"))])
    data.content = b""
    data.trailers = None
    return kept


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
    before = view.address
    if before.sent is not None:  # the client's own, as the relay was asked without them
        data = request.data
        data.headers, data.content, data.trailers = before.sent
        view.address = before = before._replace(sent=None)
    request.headers.pop(TOKEN_HEADER, None)
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
            request.raw_content = _sent_body(exchange, upstream)
        request.headers["Content-Length"] = str(len(request.raw_content or b""))  # a replay sends it whole
        return
    request.url = answered
    _restore_host_header(request, original)


def _sent_body(exchange: Exchange, upstream: Upstream) -> bytes:
    """The body the answering upstream was sent, whole (a replay sends it): with its own
    model, and in its own API where it speaks another (docs/translation.md)."""
    original = exchange.request
    if upstream.api not in (None, exchange.route.api):
        try:
            return translated_request(original, upstream, exchange.route.api)[0].body
        except Untranslatable:
            return original.body
    return build_request(original, upstream, exchange.route.api).body


def _restore_host_header(request: http.Request, original: OriginalRequest) -> None:
    original_host = next((v for k, v in original.headers if k.lower() == "host"), None)
    if original_host is not None:
        request.headers["Host"] = original_host


def annotate(flow: http.HTTPFlow, exchange: Exchange, counters: Counter[str] | None = None) -> None:
    """The flow's story (metadata), a comment and a mark for mitmweb, as far as the
    exchange has got: while it streams (live_story.py), and again at its end, with
    the status counters (`counters`: only then, so that each exchange counts once).
    Each call says it all again: the comment is made whole, never appended to."""
    counters = counters if counters is not None else Counter()
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
    notes: list[str] = []
    failed = [r for r in exchange.attempts if shows_a_flow(r) and r.outcome != "hedge_lost" and not r.continuation]
    if failed:
        counters["failed_attempts"] += len(failed)
        first = failed[0]
        said = what(first)
        if exchange.answered_by and exchange.outcome == "committed":
            if exchange.answered_by == first.upstream:
                counters["retries_answered"] += 1
                notes.append(f"{first.upstream}: {said} before output → answered on retry")
            else:
                counters["fallbacks"] += 1
                notes.append(f"{first.upstream}: {said} before output → {exchange.answered_by} answered")
            flow.marked = ":arrows_counterclockwise:"
        elif exchange.outcome == "pending":
            notes.append(f"{first.upstream}: {said} before output → {failed[-1].outcome}; no answer yet")
        else:
            notes.append(f"{first.upstream}: {said}; {exchange.outcome}")
    if exchange.suppressed_failover:
        counters["suppressed_failovers"] += 1
        flow.marked = flow.marked or ":warning:"
        last = next((r for r in reversed(exchange.attempts) if r.outcome == "committed"), None)
        if last is not None:
            notes.append(f"{'then ' if notes else ''}{last.upstream}: {what(last) or 'a failure'} after output: "
                         "forwarded, never replayed")
    notes.extend(_continuations(flow, exchange, counters, bool(notes)))
    hedges = [r for r in exchange.attempts if r.hedge]
    if hedges:
        counters["hedged"] += 1
        won = any(r.outcome == "committed" for r in hedges)
        counters["hedges_won"] += won
        lost = next((r for r in exchange.attempts if r.outcome == "hedge_lost"), None)
        notes.append(f"hedged: {hedges[0].upstream} asked beside the slow {_slow(exchange)}"
                     + (f"; {lost.upstream} lost" if lost else ""))
    if exchange.skipped:
        counters["skipped"] += len(exchange.skipped)
        notes.insert(0, "skipped " + "; ".join(exchange.skipped))
    if notes:
        flow.comment = "; ".join(notes)
    counters["attempts"] += len(exchange.attempts)


def _slow(exchange: Exchange) -> str:
    first = next((r for r in exchange.attempts if r.hedge), None)
    before = [r for r in exchange.attempts if first is not None and r.attempt < first.attempt]
    return before[-1].upstream if before else "attempt"


def _continuations(flow: http.HTTPFlow, exchange: Exchange, counters: Counter[str], after: bool) -> list[str]:
    """After a cut: who finished the answer, or that nothing could (`after`: the comment says more before)."""
    tries = [r for r in exchange.attempts if r.continuation]
    if not tries:
        return []
    cut = next((r for r in reversed(exchange.attempts) if r.outcome == "committed"), None)
    said = f"{cut.upstream}: {cut.message or 'cut after output'}" if cut else "cut after output"
    if exchange.outcome == "continued":
        counters["continued_after_cut"] += 1
        last = tries[-1]
        note = f"{said} → {last.upstream} continued it ({last.continuation})"
        flow.marked = ":arrows_counterclockwise:"
    elif exchange.outcome == "pending":
        note = f"{said} → continuing"  # (live: a continuation is under way)
    else:
        counters["continuations_failed"] += 1
        note = f"{said} → {len(tries)} continuation(s) failed; {exchange.outcome}"
        flow.marked = ":warning:"
    return [f"then {note}" if after else note]
