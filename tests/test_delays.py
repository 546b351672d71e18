"""Any delay an upstream states is clamped or ignored, never an exception.

`Retry-After`, `retry-after-ms`, Gemini's `RetryInfo.retryDelay` and a
message's "Please retry in N s" are read from whatever an upstream sends
(huge, negative, NaN, a string, another script's digits): each reader gives a
finite delay in [0, MAX_STATED_DELAY_S] or None, and an error in any API's
shape, whatever its fields hold, is classified without raising.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard_core.apis import APIS, Decision
from switchyard_core.apis.errors import error_info, http_error_info
from switchyard_core.apis.google_rpc import duration_s, retry_delay_s
from switchyard_core.delays import MAX_STATED_DELAY_S, delay_in_text, duration_seconds, stated_delay_s
from switchyard_core.retry import plan_after_failure, retry_after_s
from switchyard_core.sse import SseEvent

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

numbers = st.one_of(
    st.integers(), st.integers(min_value=10 ** 300, max_value=10 ** 400), st.integers(max_value=-10 ** 300),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
)
texts = st.one_of(
    st.text(), st.from_regex(r"\s*[+-]?[0-9]{0,500}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,4})?\s*", fullmatch=True),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "1_000", "١٢", "²", "0x10", "", " ", "-5", "+5",
                     "Wed, 21 Oct 2015 07:28:00 GMT", "Mon, 01 Jan 99999 00:00:00 GMT", "Mon, 01 Jan 1 00:00:00 +9999",
                     "Fri, 31 Dec 9999 23:59:59 -2359", "Thu, 01 Jan 1970 00:00:00 GMT"]),
)
json_values = st.recursive(
    st.one_of(numbers, texts), lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.one_of(st.sampled_from(["seconds", "nanos", "@type", "retryDelay", "code", "status", "message",
                                   "details", "error", "type"]), st.text(max_size=5)), inner, max_size=5),
    max_leaves=12)


def a_delay(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isfinite(value) and 0 <= value <= MAX_STATED_DELAY_S)


@given(numbers)
def test_any_number_is_a_delay_in_range_or_none(value: Any) -> None:
    assert a_delay(stated_delay_s(value))


@given(texts, st.sampled_from([1.0, 0.001]))
def test_any_text_is_a_delay_in_range_or_none(text: str, scale: float) -> None:
    assert a_delay(delay_in_text(text, scale))


@given(st.one_of(numbers, texts), st.one_of(numbers, texts))
def test_any_duration_is_a_delay_in_range_or_none(seconds: Any, nanos: Any) -> None:
    assert a_delay(duration_seconds(seconds, nanos))
    assert a_delay(duration_s({"seconds": seconds, "nanos": nanos}))


@given(st.dictionaries(st.sampled_from(["retry-after", "retry-after-ms"]), texts))
def test_any_retry_after_header_is_a_delay_in_range_or_none(headers: dict[str, str]) -> None:
    assert a_delay(retry_after_s(headers))


@given(json_values, st.one_of(texts, st.from_regex(r"Please retry in [0-9]{1,500}(\.[0-9]{1,9})?(ms|s)\.")))
def test_any_retry_info_or_message_is_a_delay_in_range_or_none(delay: Any, message: str) -> None:
    assert a_delay(retry_delay_s([{"@type": RETRY_INFO, "retryDelay": delay}], message))
    assert a_delay(retry_delay_s(delay, message))


@given(json_values)
@settings(max_examples=300)
def test_an_error_in_any_shape_is_read_without_raising(error: Any) -> None:
    """What the 429 that held a 400-digit `retryDelay.seconds` raised (OverflowError), and
    a status code of "²" (ValueError), in every API's stream and HTTP error bodies."""
    for body in ({"error": error}, error):
        info = error_info(body)
        assert info is None or a_delay(info.retry_after_s)
        assert a_delay(http_error_info(429, json.dumps(body).encode()).retry_after_s)
        for api in APIS.values():
            api.stream_classifier(False).classify(SseEvent(data=json.dumps(body)))


def test_the_reported_429_is_a_delay_longer_than_any_backoff_so_the_next_upstream_is_asked() -> None:
    body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota",
                      "details": [{"@type": RETRY_INFO, "retryDelay": {"seconds": int("9" * 400)}}]}}
    info = http_error_info(429, json.dumps(body).encode())
    assert info.retry_after_s == MAX_STATED_DELAY_S
    plan = plan_after_failure(Decision.RETRY, tries_used=1, budget=3, has_next=True, timed_out=False,
                              retry_after=info.retry_after_s, backoff_ms=250, max_backoff_ms=4000)
    assert plan.action == "next_upstream"


@given(st.floats(allow_nan=True, allow_infinity=True) | st.none())
def test_a_plan_never_waits_a_delay_that_is_no_number(retry_after: float | None) -> None:
    plan = plan_after_failure(Decision.RETRY, tries_used=1, budget=3, has_next=True, timed_out=False,
                              retry_after=retry_after, backoff_ms=250, max_backoff_ms=4000)
    assert math.isfinite(plan.delay_s) and 0 <= plan.delay_s <= 4.0


def test_a_delay_written_as_a_number_is_read_as_the_sdks_read_it() -> None:
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_s({"retry-after": " 3 "}) == 3.0
    assert retry_after_s({"retry-after": "-3"}) is None  # no delay: the route's own backoff
    assert retry_after_s({"retry-after": "nan"}) is None
    assert retry_after_s({"retry-after": "Thu, 01 Jan 1970 00:00:00 GMT"}) == 0.0  # in the past: now
    assert duration_s("34.5s") == 34.5 and duration_s("900ms") == 0.9
    assert duration_s({"seconds": "38", "nanos": 500_000_000}) == 38.5
    assert retry_delay_s(None, "Quota exceeded. Please retry in 25.5s.") == 25.5
