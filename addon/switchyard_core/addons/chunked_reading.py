"""mitmproxy's reading of a chunked HTTP/1 body, with a short way for a whole chunk.

mitmproxy reads every chunked body with h11's `ChunkedReader`, in Python: per
chunk a line search, a regular expression, the chunk copied out of a
bytearray, and a second call that consumes the chunk's CRLF and finds nothing
more.  Each answer Switchyard relays is chunked by the relay, one chunk per
upstream read, and mitmproxy reads it that way frame by frame: the largest
piece of work on a relayed frame that Switchyard does in its own process and
plain mitmdump does not need to redo for it (docs/architecture.md, "Speed").

`FastChunkedReader` is h11's reader with one short way: when the buffer starts
with a whole chunk (a size line of hex digits only, the data, its CRLF), that
chunk is taken in one step, as the same `Data` event h11 gives for it.
Anything else (a chunk extension or whitespace on the size line, a chunk split
across reads, a bad footer, the last chunk and its trailers, an end before the
body's) goes through h11's own code, which also raises what it raises.
`install` puts it behind mitmproxy's `make_body_reader`, checked once (with a
test run against h11's own reader) and left out if mitmproxy or h11 moved.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from h11 import Data
from h11._readers import ChunkedReader
from h11._receivebuffer import ReceiveBuffer

_WHOLE_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})\r\n")
_SAMPLE = (b"5\r\nhello\r\n", b"3;x=1\r\nabc\r\n", b"1\r\n", b"!\r\n", b"4 \r\nwxyz\r\n", b"0\r\n\r\n")


class FastChunkedReader(ChunkedReader):
    def __call__(self, buf: ReceiveBuffer) -> Any:
        if not self._bytes_to_discard and not self._bytes_in_chunk and not self._reading_trailer:
            raw: bytearray = buf._data
            if not raw:
                return None
            size_line = _WHOLE_CHUNK_SIZE.match(raw)
            if size_line is not None:
                start = size_line.end()
                end = start + int(size_line.group(1), 16)
                if end > start and raw[end:end + 2] == b"\r\n":
                    data = bytes(raw[start:end])
                    del raw[:end + 2]
                    buf._next_line_search = 0
                    buf._multiple_lines_search = 0
                    return Data(data=data, chunk_start=True, chunk_end=True)
        return super().__call__(buf)


def events(reader: Callable[[ReceiveBuffer], Any], pieces: list[bytes]) -> list[tuple[str, bytes, bool, bool]]:
    """Every event `reader` gives for a body fed in these pieces, as mitmproxy reads them
    (until the reader has nothing more after each piece); an error ends the list."""
    buf = ReceiveBuffer()
    out: list[tuple[str, bytes, bool, bool]] = []
    for piece in pieces:
        buf += piece
        while True:
            try:
                event = reader(buf)
            except Exception as exc:  # noqa: BLE001 -- the error is part of what is compared
                out.append((type(exc).__name__, b"", False, False))
                return out
            if event is None:
                break
            if isinstance(event, Data):
                out.append(("data", bytes(event.data), event.chunk_start, event.chunk_end))
            else:
                out.append((type(event).__name__, b"", False, False))
                return out
    return out


_installed: tuple[Any, Callable[[int | None], Any]] | None = None  # mitmproxy's module and its own function


def install() -> str | None:
    """Put the reader behind mitmproxy's `make_body_reader`: None once it is in use,
    else why not (then mitmproxy reads as it always does)."""
    global _installed
    if _installed is not None:
        return None
    try:
        from mitmproxy.proxy.layers.http import _http1
    except ImportError:
        return "mitmproxy.proxy.layers.http has no _http1"
    original = getattr(_http1, "make_body_reader", None)
    if not callable(original):
        return "mitmproxy's HTTP/1 layer has no make_body_reader"
    try:
        if type(original(None)) is not ChunkedReader:
            return "mitmproxy's make_body_reader does not read chunked bodies with h11's ChunkedReader"
        pieces = [b"".join(_SAMPLE[:3]), _SAMPLE[3][:1], _SAMPLE[3][1:], *_SAMPLE[4:]]
        if events(FastChunkedReader(), pieces) != events(ChunkedReader(), pieces):
            return "h11's ChunkedReader reads differently than this version expects"
    except (AttributeError, TypeError) as exc:
        return f"h11's reader or receive buffer moved: {exc}"

    def make_body_reader(expected_size: int | None) -> Any:
        return FastChunkedReader() if expected_size is None else original(expected_size)

    _http1.make_body_reader = make_body_reader
    _installed = (_http1, original)
    return None


def uninstall() -> None:
    """mitmproxy's own again (the script is unloaded); readers already made read on."""
    global _installed
    if _installed is not None:
        module, original = _installed
        module.make_body_reader = original
        _installed = None
