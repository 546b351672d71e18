"""An upstream's answer in the client's API: the stream frame by frame, or a whole answer.

`StreamTranslator.feed` takes each upstream event (already split and parsed by
`sse.py`), decodes it into answer events (`ir.py`) and encodes those as the
client's frames: complete SSE frames the gate can stage or forward as they are.
The upstream's lifecycle becomes the client's (or nothing yet), its output the
client's output, its keepalives the client's keepalive, its error the client's
in-band error (`errors.py`), its end the client's end.  After an error nothing
more is written: the client has been told how the answer ended.

What holds for every pair is kept here, once: the client's stream opens before
its first content even when the upstream named no start; a tool call that
finished with no arguments gets `{}` (every client API wants its arguments to be
JSON); a finish of STOP after tool calls reads as TOOL_CALLS (Gemini and
Responses say no more than "done" for a tool-call answer); the client's ids are
made from the upstream's, with the client's own prefix.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from ...apis import APIS
from ...apis.base import ErrorInfo
from ...sse import SseEvent
from . import anthropic, chat, gemini, ir, responses_in, responses_out
from .base import Decoder, Encoder
from .errors import error_body

DECODERS: dict[str, type[Decoder]] = {
    chat.NAME: chat.ChatDecoder, anthropic.NAME: anthropic.AnthropicDecoder,
    responses_in.NAME: responses_in.ResponsesDecoder, gemini.NAME: gemini.GeminiDecoder,
}
ENCODERS: dict[str, type[Encoder]] = {
    chat.NAME: chat.ChatEncoder, anthropic.NAME: anthropic.AnthropicEncoder,
    responses_out.NAME: responses_out.ResponsesEncoder, gemini.NAME: gemini.GeminiEncoder,
}

# the prefixes the APIs give their answers' ids: dropped, so the client's own goes on instead
_ID_PREFIX = re.compile(r"^(?:chatcmpl-|msg_|resp_)")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def base_id(upstream_id: str | None) -> str:
    """The id the client's answer is named by: the upstream's, without its API's prefix
    (the client's goes on instead) and with only characters every API's ids use; a
    fresh one when the upstream named none."""
    if upstream_id:
        found = _ID_UNSAFE.sub("_", _ID_PREFIX.sub("", upstream_id))
        if found:
            return found
    return uuid.uuid4().hex


class StreamTranslator:
    """One upstream stream, translated into the client's API, event by event."""

    def __init__(self, upstream_api: str, client_api: str, *, model: str, usage_wanted: bool,
                 created: int | None = None) -> None:
        self.upstream_api = upstream_api
        self.client_api = client_api
        self._decoder = DECODERS[upstream_api]()
        self._encoder = ENCODERS[client_api](model, created or int(time.time()), usage_wanted)
        self._args: dict[int, bool] = {}  # tool calls begun -> whether any arguments came
        self._finished = False
        self._failed = False
        self._closed = False
        self._reasoning_dropped = False

    @property
    def dropped(self) -> set[str]:
        """What the upstream said that the client was not given (for one log line)."""
        found = self._decoder.dropped | self._encoder.dropped
        return found | {"reasoning"} if self._reasoning_dropped else found

    @property
    def closed(self) -> bool:
        """The client's stream has its end (the upstream's end marker came)."""
        return self._closed

    def feed(self, event: SseEvent) -> bytes:
        if self._failed or self._closed:
            return b""
        out = [self._apply(answer_event) for answer_event in self._decoder.decode(event)]
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self) -> bytes:
        """The upstream's stream ended: the client's end, if the upstream's end marker
        was seen (else b"": the answer was cut, and the caller says so)."""
        if self._failed or self._closed or not self._decoder.complete or not self._encoder.started:
            return b""  # nothing started: an empty answer, which the gate fails, is no answer to close
        return self._close()

    def _apply(self, event: ir.Event) -> bytes:
        encoder = self._encoder
        # the common cases first: this runs for every delta of every translated answer
        if isinstance(event, ir.Text):
            return (b"" if encoder.started else self._start()) + encoder.text(event.text)
        if isinstance(event, ir.ToolArgs):
            if event.key not in self._args:
                return b""  # arguments of a call that never began: nothing to attach them to
            self._args[event.key] = True
            return encoder.tool_args(event.key, event.delta)
        if isinstance(event, ir.Reasoning):
            head = b"" if encoder.started else self._start()
            if encoder.drops_reasoning:
                self._reasoning_dropped = True
                return head + encoder.keepalive()  # the client hears that the answer goes on
            return head + encoder.reasoning(event.text)
        if isinstance(event, ir.Start):
            return b"" if encoder.started else self._start(event)
        if isinstance(event, ir.ToolStart):
            self._args[event.key] = False
            return (b"" if encoder.started else self._start()) + encoder.tool_start(event.key, event.id, event.name)
        if isinstance(event, ir.ToolEnd):
            return self._no_arguments(event.key) + encoder.tool_end(event.key)
        if isinstance(event, ir.UsageReport):
            encoder.add_usage(event.usage)
            return b""
        if isinstance(event, ir.Finished):
            return self._finish(event.reason)
        if isinstance(event, ir.End):
            return self._close()
        if isinstance(event, ir.Failed):
            self._failed = True
            return encoder.error(event.error)
        return encoder.keepalive()

    def _start(self, event: ir.Start = ir.Start()) -> bytes:
        if event.usage is not None:
            self._encoder.add_usage(event.usage)
        return self._encoder.start(ir.Start(base_id(event.id), event.created, event.usage))

    def _no_arguments(self, key: int) -> bytes:
        if self._args.get(key) is False:
            self._args[key] = True
            return self._encoder.no_arguments(key)
        return b""

    def _finish(self, reason: ir.Finish) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        if reason is ir.Finish.STOP and self._args:
            reason = ir.Finish.TOOL_CALLS
        head = b"" if self._encoder.started else self._start()
        return head + b"".join(self._no_arguments(key) for key in list(self._args)) + self._encoder.finish(reason)

    def _close(self) -> bytes:
        self._closed = True
        head = self._finish(ir.Finish.STOP)
        return head + self._encoder.close()


def stream_translator(upstream_api: str, client_api: str, *, model: str, usage_wanted: bool,
                      created: int | None = None) -> StreamTranslator:
    """A translator for one upstream stream.  `model`: the model the client's frames
    name; `usage_wanted`: a Chat client asked for the usage chunk
    (`stream_options.include_usage`); the other APIs always carry usage.
    `created`: the Unix time Chat and Responses frames carry when the upstream says
    none (default: now)."""
    return StreamTranslator(upstream_api, client_api, model=model, usage_wanted=usage_wanted, created=created)


_WHOLE_EVENTS = {chat.NAME: chat.whole_events, anthropic.NAME: anthropic.whole_events,
                 responses_in.NAME: responses_in.whole_events, gemini.NAME: gemini.whole_events}


def whole_answer(upstream_api: str, body: Any, dropped: set[str] | None = None) -> ir.Answer:
    """A whole (non-streaming) upstream answer, read."""
    answer = ir.Answer()
    found = APIS[upstream_api].body_error(body)
    if found is not None:
        answer.error = found
        return answer
    if not isinstance(body, dict) and not (upstream_api == gemini.NAME and isinstance(body, list)):
        answer.error = ErrorInfo(message="the upstream's answer is no JSON object", event_type="body")
        return answer
    for event in _WHOLE_EVENTS[upstream_api](body, set() if dropped is None else dropped):
        answer.apply(event)
    answer.id = base_id(answer.id)
    if answer.calls:
        for call in answer.calls:
            call.arguments = call.arguments or ["{}"]
    return answer


def translate_whole(upstream_api: str, client_api: str, body: Any, *, model: str,
                    created: int | None = None, dropped: set[str] | None = None) -> dict[str, Any]:
    """A whole (non-streaming) upstream answer as the client's API's whole answer; an
    error the body carries, as the client's API's error body.  `dropped` collects
    what the client was not given."""
    answer = whole_answer(upstream_api, body, dropped)
    if answer.error is not None:
        decoded: dict[str, Any] = json.loads(error_body(client_api, answer.error))
        return decoded
    when = answer.created or created or int(time.time())
    if client_api == chat.NAME:
        return chat.whole_body(answer, model, when)
    if client_api == anthropic.NAME:
        if answer.reasoning and dropped is not None:
            dropped.add("reasoning")
        return anthropic.whole_body(answer, model)
    if client_api == responses_out.NAME:
        if answer.reasoning and dropped is not None:
            dropped.add("reasoning")
        return responses_out.whole_body(answer, model, when)
    return gemini.whole_body(answer, model)
