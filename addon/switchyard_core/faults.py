"""Failures on purpose (`faults:` in rules.yaml): which attempt gets one, and the
errors shaped for the route's API.

A fault never invents an upstream: the real request is sent, and the fault
replaces its answer (`http_error`) or truncates it after `after_frames` real
frames and then adds an error (`sse_error`, `response_failed`,
`overload_message`), a connection reset (`reset`) or silence (`stall`).  The
attempt loop reads a `attempts.faulty_answer.FaultyAnswer` exactly as it reads a
real answer, and a WebSocket turn reads `attempts.faulty_messages.FaultyMessages`
exactly as it reads a real socket's messages, so an injected failure exercises
the same paths a provider's would.  Every error shape is made here, once.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

from .apis import APIS
from .apis.errors import code_and_type_for_status
from .apis.anthropic_messages import NAME as ANTHROPIC
from .apis.google_gemini import NAME as GEMINI
from .apis.openai_responses import NAME as RESPONSES, OVERLOAD_OUTPUT_TEXT, websocket_error
from .rules.schema import FaultSpec, default_of
from .sse import FrameSplitter

IN_BODY_KINDS = frozenset({"sse_error", "response_failed", "overload_message"})
DEFAULT_STATUS: int = default_of(FaultSpec, "status")
DEFAULT_MESSAGE: str = default_of(FaultSpec, "message")
RESET_MESSAGE = "connection reset (switchyard fault)"


class FaultPlan:
    """The faults of one rules file, with their firing counts."""

    def __init__(self, specs: tuple[FaultSpec, ...], rng: Callable[[], float] = random.random) -> None:
        self.specs = specs
        self.fired = [0] * len(specs)
        self._rng = rng
        self._retired = [False] * len(specs)

    def retire(self, still: Sequence[FaultSpec] = ()) -> None:
        """The rules were reloaded: the faults no longer in the file fire no more, also
        for what still runs on the old rules (a WebSocket opened before); those `still`
        in it go on there, with their counts."""
        self._retired = [gone or spec not in still for spec, gone in zip(self.specs, self._retired)]

    def describe(self) -> list[str]:
        """One line per fault, with how often it has fired (for the log and `switchyard.status`)."""
        lines = []
        for spec, fired in zip(self.specs, self.fired):
            what = spec.kind + (f" {spec.status}" if spec.status is not None else "")
            limit = f"{fired}/{spec.count}" if spec.count is not None else f"{fired} (no count: until removed)"
            lines.append(f"route={spec.route} upstream={spec.upstream or '(any)'} kind={what} "
                         f"after_frames={spec.after_frames} rate={spec.rate:g} fired={limit}")
        return lines

    def pick(self, route: str, upstream: str) -> FaultSpec | None:
        """The first matching fault wins; its rate is drawn per attempt, and its count
        restarts with each new set of rules (a new FaultPlan)."""
        for index, spec in enumerate(self.specs):
            if self._retired[index] or spec.route != route or (spec.upstream is not None and spec.upstream != upstream):
                continue
            if spec.count is not None and self.fired[index] >= spec.count:
                continue
            if spec.rate < 1.0 and self._rng() >= spec.rate:
                continue
            self.fired[index] += 1
            return spec
        return None


def status_and_message(spec: FaultSpec) -> tuple[int, str]:
    """The status and message a fault's error carries: the spec's, else the defaults
    (`overload_message` says only what the overloaded provider says)."""
    default = OVERLOAD_OUTPUT_TEXT if spec.kind == "overload_message" else DEFAULT_MESSAGE
    return spec.status or DEFAULT_STATUS, spec.message or default


def _sse(event: str | None, payload: object) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(payload).encode() + b"\n\n"


def error_frame(api: str, kind: str, status: int, message: str) -> bytes:
    """The in-stream failure a provider of this API would send.  Anthropic's is the
    shape of Switchyard's own error event; OpenAI's providers send other shapes than
    Switchyard's (a chunk with a numeric code, an error without the flat fields)."""
    if api == ANTHROPIC:
        if kind == "overload_message":
            return _sse("error", {"type": "error", "error": {"message": message}})
        return APIS[api].error_event(message, *code_and_type_for_status(api, status))
    if api == GEMINI:  # Gemini has one in-stream error, its error model's (`response_failed` is it too)
        if kind == "overload_message":
            status = 400  # the text alone says "overload"; Google's SDKs need some code beside it
        return APIS[api].error_event(message, *code_and_type_for_status(api, status))
    if api == RESPONSES:
        if kind == "overload_message":
            return _sse("error", {"type": "error", "code": None, "message": message, "param": None, "sequence_number": 0})
        code, error_type = code_and_type_for_status(api, status)
        error = {"code": code, "message": message}
        if kind == "response_failed":
            response = {"id": "resp_switchyard_fault", "object": "response", "status": "failed", "error": error, "output": []}
            return _sse("response.failed", {"type": "response.failed", "sequence_number": 0, "response": response})
        nested = {"type": error_type, **error, "param": None}
        return _sse("error", {"type": "error", "error": nested, "sequence_number": 0})
    if kind == "overload_message":
        return _sse(None, {"error": {"message": message}})
    return _sse(None, {"id": "switchyard-fault", "object": "chat.completion.chunk", "choices": [],
                       "error": {"code": status, "message": message}})


def error_body(api: str, status: int, message: str) -> bytes:
    """The error body a provider of this API sends with `status`."""
    return APIS[api].error_body(message, *code_and_type_for_status(api, status))


def websocket_message(api: str, kind: str, status: int, message: str) -> bytes:
    """The failure as a Responses WebSocket server sends it: an HTTP error as the
    `error` message carrying its status; an in-stream one as the JSON its SSE
    frame carries (the WebSocket sends each event's data as one message)."""
    if kind == "http_error":
        return websocket_error(status, error_body(api, status, message))
    (frame,) = FrameSplitter().feed(error_frame(api, kind, status, message))
    data = frame.event.data
    assert data is not None
    return data.encode()
