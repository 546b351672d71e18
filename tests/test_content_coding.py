"""Bounded decoding: however a compressed body is fed and however small each step,
the decoded bytes are the same, in order, and no step gives more than asked."""

from __future__ import annotations

import gzip
import os
import sys
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard_core.upstreams.content_coding import MalformedBody, decode_within, decoder_for

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

PLAIN = b"data: " + os.urandom(3000).hex().encode() + b"\n\n" + b"z" * 200_000 + b"data: [DONE]\n\n"


def _deflate_raw(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


ENCODERS = {
    "gzip": gzip.compress,
    "gzip-two-members": lambda data: gzip.compress(data[:1000]) + gzip.compress(data[1000:]),
    "deflate": zlib.compress,
    "deflate-raw": _deflate_raw,
    "br": brotli.compress,
    "zstd": zstd.compress,
    "zstd-two-frames": lambda data: zstd.compress(data[:1000]) + zstd.compress(data[1000:]),
}


def _coding(name: str) -> str:
    return name.split("-")[0]


def _decode_in_steps(coding: str, encoded: bytes, cuts: list[int], limit: int) -> bytes:
    decoder = decoder_for(coding)
    assert decoder is not None
    out = []
    pieces = [encoded[a:b] for a, b in zip([0, *cuts], [*cuts, len(encoded)])]
    for piece in pieces:
        decoder.feed(piece)
        while True:
            step = decoder.read(limit)
            assert len(step) <= limit
            out.append(step)
            if not decoder.pending:
                break
    out.append(decoder.flush())
    assert decoder.complete
    return b"".join(out)


@pytest.mark.parametrize("name", sorted(ENCODERS))
@settings(max_examples=25, deadline=None)
@given(data=st.data(), limit=st.sampled_from([1, 7, 4096, 65536, 1 << 20]))
def test_any_feeding_and_any_step_size_decode_the_same_bytes(name: str, data: st.DataObject, limit: int) -> None:
    encoded = ENCODERS[name](PLAIN)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(encoded) - 1)), max_size=6)))
    assert _decode_in_steps(_coding(name), encoded, cuts, limit) == PLAIN


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_a_bomb_is_decoded_one_bounded_step_at_a_time(coding: str) -> None:
    bomb = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress,
            "zstd": zstd.compress}[coding](bytes(256 * 1024 * 1024))
    assert len(bomb) < 1024 * 1024
    decoder = decoder_for(coding)
    assert decoder is not None
    decoder.feed(bomb)
    step = decoder.read(1024 * 1024)
    assert 0 < len(step) <= 1024 * 1024 and decoder.pending


def test_decode_within_refuses_what_inflates_past_its_limit() -> None:
    assert decode_within(gzip.compress(b"x" * 1000), "gzip", 1000) == b"x" * 1000
    assert decode_within(gzip.compress(b"x" * 1001), "gzip", 1000) is None
    assert decode_within(gzip.compress(bytes(1 << 30)), "gzip", 32 * 1024 * 1024) is None
    assert decode_within(b"plain", "", 10) == b"plain"
    with pytest.raises(MalformedBody):
        decode_within(gzip.compress(b"x" * 1000)[:-12], "gzip", 10_000)
