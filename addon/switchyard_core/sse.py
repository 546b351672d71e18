"""Incremental Server-Sent Events framing that never alters a byte.

Switchyard must be able to hand the client exactly what the winning upstream
sent, so the splitter keeps every frame's raw bytes (including its terminating
blank line) and only *interprets* them in a separate, parsed view.  Any
chunking of the same byte stream yields the same frames.

Frame boundaries follow the WHATWG rules: a blank line ends an event, and a
line ends at LF, CRLF or a lone CR.  A CR that arrives as the last byte of a
chunk is ambiguous (it may be the first half of CRLF), so it is resolved only
once the next byte, or the end of the stream, is seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_CR = 0x0D
_LF = 0x0A


class Frame:
    """One event as the upstream sent it: raw bytes, ending with its blank line.

    The last frame of a stream may lack the blank line (an unterminated tail
    flushed at end of stream).  Parsing is lazy: after commit most frames are
    forwarded without ever being decoded.
    """

    __slots__ = ("raw", "_event")

    def __init__(self, raw: bytes, event: "SseEvent | None" = None) -> None:
        self.raw = raw
        self._event = event  # given where the bytes are not SSE (a WebSocket message)

    @property
    def event(self) -> "SseEvent":
        if self._event is None:
            self._event = parse_frame(self.raw)
        return self._event

    def __repr__(self) -> str:
        return f"Frame({self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)


@dataclass(slots=True)
class SseEvent:
    """The parsed view of a frame: what a spec-following client would see.

    `bare_json` is set when the frame holds no SSE field at all but its text is
    a JSON object: some servers (Ollama, go-openai fixtures) write a raw error
    object into an event-stream body.  `data` then holds that text.
    """

    event: str | None = None
    data: str | None = None
    comment_only: bool = False
    bare_json: bool = False
    _json: Any = field(default=None, repr=False)
    _json_parsed: bool = field(default=False, repr=False)

    def json(self) -> Any:
        """The data decoded as JSON, or None when it is absent or not JSON."""
        if not self._json_parsed:
            self._json_parsed = True
            if self.data:
                try:
                    self._json = json.loads(self.data)
                except (ValueError, RecursionError):
                    self._json = None
        return self._json


def compact_json(data: Any) -> bytes:
    """`data` as compact JSON, its text as UTF-8; a lone surrogate (half of an emoji
    whose other half is in the next frame, written `\\ud83d`) has no UTF-8, so then
    everything not ASCII is escaped, as it came."""
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def data_event(data: bytes) -> bytes:
    """An SSE event whose `data` is `data`, exactly (each of its lines a `data:`
    field): a WebSocket message as the stream event that carries the same text."""
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return b"data: " + lines.replace(b"\n", b"\ndata: ") + b"\n\n"


def _split_lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def parse_frame(raw: bytes) -> SseEvent:
    text = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")  # a stream may start with a BOM
    lines = _split_lines(text)
    event: str | None = None
    data_lines: list[str] = []
    saw_field = False
    other_lines: list[str] = []
    for line in lines:
        if line == "":
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            saw_field = True
            data_lines.append(value)
        elif name == "event":
            saw_field = True
            event = value
        elif name in ("id", "retry"):
            saw_field = True
        else:
            other_lines.append(line)
    if not saw_field and other_lines:
        candidate = "\n".join(other_lines).strip()
        if candidate.startswith("{"):
            return SseEvent(data=candidate, bare_json=True)
    if not saw_field or (not data_lines and event is None) or data_lines == [""]:
        # comments, blank lines, or an empty data buffer: per the SSE spec
        # nothing is dispatched, so there is nothing a client would act on
        return SseEvent(comment_only=True)
    return SseEvent(event=event, data="\n".join(data_lines) if data_lines else None)


class FrameSplitter:
    """Feeds on arbitrary chunks, yields complete frames with their raw bytes."""

    __slots__ = ("_buf", "_scan", "_line_start", "_line_has_text", "_cr_held")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # next byte of _buf not yet examined
        self._line_start = True  # the byte at _scan starts a new line
        self._line_has_text = False  # the current frame has a non-blank line
        self._cr_held = False  # _buf may hold a CR (then only the general path will do)

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[Frame]:
        if not chunk:
            return []
        if not self._cr_held and b"\r" not in chunk:
            return self._feed_lf(chunk)
        self._cr_held = True
        self._buf += chunk
        frames: list[Frame] = []
        buf = self._buf
        i = self._scan
        n = len(buf)
        start = 0
        while i < n:
            b = buf[i]
            if b == _CR or b == _LF:
                if b == _CR:
                    if i + 1 >= n:
                        break  # wait: this CR may be half of a CRLF
                    end = i + 2 if buf[i + 1] == _LF else i + 1
                else:
                    end = i + 1
                if self._line_start and self._line_has_text:
                    # a blank line ends a frame that has content; blank lines
                    # before any content stay with the next frame's raw bytes
                    frames.append(Frame(bytes(buf[start:end])))
                    start = end
                    self._line_has_text = False
                self._line_start = True
                i = end
                continue
            if self._line_start:
                self._line_start = False
                self._line_has_text = True
            # skip to the next line terminator quickly
            j = _next_eol(buf, i, n)
            i = j
        if start:
            del buf[:start]
            i -= start
        self._scan = i
        if not buf:
            self._cr_held = False
        return frames

    def _feed_lf(self, chunk: bytes) -> list[Frame]:
        """The common case, LF line ends only: frames end at `\n\n`, found by
        bytes.find instead of a step per line.  Leaves the same state as the
        general path, so the two can alternate."""
        if not self._buf and len(chunk) > 2 and chunk.find(b"\n\n") == len(chunk) - 2 and chunk[:1] != b"\n":
            return [Frame(chunk)]  # exactly one whole frame: by far the most common read
        buf = self._buf
        pos = 0
        if buf:
            search = len(buf) - 1  # a `\n\n` may straddle what was held and the chunk
            buf += chunk
            if buf.find(b"\n\n", search) < 0:
                # nothing ends in this read: keep it without copying what is held, which
                # would make a frame of megabytes (base64 images) cost its size per read
                self._scan = len(buf)
                self._line_start = chunk.endswith(b"\n")
                self._line_has_text = self._line_has_text or bool(chunk.strip(b"\n"))
                return []
            data = bytes(buf)
        else:
            data = chunk
            search = 0
        frames: list[Frame] = []
        while True:
            found = data.find(b"\n\n", search)
            if found < 0:
                break
            end = found + 2
            if data[pos:found].strip(b"\n"):
                frames.append(Frame(data[pos:end]))
                pos = end
                search = end
            else:
                search = found + 1  # blank lines before content stay with the next frame
        rest = data[pos:]
        self._buf = bytearray(rest)
        self._scan = len(rest)
        self._line_start = not rest or rest.endswith(b"\n")
        self._line_has_text = bool(rest.strip(b"\n"))
        return frames

    def peek(self, limit: int | None = None) -> bytes:
        """The incomplete tail (its first `limit` bytes), left in place."""
        return bytes(self._buf if limit is None else self._buf[:limit])

    def drain(self) -> bytes:
        """Hand back the incomplete tail unparsed and start over."""
        tail = bytes(self._buf)
        self._buf.clear()
        self._scan = 0
        self._line_start = True
        self._line_has_text = False
        self._cr_held = False
        return tail

    def finish(self) -> list[Frame]:
        """End of stream: an unterminated tail becomes a last frame."""
        tail = self.drain()
        return [Frame(tail)] if tail else []


def _next_eol(buf: bytearray, i: int, n: int) -> int:
    lf = buf.find(b"\n", i, n)
    cr = buf.find(b"\r", i, lf if lf >= 0 else n)  # only up to the LF: not to the end, line after line
    if lf < 0:
        return cr if cr >= 0 else n
    return lf if cr < 0 else cr
