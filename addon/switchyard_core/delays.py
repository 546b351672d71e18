"""A delay an upstream states, read so that nothing it sends can cost the request.

`Retry-After`, `retry-after-ms`, Gemini's `RetryInfo.retryDelay` and a message's
"Please retry in 38.9s." are the upstream's words: huge, negative, NaN or not
a number at all.  Every reader turns them into a finite, non-negative number
of seconds, at most MAX_STATED_DELAY_S, or None (ignored: as if none was
stated, so the route's own backoff applies; a negative delay too); none raises.  A delay longer than `max_backoff_ms` already moves on to
the next upstream instead of waiting (retry.py), so the cap only keeps the
arithmetic finite.  Pure: no imports from the package, so every reader can use it.
"""

from __future__ import annotations

import math
import re

MAX_STATED_DELAY_S = 24 * 60 * 60.0  # a day: longer says only "not now"
_NUMBER = re.compile(r"\s*\+?([0-9]+(?:\.[0-9]*)?)\s*", re.ASCII)


def stated_delay_s(seconds: object) -> float | None:
    """`seconds` as a delay: a number of at most MAX_STATED_DELAY_S (one larger, an
    integer of any size or an infinity, is cut to it); anything else (negative, NaN,
    a bool, a string, None) is None."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    if isinstance(seconds, float) and math.isnan(seconds) or seconds < 0:
        return None
    if seconds >= MAX_STATED_DELAY_S:  # compared as it is: float() of a 400-digit integer overflows
        return MAX_STATED_DELAY_S
    return float(seconds)


def delay_in_text(text: object, scale: float = 1.0) -> float | None:
    """A delay written as a plain decimal number (`"38"`, `"34.5"`, `" 900 "`), times
    `scale` (0.001 for milliseconds); anything else is None.  A sign, an exponent,
    `inf`, `nan`, `1_000` or a digit of another script are no delay an upstream
    means: none is read."""
    if not isinstance(text, str):
        return None
    found = _NUMBER.fullmatch(text)
    if found is None:
        return None
    return stated_delay_s(float(found.group(1)) * scale)


def duration_seconds(seconds: object, nanos: object = 0) -> float | None:
    """A protobuf Duration decoded as JSON (`{"seconds": 38, "nanos": 5e8}`; seconds as
    an int64 string, as proto3 JSON writes it): read as `stated_delay_s`, None if either
    part is no number."""
    whole = delay_in_text(seconds) if isinstance(seconds, str) else stated_delay_s(seconds)
    part = _nanos(nanos)
    if whole is None or part is None:
        return None
    return stated_delay_s(whole + part)


def _nanos(value: object) -> float | None:
    """A Duration's `nanos` in seconds, within one second either way."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return max(-10 ** 9, min(10 ** 9, value)) / 1e9
