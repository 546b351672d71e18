"""One WebSocket turn (a client's `response.create`) as the core sees it: what the
session tells it, and what came of it for the session's next turns.  Pure data."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..continuation import Transcript, answer_input
from ..rules import Upstream
from .carry import is_warm_up

WARM_UP_HERE = "warm_up_answered_here"
# commits that carry no output: the answer's end alone (a warm-up's), Switchyard's own warm-up answer
NO_OUTPUT = ("response.completed", "response.incomplete", WARM_UP_HERE)


def _response_id() -> str:
    return f"resp_switchyard_{secrets.token_hex(12)}"


@dataclass(slots=True, eq=False)
class TurnContext:
    number: int
    text: str  # the message exactly as the client sent it
    body: dict[str, Any]
    resendable: bool  # no earlier turn of the connection produced output
    upstreams: Sequence[Upstream]
    # whether a try of this upstream goes over its WebSocket (the session knows which refused one)
    speaks_websocket: Callable[[Upstream], bool]
    new_response_id: Callable[[], str] = _response_id
    # --- what came of it ---
    output: bool = False  # real output reached the client
    response_id: str | None = None  # the answering response's id, once named
    socket_attempt: int | None = None  # the attempt whose socket answered, kept for later turns (None: HTTP)
    # a continuation finished its cut answer: the answer's response id (the client's), and the
    # answer as input items, for a later turn that names that id
    continued: tuple[str, list[dict[str, Any]]] | None = None
    story: dict[str, Any] = field(default_factory=dict)

    @property
    def warm_up(self) -> bool:
        return is_warm_up(self.body)

    def committed(self, first_event: str) -> None:
        if first_event not in NO_OUTPUT:
            self.output = True  # whichever transport: later turns of the connection are never re-sent

    def carry(self, answer: Transcript, request_body: bytes) -> None:
        """A continuation finished the turn's answer: a later turn naming its response
        id is folded with it (see carry.py)."""
        if answer.response_id is None:
            return
        try:
            stored = json.loads(request_body).get("store") is not False
        except (ValueError, RecursionError, AttributeError):
            stored = False
        self.continued = (answer.response_id, answer_input(answer.reasoning, answer.text, stored=stored))
