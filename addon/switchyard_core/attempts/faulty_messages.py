"""A WebSocket turn's messages with a fault applied (`faults:` in rules.yaml), read like a real socket's.

The WebSocket counterpart of `faulty_answer.FaultyAnswer`, and pure: each item
the real socket delivers (a message, or its close) goes in, and what the turn
reads in its place comes out, with what must become of the real socket.  The
session pipes the real socket through it into the turn's inbox, so the turn
reads an injected failure exactly as it reads a provider's.

The fault point is the real answer's `after_frames + 1`-th message, or its end
(a terminal message, the close) if that comes first: that item is withheld and
the fault's ending goes in its place.  An `http_error` replaces the answer from
its first message.  Nothing of the real response reaches anyone after the fault
point: the real socket is closed there (a `reset` breaks it off), so the next
turn or attempt opens a fresh connection, as after any failed response whose
rest could still arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..apis import FrameKind
from ..apis.openai_responses import ResponsesStream
from ..faults import RESET_MESSAGE, status_and_message, websocket_message
from ..rules.schema import FaultSpec
from ..sse import SseEvent
from ..ws_items import Binary, Closed, Item

RESET_CODE = 1006  # a connection that broke without a close: what a reset looks like on a WebSocket


@dataclass(frozen=True, slots=True)
class FaultStep:
    """What one real item became."""

    items: tuple[Item, ...] = ()  # for the turn, in order, in the real item's place
    # the real socket from now on: None, read on; "close", its rest reaches nobody; "abort", broken off
    cut: Literal["close", "abort"] | None = None


class FaultyMessages:
    def __init__(self, spec: FaultSpec, api: str) -> None:
        self.spec = spec
        self._api = api
        self._passed = 0
        self._ends = ResponsesStream()  # tells the real answer's end (its terminal message)
        self.fired = False

    def feed(self, item: Item) -> FaultStep:
        if self.fired:
            return FaultStep()  # after the fault point nothing of the real answer is read
        if (self.spec.kind != "http_error" and self._passed < self.spec.after_frames
                and not isinstance(item, Closed) and not self._is_end(item)):
            self._passed += 1
            return FaultStep((item,))
        return self._fire(item)

    def _is_end(self, message: bytes) -> bool:
        if isinstance(message, Binary) or not self._ends.worth_a_look(message):
            return False
        seen = self._ends.classify(SseEvent(data=message.decode("utf-8", "replace")))
        return seen.kind is FrameKind.TERMINAL or seen.event_type == "response.failed"

    def _fire(self, instead_of: Item) -> FaultStep:
        self.fired = True
        kind = self.spec.kind
        if kind == "reset":
            return FaultStep((Closed(RESET_CODE, RESET_MESSAGE),), "abort")
        if kind == "stall":
            return FaultStep((), "close")  # silence: the turn's first-output and idle bounds end it
        status, message = status_and_message(self.spec)
        failure = websocket_message(self._api, kind, status, message)
        # an answer that closed before the fault point gets the failure, then its close
        after = (instead_of,) if isinstance(instead_of, Closed) else ()
        return FaultStep((failure, *after), "close")
