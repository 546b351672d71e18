"""How the Router reads a request body's JSON to route it (addons/request_body.py):
only the top-level fields routing needs, and always what Python's own `json` reads."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings, strategies as st

from switchyard_core.addons.request_body import ROUTING_FIELDS, top_level


def as_routing_reads(value: Any) -> Any:
    """What `top_level` must return: Python's reading, an object cut to the routing fields."""
    if isinstance(value, dict):
        return {name: value[name] for name in ROUTING_FIELDS if name in value}
    return value


def same(a: Any, b: Any) -> bool:
    """Equal as JSON texts: NaN equals NaN (the one JSON value not equal to itself)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


keys = st.one_of(st.sampled_from(ROUTING_FIELDS + ("messages", "tools")), st.text(max_size=8))
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=5)), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(value=values, ascii=st.booleans())
def test_every_json_body_is_read_as_pythons_json_reads_it(value: Any, ascii: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii).encode("utf-8", "surrogatepass")
    try:
        expected = as_routing_reads(json.loads(raw))
    except ValueError:  # (a lone surrogate, written raw: not UTF-8)
        expected = None
    try:
        got = top_level(raw)
    except ValueError:
        got = None
    assert same(got, expected)


@settings(max_examples=400, deadline=None)
@given(raw=st.one_of(st.binary(max_size=40), st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_any_bytes_fail_or_succeed_as_with_pythons_json(raw: bytes) -> None:
    try:
        expected: Any = ("ok", as_routing_reads(json.loads(raw)))
    except (ValueError, RecursionError):
        expected = "fails"
    try:
        got: Any = ("ok", top_level(raw))
    except (ValueError, RecursionError):
        got = "fails"
    assert same(got, expected)


def test_the_last_of_a_repeated_field_counts_as_in_python() -> None:
    assert top_level(b'{"stream": true, "model": "a", "stream": false}') == {"stream": False, "model": "a"}


def test_a_conversation_is_read_for_its_routing_fields_only() -> None:
    body = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi " * 1000}] * 50}
    assert top_level(json.dumps(body).encode()) == {"model": "gpt-4o", "stream": True,
                                                     "stream_options": {"include_usage": True}}
    assert top_level(b'{"model": NaN, "stream": true}')["stream"] is True  # Python's JSON reads NaN
    assert math.isnan(top_level(b'{"model": NaN}')["model"])
    assert top_level('{"model": "m\\ud800"}'.encode()) == {"model": "m\ud800"}  # an escaped lone surrogate
    assert top_level(b"[1, 2]") == [1, 2]
