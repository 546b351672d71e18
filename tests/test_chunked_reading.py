"""mitmproxy's reading of chunked bodies with a short way for a whole chunk
(addons/chunked_reading.py): every body, split any way, gives the events h11's own
reader gives, errors included; installed behind mitmproxy's `make_body_reader`."""

from __future__ import annotations

import pytest
from h11._readers import ChunkedReader
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.proxy.layers.http import _http1

from switchyard_core.addons import chunked_reading
from switchyard_core.addons.chunked_reading import FastChunkedReader, events


def _chunk(data: bytes, size_line: bytes | None = None) -> bytes:
    return (size_line if size_line is not None else b"%x" % len(data)) + b"\r\n" + data + b"\r\n"


_data = st.binary(min_size=1, max_size=40)
_size_line = st.sampled_from([None, b"%x", b"%X", b"0%x", b"%x;ext=1", b"%x ", b"%x\t"])


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    parts = []
    for data in draw(st.lists(_data, max_size=6)):
        form = draw(_size_line)
        parts.append(_chunk(data, None if form is None else form % len(data)))
    ending = draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nx-trailer: 1\r\n\r\n", b"", b"0\r\n"]))
    body = b"".join(parts) + ending
    if draw(st.booleans()):  # something malformed somewhere
        at = draw(st.integers(0, max(0, len(body) - 1)))
        body = body[:at] + draw(st.sampled_from([b"zz", b"\r\n", b"\n", b"-1", b";"])) + body[at:]
    return body


@st.composite
def _split(draw: st.DrawFn) -> list[bytes]:
    body = draw(_bodies())
    cuts = sorted(set(draw(st.lists(st.integers(0, len(body)), max_size=6))))
    bounds = [0, *cuts, len(body)]
    return [body[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


@settings(max_examples=400, deadline=None)
@given(_split())
def test_any_chunked_body_split_any_way_reads_as_h11_reads_it(pieces: list[bytes]) -> None:
    assert events(FastChunkedReader(), pieces) == events(ChunkedReader(), pieces)


def test_a_whole_chunk_is_one_event_and_nothing_is_left_of_it() -> None:
    body = _chunk(b"data: one\n\n") + _chunk(b"data: two\n\n") + b"0\r\n\r\n"
    assert events(FastChunkedReader(), [body]) == [
        ("data", b"data: one\n\n", True, True), ("data", b"data: two\n\n", True, True), ("EndOfMessage", b"", False, False)]


def test_installed_behind_mitmproxys_body_reader_for_chunked_bodies_only() -> None:
    own = _http1.make_body_reader
    assert chunked_reading.install() is None
    try:
        assert type(_http1.make_body_reader(None)) is FastChunkedReader
        assert type(_http1.make_body_reader(10)) is type(own(10))
        assert type(_http1.make_body_reader(-1)) is type(own(-1))
        assert chunked_reading.install() is None  # once
    finally:
        chunked_reading.uninstall()
    assert _http1.make_body_reader is own


def test_an_h11_that_reads_differently_leaves_mitmproxys_reader_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    own = _http1.make_body_reader
    monkeypatch.setattr(chunked_reading, "FastChunkedReader", type("Other", (ChunkedReader,), {
        "__call__": lambda self, buf: None}))
    assert chunked_reading.install() == "h11's ChunkedReader reads differently than this version expects"
    assert _http1.make_body_reader is own
