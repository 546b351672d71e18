"""What a turn means, carried from one connection (or transport) to another.

Pure functions over `response.create` bodies.  A turn may move to a fresh
WebSocket (the same upstream after its connection was dropped, or the next
upstream) or to HTTP.  The output-less turns the old connection made first
(Codex's `generate: false` warm-up, named by the real turn's
`previous_response_id`) exist only there, and a turn whose cut answer a
continuation finished exists whole nowhere upstream, so they are *folded* into
the turn that names them:
their request fields and input go first, the turn's own after, and
`previous_response_id` goes.  Folding, not replaying them on the new
connection: it works the same over HTTP (where there is no connection to warm),
costs no extra round trip, and leaves no response id to rewrite in the turn.
"""

from __future__ import annotations

import json
from typing import Any

CREATE = "response.create"
# fields of a create message that are the WebSocket's, not the request's
_WS_ONLY = ("type", "generate")
_NOT_CARRIED = ("type", "generate", "previous_response_id")


def parse_create(text: str) -> dict[str, Any] | None:
    """The body of a `response.create` message, or None if the message is not one."""
    if '"response.create"' not in text:
        return None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("type") != CREATE:
        return None
    return body


def is_warm_up(body: dict[str, Any]) -> bool:
    return body.get("generate") is False


def _items(value: Any) -> list[Any]:
    """A request's `input` as a list of items (a plain string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    return [value]


def fold(body: dict[str, Any], carried: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`body` with the output-less turns its `previous_response_id` chain names
    (in `carried`, by response id) folded in; unchanged when it names none of them."""
    chain: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    seen: set[str] = set()
    while isinstance(previous, str) and previous in carried and previous not in seen:
        seen.add(previous)
        earlier = carried[previous]
        chain.append(earlier)
        previous = earlier.get("previous_response_id")
    if not chain:
        return body
    merged: dict[str, Any] = {}
    items: list[Any] = []
    for earlier in reversed(chain):
        merged.update({k: v for k, v in earlier.items() if k not in _NOT_CARRIED and k != "input"})
        items += _items(earlier.get("input"))
    merged.update({k: v for k, v in body.items() if k != "previous_response_id" and k != "input"})
    merged["input"] = items + _items(body.get("input"))
    if isinstance(previous, str):
        merged["previous_response_id"] = previous  # the chain goes on beyond what was carried
    return merged


def with_answer(body: dict[str, Any], answer: list[Any]) -> dict[str, Any]:
    """A turn whose answer was finished by a continuation, with that answer (as input
    items) after its own input: what a later turn naming the turn's response id is
    folded with.  Upstream, that id names only the cut part of the answer, or no
    response at all (`store: false` on a connection that is gone)."""
    return {**body, "input": _items(body.get("input")) + answer}


def as_message(body: dict[str, Any]) -> str:
    return json.dumps({"type": CREATE, **{k: v for k, v in body.items() if k != "type"}}, ensure_ascii=False,
                      separators=(",", ":"))


def as_http_body(body: dict[str, Any]) -> bytes:
    """The turn as `POST /v1/responses`: the create's fields without the
    WebSocket's own, streamed."""
    fields = {k: v for k, v in body.items() if k not in _WS_ONLY}
    fields["stream"] = True
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def response_id(raw: bytes) -> str | None:
    """The id of the response a server message names (`response.created`, ...):
    deltas name none and are not parsed."""
    if b'"response"' not in raw:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    response = obj.get("response") if isinstance(obj, dict) else None
    found = response.get("id") if isinstance(response, dict) else None
    return found if isinstance(found, str) else None
