"""`StreamRedactor`: the values an upstream's `${VAR}`s hold, redacted however its
stream is cut into reads, and nothing else held or changed."""

from __future__ import annotations

from hypothesis import given, strategies as st

from switchyard_core.redaction import (
    CLOSE_REASON_LIMIT,
    PARTIAL_SECRET_MIN,
    StreamRedactor,
    redact_bytes,
    redact_headers,
    redact_text,
)

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


# values that overlap, or one of which begins another: two keys of one account
# ("org-…" and "org-…-key"), a key and the header value it was cut from
PREFIXED = (b"org-ab12cd34", b"org-ab12cd34-sk9876543")
OVERLAPPING = (b"abcdefgh12345678", b"12345678ABCDEFGH")


def test_a_value_that_begins_another_is_held_and_the_longer_one_goes_whole() -> None:
    redactor = StreamRedactor(PREFIXED)
    out = redactor.feed(b"key org-ab12cd34") + redactor.feed(b"-sk9876543 ok\n\n") + redactor.flush()
    assert out == b"key [redacted] ok\n\n"
    assert redact_bytes(b"key org-ab12cd34-sk9876543 ok", PREFIXED) == b"key [redacted] ok"


def test_the_shorter_value_at_the_end_of_a_read_goes_when_no_longer_one_follows() -> None:
    redactor = StreamRedactor(PREFIXED)
    assert redactor.feed(b"key org-ab12cd34") == b"key "
    assert redactor.feed(b" and more") == b"[redacted] and more"
    redactor = StreamRedactor(PREFIXED)
    assert redactor.feed(b"key org-ab12cd34") == b"key "
    assert redactor.flush() == b"[redacted]"


def test_values_that_overlap_leave_no_byte_of_either() -> None:
    data = b"x abcdefgh12345678ABCDEFGH y"
    assert redact_bytes(data, OVERLAPPING) == b"x [redacted] y"
    assert redact_bytes(data, OVERLAPPING[::-1]) == b"x [redacted] y"
    for cut in range(len(data) + 1):
        redactor = StreamRedactor(OVERLAPPING)
        assert redactor.feed(data[:cut]) + redactor.feed(data[cut:]) + redactor.flush() == b"x [redacted] y", cut


@given(st.lists(st.sampled_from([b"data: ", b"org-ab12cd34", b"-sk9876543", b"org-", b"abcdefgh", b"12345678",
                                 b"ABCDEFGH", b"\n\n", b"x"]), max_size=30),
       st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_overlapping_and_prefixed_values_however_the_stream_is_cut(words: list[bytes], cuts: list[int]) -> None:
    secrets = (*PREFIXED, *OVERLAPPING)
    data = b"".join(words) + b"\n\n"
    pieces, rest = fed(StreamRedactor(secrets), data, [c for c in cuts if c <= len(data)])
    assert b"".join(pieces) + rest == redact_bytes(data, secrets)
    for secret in secrets:
        assert secret not in b"".join(pieces) + rest


def test_a_run_of_one_repeated_value_is_not_held_without_bound() -> None:
    redactor = StreamRedactor((b"aaaaaaaa",))
    passed = sum(len(redactor.feed(b"a" * 1000)) for _ in range(100))
    assert passed > 0 and len(redactor.flush()) <= len(b"[redacted]")


# --- what an upstream sends whole: a header value, a close reason ---------------------------


def test_a_close_reason_cut_inside_a_value_by_its_sender_loses_the_start_of_the_value_too() -> None:
    reason = "bad key sk-live-0123456789 and sk-live-01"  # the sender cut it inside a second one
    assert redact_text(reason, SECRETS, limit=CLOSE_REASON_LIMIT) == "bad key [redacted] and [redacted]"


def test_a_close_reason_that_grows_past_its_limit_is_cut_on_a_characters_edge() -> None:
    secrets = (b"k1-abcde",)  # 8 bytes, each becomes 10
    reason = "k1-abcde" * 2 + "é" * 53 + "x"  # 123 bytes: the most a close frame carries
    out = redact_text(reason, secrets, limit=CLOSE_REASON_LIMIT)
    assert out == "[redacted][redacted]" + "é" * 51 and len(out.encode()) == 122


def test_a_header_value_is_redacted_whole_and_nothing_else_changes() -> None:
    headers = [("WWW-Authenticate", 'Bearer token="sk-live-0123456789"'), ("X-Tail", "ends with sk-l")]
    assert redact_headers(headers, SECRETS) == [("WWW-Authenticate", 'Bearer token="[redacted]"'),
                                                ("X-Tail", "ends with sk-l")]
    assert redact_headers(headers, ()) == headers
