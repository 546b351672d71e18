"""`StreamRedactor`: the values an upstream's `${VAR}`s hold, redacted however its
stream is cut into reads, and nothing else held or changed."""

from __future__ import annotations

from hypothesis import given, strategies as st

from switchyard_core.redaction import PARTIAL_SECRET_MIN, StreamRedactor, redact_bytes

SECRETS = (b"sk-live-0123456789", b"gsk_abcdefgh")


def fed(redactor: StreamRedactor, data: bytes, cuts: list[int]) -> tuple[list[bytes], bytes]:
    pieces, start = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        pieces.append(redactor.feed(data[start:cut]))
        start = cut
    return pieces, redactor.flush()


@given(st.lists(st.sampled_from([b"data: ", b"sk-live-0123456789", b"sk-live-", b"gsk_", b"gsk_abcdefgh", b"s",
                                 b"\n\n", b"[redacted]", b"0123"]), max_size=30),
       st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_however_the_stream_is_cut_the_client_gets_what_one_whole_read_would_give(
        words: list[bytes], cuts: list[int]) -> None:
    data = b"".join(words) + b"\n\n"  # a stream ends with its frame's end
    pieces, rest = fed(StreamRedactor(SECRETS), data, [c for c in cuts if c <= len(data)])
    assert b"".join(pieces) + rest == redact_bytes(data, SECRETS)
    assert rest == b""


def test_a_read_that_ends_with_no_start_of_a_value_is_passed_on_whole() -> None:
    redactor = StreamRedactor(SECRETS)
    assert redactor.feed(b'data: {"content":"hi"}\n\n') == b'data: {"content":"hi"}\n\n'


def test_a_tail_that_begins_a_value_waits_for_the_next_read_and_goes_if_it_is_the_value() -> None:
    redactor = StreamRedactor(SECRETS)
    assert redactor.feed(b"key sk-li") == b"key "
    assert redactor.feed(b"ve-0123456789 ok") == b"[redacted] ok"


def test_a_tail_that_began_no_value_after_all_is_passed_on_unchanged() -> None:
    redactor = StreamRedactor(SECRETS)
    assert redactor.feed(b"key sk-li") == b"key "
    assert redactor.feed(b"ght") == b"sk-light"


def test_at_the_end_a_held_start_of_a_value_is_redacted_and_a_short_one_kept() -> None:
    long_start, short_start = StreamRedactor(SECRETS), StreamRedactor(SECRETS)
    assert long_start.feed(b"cut at sk-live-01") == b"cut at "
    assert long_start.flush() == b"[redacted]"
    assert PARTIAL_SECRET_MIN > len(b"sk-")  # three bytes say nothing of a key
    assert short_start.feed(b"cut at sk-") == b"cut at "
    assert short_start.flush() == b"sk-"
