"""FrameSplitter / parse_frame: byte-exact framing and the parsed view.

Wire facts are the providers' and SDKs' own: how they frame events, and the
cases their parsers had to survive.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard_core.sse import Frame, FrameSplitter, SseEvent, parse_frame


def split_all(chunks: list[bytes]) -> list[Frame]:
    splitter = FrameSplitter()
    frames: list[Frame] = []
    for chunk in chunks:
        frames.extend(splitter.feed(chunk))
    frames.extend(splitter.finish())
    assert splitter.pending == 0
    return frames


def raws(frames: list[Frame]) -> list[bytes]:
    return [f.raw for f in frames]


def by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def assert_lossless(data: bytes, frames: list[Frame]) -> None:
    assert b"".join(raws(frames)) == data


def check_all_chunkings(data: bytes) -> list[bytes]:
    """Whole, byte by byte and every two-way split give the same frames."""
    whole = raws(split_all([data]))
    assert b"".join(whole) == data
    assert raws(split_all(by_byte(data))) == whole
    for cut in range(len(data) + 1):
        assert raws(split_all([data[:cut], data[cut:]])) == whole, cut
    return whole


# ---------------------------------------------------------------------------
# line endings


@pytest.mark.parametrize(
    "eol",
    [pytest.param(b"\n", id="LF"), pytest.param(b"\r\n", id="CRLF"), pytest.param(b"\r", id="CR")],
)
def test_line_endings(eol: bytes) -> None:
    data = (
        b"data: {\"a\":1}" + eol + eol
        + b"event: x" + eol + b"data: two" + eol + eol
        + b"data: [DONE]" + eol + eol
    )
    frames = check_all_chunkings(data)
    assert frames == [
        b"data: {\"a\":1}" + eol + eol,
        b"event: x" + eol + b"data: two" + eol + eol,
        b"data: [DONE]" + eol + eol,
    ]
    events = [parse_frame(raw) for raw in frames]
    assert events[0].json() == {"a": 1}
    assert (events[1].event, events[1].data) == ("x", "two")
    assert events[2].data == "[DONE]"


def test_gemini_crlf_frames() -> None:
    # Gemini alt=sse separates events with CRLF CRLF
    data = (
        b'data: {"error": {"code": 503, "message": "The model is overloaded. Please try again later.",'
        b' "status": "UNAVAILABLE"}}\r\n\r\n'
    )
    splitter = FrameSplitter()
    frames = splitter.feed(data)  # complete without waiting for EOF
    assert raws(frames) == [data]
    assert frames[0].event.json()["error"]["status"] == "UNAVAILABLE"
    assert splitter.finish() == []


def test_crlf_split_across_two_chunks() -> None:
    splitter = FrameSplitter()
    assert splitter.feed(b"data: a\r\n\r") == []  # the trailing CR may be half of a CRLF
    assert splitter.pending == len(b"data: a\r\n\r")
    frames = splitter.feed(b"\ndata: b\r\n\r\n")
    assert raws(frames) == [b"data: a\r\n\r\n", b"data: b\r\n\r\n"]
    assert splitter.finish() == []


def test_crlf_split_inside_the_field_line() -> None:
    splitter = FrameSplitter()
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\n") == []
    assert splitter.feed(b"\r") == []
    assert raws(splitter.feed(b"\n")) == [b"data: a\r\n\r\n"]
    assert splitter.finish() == []


def test_cr_then_next_chunk_starts_new_line() -> None:
    # a CR at a chunk end followed by a non-LF byte is a lone-CR line end
    splitter = FrameSplitter()
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\r") == []
    assert raws(splitter.feed(b"data: b")) == [b"data: a\r\r"]
    assert raws(splitter.finish()) == [b"data: b"]


def test_lone_cr_at_very_end_of_stream() -> None:
    data = b"data: a\r\rdata: b\r"
    assert check_all_chunkings(data) == [b"data: a\r\r", b"data: b\r"]
    splitter = FrameSplitter()
    assert splitter.feed(b"data: a\r\r") == []  # the last CR could still become CRLF
    tail = splitter.finish()
    assert raws(tail) == [b"data: a\r\r"]
    assert tail[0].event.data == "a"


def test_mixed_line_endings_in_one_stream() -> None:
    data = b"data: a\n\r\ndata: b\r\rdata: c\r\n\ndata: d\n\r"
    assert check_all_chunkings(data) == [
        b"data: a\n\r\n",
        b"data: b\r\r",
        b"data: c\r\n\n",
        b"data: d\n\r",
    ]


# ---------------------------------------------------------------------------
# fields and the parsed view


def test_comments_are_comment_only() -> None:
    # keep-alive comments seen in the wild
    data = b": OPENROUTER PROCESSING\n\n: keep-alive\n\n: ping\n\ndata: {}\n\n"
    frames = check_all_chunkings(data)
    assert frames[:3] == [b": OPENROUTER PROCESSING\n\n", b": keep-alive\n\n", b": ping\n\n"]
    for raw in frames[:3]:
        event = parse_frame(raw)
        assert event.comment_only
        assert event.data is None and event.event is None
    assert not parse_frame(frames[3]).comment_only


def test_comment_inside_an_event_is_ignored() -> None:
    event = parse_frame(b": hi\nevent: e\n: there\ndata: x\n\n")
    assert (event.event, event.data, event.comment_only) == ("e", "x", False)


@pytest.mark.parametrize(
    "raw",
    [b'data: {"k":"v"}\n\n', b'data:{"k":"v"}\n\n'],
    ids=["with-space", "no-space"],
)
def test_data_with_and_without_space(raw: bytes) -> None:
    event = parse_frame(raw)
    assert event.data == '{"k":"v"}'
    assert event.json() == {"k": "v"}


def test_only_one_leading_space_is_stripped() -> None:
    assert parse_frame(b"data:  two\n\n").data == " two"
    empty = parse_frame(b"data:\n\n")  # an empty data buffer dispatches nothing (WHATWG)
    assert empty.comment_only and empty.data is None
    assert parse_frame(b"\xef\xbb\xbfdata: first\n\n").data == "first"  # a leading BOM is ignored
    assert parse_frame(b"data\n\n").comment_only  # a field name alone: an empty value, so nothing


def test_multiline_data_joined_with_newline() -> None:
    raw = b'data: {"a":\ndata: 1,\ndata:"b": 2}\n\n'
    event = parse_frame(raw)
    assert event.data == '{"a":\n1,\n"b": 2}'
    assert event.json() == {"a": 1, "b": 2}
    assert parse_frame(b"data: x\r\ndata: y\r\n\r\n").data == "x\ny"
    assert parse_frame(b"data: x\rdata: y\r\r").data == "x\ny"


def test_event_lines() -> None:
    raw = (
        b"event: error\n"
        b'data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
    )
    event = parse_frame(raw)
    assert event.event == "error"
    assert event.json()["error"]["type"] == "overloaded_error"
    assert not event.bare_json and not event.comment_only
    assert parse_frame(b"event:ping\ndata: {}\n\n").event == "ping"


def test_id_and_retry_fields_are_fields_that_dispatch_nothing() -> None:
    event = parse_frame(b"id: 7\nretry: 100\n\n")
    assert not event.bare_json
    assert event.comment_only and event.data is None  # no data: nothing reaches a client


def test_leading_blank_lines_stay_with_the_next_frame() -> None:
    data = b"\n\r\n\rdata: a\n\n\n\ndata: b\n\n"
    frames = check_all_chunkings(data)
    assert frames == [b"\n\r\n\rdata: a\n\n", b"\n\ndata: b\n\n"]
    assert [parse_frame(raw).data for raw in frames] == ["a", "b"]


def test_trailing_blank_lines_are_kept_at_finish() -> None:
    frames = check_all_chunkings(b"data: a\n\n\n\n")
    assert frames == [b"data: a\n\n", b"\n\n"]
    assert parse_frame(frames[1]).comment_only


def test_anthropic_whitespace_padded_json() -> None:
    # Anthropic: padding before the closing brace varies
    data = (
        b"event: content_block_stop\n"
        b'data: {"type":"content_block_stop","index":0        }\n\n'
        b"event: message_stop\n"
        b'data: {"type":"message_stop"              }\n\n'
    )
    frames = check_all_chunkings(data)
    assert len(frames) == 2
    first, second = (parse_frame(raw) for raw in frames)
    assert first.event == "content_block_stop"
    assert first.json() == {"type": "content_block_stop", "index": 0}
    assert second.json() == {"type": "message_stop"}


def test_bare_multiline_json_error_without_data_prefix() -> None:
    # go-openai TestCreateChatCompletionStreamError: each
    # line written with "\n", no blank line, no data: prefix, on a 200 event-stream
    body = b"".join(
        line + b"\n"
        for line in [
            b"{",
            b'"error": {',
            b'"message": "Incorrect API key provided: sk-***************************************",',
            b'"type": "invalid_request_error",',
            b'"param": null,',
            b'"code": "invalid_api_key"',
            b"}",
            b"}",
        ]
    )
    splitter = FrameSplitter()
    assert splitter.feed(body) == []  # no blank line: nothing is complete yet
    frames = splitter.finish()
    assert raws(frames) == [body]
    event = frames[0].event
    assert event.bare_json
    assert not event.comment_only
    assert event.json() == {
        "error": {
            "message": "Incorrect API key provided: sk-***************************************",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert check_all_chunkings(body) == [body]


def test_bare_json_single_line_ollama() -> None:
    # Ollama: json.Encoder writes the object and one "\n"
    raw = b'{"error":{"message":"\xe2\x80\xa6","type":"api_error","param":null,"code":null}}\n'
    event = parse_frame(raw)
    assert event.bare_json
    assert event.json()["error"]["type"] == "api_error"


def test_bare_pretty_printed_json_crlf() -> None:
    raw = b'{\r\n  "error": {\r\n    "code": 503,\r\n    "status": "UNAVAILABLE"\r\n  }\r\n}\r\n'
    event = parse_frame(raw)
    assert event.bare_json
    assert event.json() == {"error": {"code": 503, "status": "UNAVAILABLE"}}


def test_non_json_text_is_not_bare_json() -> None:
    event = parse_frame(b"<html>502 Bad Gateway</html>\n")
    assert not event.bare_json
    assert event.json() is None


def test_unterminated_tail_flushed_by_finish() -> None:
    splitter = FrameSplitter()
    frames = splitter.feed(b'data: {"a":1}\n\ndata: {"b":')
    assert raws(frames) == [b'data: {"a":1}\n\n']
    assert splitter.pending == len(b'data: {"b":')
    tail = splitter.finish()
    assert raws(tail) == [b'data: {"b":']
    assert tail[0].event.data == '{"b":'
    assert tail[0].event.json() is None  # cut JSON is not an error, just not JSON
    assert splitter.finish() == []
    assert splitter.pending == 0


def test_unterminated_single_line_tail() -> None:
    splitter = FrameSplitter()
    assert splitter.feed(b"data: [DONE]\n") == []
    assert raws(splitter.finish()) == [b"data: [DONE]\n"]


def test_empty_input_and_empty_chunks() -> None:
    splitter = FrameSplitter()
    assert splitter.feed(b"") == []
    assert splitter.finish() == []
    assert raws(split_all([b"", b"data: a\n", b"", b"\n", b""])) == [b"data: a\n\n"]


def test_splitter_is_reusable_after_finish() -> None:
    splitter = FrameSplitter()
    splitter.feed(b"data: a\r")
    assert raws(splitter.finish()) == [b"data: a\r"]
    assert raws(splitter.feed(b"data: b\n\n")) == [b"data: b\n\n"]


def test_frame_event_is_parsed_lazily_and_cached() -> None:
    frame = Frame(b"data: {}\n\n")
    assert frame.event is frame.event
    assert frame == Frame(b"data: {}\n\n")
    assert hash(frame) == hash(Frame(b"data: {}\n\n"))
    assert frame != Frame(b"data: {}\r\n\r\n")


def test_invalid_utf8_and_nul_bytes_survive() -> None:
    data = b"data: \xff\xfe\x00abc\n\n: \xc3\n\ndata: ok\n\n"
    frames = check_all_chunkings(data)
    assert frames == [b"data: \xff\xfe\x00abc\n\n", b": \xc3\n\n", b"data: ok\n\n"]
    event = parse_frame(frames[0])
    assert event.data is not None and "\x00abc" in event.data
    assert event.json() is None


def test_json_of_absent_or_bad_data_is_none() -> None:
    assert SseEvent().json() is None
    assert parse_frame(b"data: not json\n\n").json() is None
    deep = b"data: " + b"[" * 100_000 + b"\n\n"
    assert parse_frame(deep).json() is None


# ---------------------------------------------------------------------------
# an independent model of the framing rules, for the property tests

_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def model_frames(data: bytes) -> list[bytes]:
    """WHATWG line splitting; a blank line ends a frame that has a non-blank line."""
    frames: list[bytes] = []
    current = b""
    has_text = False
    for match in _LINE.finditer(data):
        line = match.group(0)
        current += line
        if line.strip(b"\r\n"):
            has_text = True
        elif line.endswith((b"\n", b"\r")) and has_text:
            frames.append(current)
            current, has_text = b"", False
    if current:
        frames.append(current)
    return frames


_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    max_size=12,
).map(lambda s: s.encode("utf-8"))
_NOISE = st.binary(max_size=8).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_VALUE = st.one_of(
    _TEXT,
    _NOISE,
    st.sampled_from(
        [
            b"",
            b"[DONE]",
            b"{}",
            b'{"error":{"code":503,"message":"x"}}',
            b'{"type":"message_stop"      }',
            b"\xff\xfe",
            b"\xc3",
            b"\x00",
            "\u00e9\u6211\U0001f600".encode(),
        ]
    ),
)
_LINE_BODY = st.one_of(
    st.builds(lambda v: b"data: " + v, _VALUE),
    st.builds(lambda v: b"data:" + v, _VALUE),
    st.builds(lambda v: b"event: " + v, _VALUE),
    st.builds(lambda v: b":" + v, _VALUE),
    st.sampled_from([b"id: 1", b"retry: 100", b"data", b"{", b'"error": {', b"}", b""]),
    _VALUE,
)
_LINE_PIECE = st.tuples(_LINE_BODY, _EOL, st.integers(0, 3)).map(
    # most lines end; some run into the next piece (no line end)
    lambda t: t[0] + t[1] if t[2] or not t[0] else t[0]
)
# about one piece in three is a blank line, so streams hold many frames
_PIECE = st.one_of(_LINE_PIECE, _EOL, _LINE_PIECE)
STREAMS = st.lists(_PIECE, max_size=25).map(b"".join)


@st.composite
def stream_and_chunks(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    data = draw(STREAMS)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    chunks, last = [], 0
    for cut in cuts:
        chunks.append(data[last:cut])
        last = cut
    chunks.append(data[last:])
    return data, chunks


_PROPERTY = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_PROPERTY
@given(stream_and_chunks())
def test_any_chunking_gives_the_same_frames(case: tuple[bytes, list[bytes]]) -> None:
    data, chunks = case
    assert b"".join(chunks) == data
    whole = raws(split_all([data]))
    chunked = raws(split_all(chunks))
    assert chunked == whole
    assert b"".join(chunked) == data
    assert all(chunked)  # never an empty frame


@_PROPERTY
@given(STREAMS)
def test_splitter_matches_the_model(data: bytes) -> None:
    assert raws(split_all([data])) == model_frames(data)
    assert raws(split_all(by_byte(data))) == model_frames(data)


def _strip_one_eol(raw: bytes) -> bytes:
    for eol in (b"\r\n", b"\n", b"\r"):
        if raw.endswith(eol):
            return raw[: -len(eol)]
    raise AssertionError(f"no line end: {raw!r}")


@_PROPERTY
@given(stream_and_chunks())
def test_frames_from_feed_end_with_a_blank_line(case: tuple[bytes, list[bytes]]) -> None:
    _, chunks = case
    splitter = FrameSplitter()
    for chunk in chunks:
        for frame in splitter.feed(chunk):
            before_blank_line = _strip_one_eol(frame.raw)
            assert before_blank_line.endswith((b"\n", b"\r"))
            assert before_blank_line.strip(b"\r\n")  # and it has a non-blank line


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_any_chunking_lossless(data: bytes) -> None:
    whole = split_all([data])
    assert_lossless(data, whole)
    assert raws(split_all(by_byte(data))) == raws(whole)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_parse_never_raises_on_random_bytes(data: bytes) -> None:
    event = parse_frame(data)
    event.json()
    for frame in split_all([data]):
        parsed = frame.event
        parsed.json()
        assert isinstance(parsed.comment_only, bool)


@settings(max_examples=200, deadline=None)
@given(STREAMS)
def test_parse_never_raises_on_realistic_streams(data: bytes) -> None:
    for frame in split_all([data]):
        event = frame.event
        event.json()
        if event.bare_json:
            assert event.data is not None and event.data.startswith("{")
        if event.comment_only:
            assert event.data is None and event.event is None


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=4), _EOL)
def test_json_data_round_trips(obj: dict[str, str], eol: bytes) -> None:
    raw = b"data: " + json.dumps(obj).encode() + eol + eol
    frames = split_all([raw])
    assert raws(frames) == [raw]
    assert frames[0].event.json() == obj


def test_drain_hands_back_the_tail_and_resets() -> None:
    splitter = FrameSplitter()
    assert raws(splitter.feed(b"data: a\n\ndata: b\r")) == [b"data: a\n\n"]
    assert splitter.drain() == b"data: b\r"
    assert splitter.pending == 0
    assert splitter.drain() == b""
    # state is reset: a leading LF is not taken as the second half of the drained CR
    assert raws(splitter.feed(b"\ndata: c\n\n")) == [b"\ndata: c\n\n"]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_a_frame_of_megabytes_in_many_reads_is_one_frame_between_its_neighbours(eol: bytes) -> None:
    """A `response.completed` can repeat base64 images: megabytes in one frame, read
    16 KiB at a time (the splitter keeps such a frame without copying it per read)."""
    small = b"data: {}" + eol + eol
    big = b"event: response.completed" + eol + b'data: {"b64":"' + b"A" * (4 << 20) + b'"}' + eol + eol
    stream = small + big + small
    splitter = FrameSplitter()
    frames = [f for i in range(0, len(stream), 16384) for f in splitter.feed(stream[i:i + 16384])]
    frames += splitter.finish()
    assert [f.raw for f in frames] == [small, big, small]
    assert frames[1].event.event == "response.completed"
