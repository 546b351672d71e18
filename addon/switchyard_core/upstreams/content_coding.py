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


class Decoder(Protocol):
    def decompress(self, data: bytes) -> bytes:
        """Raises MalformedBody."""
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


class _Zlib:
    """gzip or deflate.  HTTP's "deflate" is zlib-wrapped by the spec and raw in some
    servers: both are taken, told apart by the zlib header once two bytes are in."""

    __slots__ = ("_gzip", "_inner", "_head", "_fed")

    def __init__(self, coding: str) -> None:
        self._gzip = coding == "gzip"
        self._inner = zlib.decompressobj(16 + zlib.MAX_WBITS) if self._gzip else None
        self._head = b""
        self._fed = False

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._decompress(data)
        except zlib.error as exc:
            raise MalformedBody(str(exc)) from None

    def _decompress(self, data: bytes) -> bytes:
        if data:
            self._fed = True
        if self._inner is None:
            self._head += data
            if len(self._head) < 2:
                return b""
            cmf, flg = self._head[0], self._head[1]
            wrapped = cmf & 0x0F == 8 and (cmf * 256 + flg) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            data, self._head = self._head, b""
        out = self._inner.decompress(data)
        while self._inner.eof and self._inner.unused_data:
            rest = self._inner.unused_data
            if not self._gzip:
                raise zlib.error("bytes after the end of a deflate stream")
            self._inner = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip allows several members, one after another
            out += self._inner.decompress(rest)
        return out

    def flush(self) -> bytes:
        try:
            return self._inner.flush() if self._inner is not None else b""
        except zlib.error as exc:
            raise MalformedBody(str(exc)) from None

    @property
    def complete(self) -> bool:
        return not self._fed or (self._inner is not None and self._inner.eof)


class _Incremental:
    """A decompressor fed piece by piece; `complete` once its stream has ended (or
    nothing came: an empty body is a whole one)."""

    __slots__ = ("_fed",)
    _errors: tuple[type[Exception], ...] = ()

    def __init__(self) -> None:
        self._fed = False

    def decompress(self, data: bytes) -> bytes:
        if not data:
            return b""
        self._fed = True
        try:
            return self._step(data)
        except self._errors as exc:
            raise MalformedBody(str(exc)) from None

    def flush(self) -> bytes:
        return b""

    @property
    def complete(self) -> bool:
        return not self._fed or self._finished()

    def _step(self, data: bytes) -> bytes:
        raise NotImplementedError

    def _finished(self) -> bool:
        raise NotImplementedError


class _Brotli(_Incremental):
    __slots__ = ("_inner",)
    _errors = (brotli.error,)

    def __init__(self) -> None:
        super().__init__()
        self._inner = brotli.Decompressor()

    def _step(self, data: bytes) -> bytes:
        return self._inner.process(data)

    def _finished(self) -> bool:
        return self._inner.is_finished()


class _Zstd(_Incremental):
    """zstd; a body may hold several frames, one after another."""

    __slots__ = ("_inner",)
    _errors = (zstd.ZstdError, EOFError)

    def __init__(self) -> None:
        super().__init__()
        self._inner = zstd.ZstdDecompressor()

    def _step(self, data: bytes) -> bytes:
        if self._inner.eof:  # the last read ended a frame exactly: this one starts the next
            self._inner = zstd.ZstdDecompressor()
        out = self._inner.decompress(data)
        while self._inner.eof and self._inner.unused_data:
            rest = self._inner.unused_data
            self._inner = zstd.ZstdDecompressor()
            out += self._inner.decompress(rest)
        return out

    def _finished(self) -> bool:
        return self._inner.eof
