"""Answers' content codings, decoded as they arrive.

Upstreams are asked for `Accept-Encoding: gzip, deflate`, so that the relay can
read the answers it classifies and hand the client plain bytes.  Some send br
or zstd anyway; those are read too (with mitmproxy's own decoders' libraries).
A coding none of these is refused as that attempt's transport failure: passed
on, its bytes would reach a client that never asked for it, and could not be
classified on the way.
"""

from __future__ import annotations

import sys
import zlib
from typing import Protocol

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


class MalformedBody(Exception):
    """A compressed body that does not decode."""


class UnsupportedCoding(Exception):
    """A content coding the relay cannot read (and did not ask for)."""


DECODED_PER_READ = 1024 * 1024  # decoded bytes one step may produce: a small body can inflate a thousandfold


class Decoder(Protocol):
    """Compressed bytes in (`feed`), decoded bytes out in bounded steps (`read`), so
    that what a compressed body inflates to is never held whole: the reader takes
    one step, hands it on, and asks for the next only once that is gone."""

    def feed(self, data: bytes) -> None:
        """Keep `data` to decode; nothing is decoded yet."""
        ...

    def read(self, limit: int) -> bytes:
        """Up to `limit` decoded bytes of what was fed.  Raises MalformedBody."""
        ...

    @property
    def pending(self) -> bool:
        """Whether `read` may give more without more input."""
        ...

    def flush(self) -> bytes: ...

    @property
    def complete(self) -> bool:
        """Whether the compressed stream reached its end: a cut one must not look like a clean end."""
        ...


def decoder_for(content_encoding: str) -> Decoder | None:
    """None when there is nothing to decode; raises UnsupportedCoding."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return _Zlib("gzip")
    if coding == "deflate":
        return _Zlib("deflate")
    if coding == "br":
        return _Brotli()
    if coding == "zstd":
        return _Zstd()
    raise UnsupportedCoding(f"upstream answered with Content-Encoding {content_encoding.strip()[:40]!r}, "
                            "which it was not asked for and Switchyard cannot read")


def decode_within(data: bytes, content_encoding: str, limit: int) -> bytes | None:
    """`data` decoded whole, or None if it decodes to more than `limit` bytes (only
    `limit` + one step is ever decoded).  Raises MalformedBody, UnsupportedCoding."""
    decoder = decoder_for(content_encoding)
    if decoder is None:
        return data if len(data) <= limit else None
    decoder.feed(data)
    out: list[bytes] = []
    size = 0
    while True:
        piece = decoder.read(min(DECODED_PER_READ, limit + 1 - size))
        out.append(piece)
        size += len(piece)
        if size > limit:
            return None
        if not decoder.pending:
            break
    tail = decoder.flush()
    if size + len(tail) > limit:
        return None
    if not decoder.complete:
        raise MalformedBody("the compressed body is cut short")
    return b"".join(out) + tail


class _Fed:
    """What every incremental decoder shares: the input fed and not decoded yet, and
    whether anything was fed at all (an empty body is complete).  `read` turns the
    library's own errors (`_errors`) into MalformedBody around each subclass's `_read`."""

    __slots__ = ("_input", "_fed")
    _errors: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._input = b""  # fed, not decoded yet
        self._fed = False

    def feed(self, data: bytes) -> None:
        if data:
            self._fed = True
            self._input = self._input + data if self._input else data

    def read(self, limit: int) -> bytes:
        try:
            return self._read(limit)
        except self._errors as exc:
            raise MalformedBody(str(exc)) from None

    def _read(self, limit: int) -> bytes:
        raise NotImplementedError


class _Zlib(_Fed):
    """gzip or deflate.  HTTP's "deflate" is zlib-wrapped by the spec and raw in some
    servers: both are taken, told apart by the zlib header once two bytes are in."""

    __slots__ = ("_gzip", "_inner", "_full")
    _errors = (zlib.error,)

    def __init__(self, coding: str) -> None:
        super().__init__()
        self._gzip = coding == "gzip"
        self._inner = zlib.decompressobj(16 + zlib.MAX_WBITS) if self._gzip else None
        self._full = False  # the last read filled its limit: zlib may hold more output

    def _read(self, limit: int) -> bytes:
        if self._inner is None:
            if len(self._input) < 2:
                return b""
            cmf, flg = self._input[0], self._input[1]
            wrapped = cmf & 0x0F == 8 and (cmf * 256 + flg) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        data, self._input = self._input, b""
        out: list[bytes] = []
        size = 0
        while size < limit:  # (a max_length of 0 would mean no limit at all)
            piece = self._inner.decompress(data, limit - size)
            out.append(piece)
            size += len(piece)
            data = self._inner.unconsumed_tail
            if not (self._inner.eof and self._inner.unused_data):
                break
            if not self._gzip:
                raise zlib.error("bytes after the end of a deflate stream")
            data = self._inner.unused_data
            self._inner = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip allows several members, one after another
        self._input = data
        self._full = size >= limit
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def pending(self) -> bool:
        return bool(self._input) and self._inner is not None or self._full

    def flush(self) -> bytes:
        try:
            return self._inner.flush() if self._inner is not None else b""
        except zlib.error as exc:
            raise MalformedBody(str(exc)) from None

    @property
    def complete(self) -> bool:
        return not self._fed or (self._inner is not None and self._inner.eof)


class _Brotli(_Fed):
    """brotli.  Its output limit is a soft one (a buffer that grows), and whether it
    holds more output it does not say: what came past a read's limit waits here, and
    after a read that gave anything, the next one asks again."""

    __slots__ = ("_inner", "_output", "_more")

    def __init__(self) -> None:
        super().__init__()
        self._inner = brotli.Decompressor()
        self._output = b""  # decoded past the last read's limit
        self._more = False  # the last step gave output: it may hold more

    def read(self, limit: int) -> bytes:
        out = self._output
        if len(out) < limit and (self._input or self._more):
            try:
                if self._inner.can_accept_more_data():
                    data, self._input = self._input, b""
                else:
                    data = b""  # it must be drained with empty input first
                step = self._inner.process(data, output_buffer_limit=limit - len(out))
            except brotli.error as exc:
                raise MalformedBody(str(exc)) from None
            self._more = bool(step) and not self._inner.is_finished()
            out += step
        self._output = out[limit:]
        return out[:limit] if len(out) > limit else out

    @property
    def pending(self) -> bool:
        return bool(self._input) or bool(self._output) or self._more

    def flush(self) -> bytes:
        return b""

    @property
    def complete(self) -> bool:
        return not self._fed or self._inner.is_finished()


class _Zstd(_Fed):
    """zstd; a body may hold several frames, one after another."""

    __slots__ = ("_inner",)
    _errors = (zstd.ZstdError, EOFError)

    def __init__(self) -> None:
        super().__init__()
        self._inner = zstd.ZstdDecompressor()

    def _read(self, limit: int) -> bytes:
        data, self._input = self._input, b""
        out: list[bytes] = []
        size = 0
        while size < limit:
            if self._inner.eof:  # a frame ended: what follows starts the next
                data = self._inner.unused_data + data
                if not data:
                    break
                self._inner = zstd.ZstdDecompressor()
            if not data and self._inner.needs_input:
                break
            piece = self._inner.decompress(data, limit - size)
            data = b""
            out.append(piece)
            size += len(piece)
            if not self._inner.eof and (self._inner.needs_input or size >= limit):
                break
        self._input = data
        return b"".join(out)

    @property
    def pending(self) -> bool:
        inner = self._inner
        return bool(self._input) or (not inner.eof and not inner.needs_input) or (inner.eof and bool(inner.unused_data))

    def flush(self) -> bytes:
        return b""

    @property
    def complete(self) -> bool:
        return not self._fed or self._inner.eof
