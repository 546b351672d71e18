"""The client's side of an exchange: what is written back, and how.

The attempt core decides *what* the client gets; this module owns *how*:
`x-switchyard-*` headers on every response, the pre-answer keepalive (headers
and SSE comments while no upstream has answered; the core says when), the
comment that names the winner when headers left early, and in-band error events
that never run into a frame the upstream left open.  No I/O: everything goes to
the `ClientSink` synchronously, in order.
"""

from __future__ import annotations

from typing import Protocol

from ..apis import Api
from ..redaction import StreamRedactor
from ..ws_items import redact_message
from ..sse import data_event
from ..upstreams.body import Body

SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
KEEPALIVE_NOTE = "switchyard keepalive"  # an SSE comment where the API's clients take one
FRAME_ENDS = (b"\n\n", b"\r\r", b"\r\n\r\n")


class ClientSink(Protocol):
    """Where the client's response goes (the relay's HTTP response to mitmproxy).

    Writes are synchronous: they are made in whatever callback produced the
    bytes, and `pace` names the answer to pause while the client cannot keep up."""

    @property
    def headers_sent(self) -> bool: ...

    def start(self, status: int, headers: list[tuple[str, str]]) -> None: ...

    def write(self, data: bytes) -> None: ...

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...

    def pace(self, producer: Body | None) -> None: ...

    def abort(self) -> None: ...

    def message(self, data: bytes) -> None:
        """A WebSocket message, whole (only a WebSocket turn's sink takes these)."""
        ...


class HeldSink:
    """The client's answer before the relay's connection for it has arrived: what the
    core writes meanwhile (rarely anything) is held and replayed, in order, once it has."""

    def __init__(self) -> None:
        self._calls: list[tuple[str, tuple[object, ...]]] = []
        self._started = False

    @property
    def headers_sent(self) -> bool:
        return self._started

    def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._started = True
        self._calls.append(("start", (status, headers)))

    def write(self, data: bytes) -> None:
        self._calls.append(("write", (data,)))

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._started = True
        self._calls.append(("send_whole", (status, headers, body)))

    def pace(self, producer: Body | None) -> None:
        self._calls.append(("pace", (producer,)))

    def abort(self) -> None:
        self._calls.append(("abort", ()))

    def message(self, data: bytes) -> None:
        self._calls.append(("message", (data,)))

    def replay(self, sink: ClientSink) -> None:
        calls, self._calls = self._calls, []
        for name, args in calls:
            getattr(sink, name)(*args)


class ClientStream:
    def __init__(self, sink: ClientSink, api: Api) -> None:
        self.sink = sink
        self.api = api
        self.attempts = 0  # shown in x-switchyard-attempts
        self._tail = b""  # the last bytes written
        self.answered = False  # anything but the pre-answer keepalive went out: no more keepalives
        # every byte the client got, while a cut answer may be continued (None: not kept, or too long)
        self.transcript: bytearray | None = None
        self._transcript_limit = 0
        self._redactor: StreamRedactor | None = None

    def keep_transcript(self, limit: int) -> None:
        """Keep what the client gets, up to `limit` bytes, to know what a continuation
        must not repeat: what is written, and each WebSocket message as the SSE event
        of the same text."""
        self.transcript = bytearray()
        self._transcript_limit = limit

    def message(self, message: bytes) -> None:
        """A WebSocket message for the client, whole: an upstream's own secrets in it
        are redacted (no value is split across two messages), and it is kept as the
        SSE event of the same text for a continuation to read."""
        self.answered = True
        redactor = self._redactor
        if redactor is not None:
            message = redact_message(message, redactor.secrets)
        self.sink.message(message)
        if self.transcript is not None:
            self._keep(data_event(message))

    @property
    def headers_sent(self) -> bool:
        return self.sink.headers_sent

    def _ours(self, headers: list[tuple[str, str]], upstream: str) -> list[tuple[str, str]]:
        return [*headers, ("x-switchyard-upstream", upstream), ("x-switchyard-attempts", str(self.attempts))]

    def start(self, status: int, headers: list[tuple[str, str]], upstream: str) -> None:
        self.answered = True
        self.sink.start(status, self._ours(headers, upstream))

    def send_whole(self, status: int, headers: list[tuple[str, str]], body: bytes, upstream: str) -> None:
        self.answered = True
        self.sink.send_whole(status, self._ours(headers, upstream), body)

    def send_error(self, status: int, message: str, code: str, upstream: str) -> None:
        """A JSON error in the API's shape, as the whole answer."""
        body = self.api.error_body(message, code)
        self.send_whole(status, [("Content-Type", "application/json")], body, upstream)

    def passing_from(self, secrets: tuple[bytes, ...]) -> None:
        """What an upstream sends is written from now on with the values its `${VAR}`s
        hold redacted, across reads (`StreamRedactor`); none: written as sent."""
        self.release()
        self._redactor = StreamRedactor(secrets) if secrets else None

    def write(self, data: bytes) -> None:
        """An upstream's bytes, as sent but for its secrets (`_write`, inline: the path every token takes)."""
        self.answered = True
        if self._redactor is not None:
            data = self._redactor.feed(data)
        if data:
            self.sink.write(data)
            self._tail = data[-4:]
            if self.transcript is not None:
                self._keep(data)

    def release(self) -> None:
        """Before anything of Switchyard's own, and before the response ends: what was
        held back because it might begin a secret."""
        if self._redactor is not None:
            self._write(self._redactor.flush())

    def _write(self, data: bytes) -> None:
        if data:
            self.sink.write(data)
            self._tail = data[-4:]
            if self.transcript is not None:
                self._keep(data)

    def _keep(self, data: bytes) -> None:
        kept = self.transcript
        if kept is not None:
            if len(kept) + len(data) > self._transcript_limit:
                self.transcript = None
            else:
                kept += data

    def _own(self, data: bytes) -> None:
        """Switchyard's own bytes, after whatever the upstream's were."""
        self.release()
        self._write(data)

    def cut(self) -> None:
        """A body forwarded as sent broke: end it so that the client sees a cut."""
        self.release()
        self.sink.abort()

    def announce(self, upstream: str) -> None:
        """Headers left before the winner was known: name it in a comment."""
        self.answered = True
        self._own(self.api.comment(f"switchyard upstream={upstream} attempts={self.attempts}"))

    def error_event(self, message: str, code: str, error_type: str | None = None) -> None:
        """An in-band error in the API's shape, after whatever was written."""
        self.answered = True
        self.release()
        frame = self.api.error_event(message, code, error_type)
        if self._tail and not self._tail.endswith(FRAME_ENDS):
            frame = b"\n\n" + frame  # never run into a frame the upstream left open
        self._write(frame)

    def keepalive(self) -> None:
        """The pre-answer keepalive: headers (once) and a comment, while no upstream has answered."""
        if not self.sink.headers_sent:
            pending = [("x-switchyard-upstream", "pending"), ("x-switchyard-attempts", "pending")]
            self.sink.start(200, [*SSE_HEADERS, *pending])
        self._own(self.api.comment(KEEPALIVE_NOTE))
