"""The staging gate, pure: what reaches the client, and when, for any chunking."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from switchyard_core.gate import Gate
from switchyard_core.apis import APIS, FrameKind
from tests.support import wire

LIMIT = 8 * 1024 * 1024


def gate(api: str = "openai-chat", limit: int = LIMIT, rewrite: bool = True) -> Gate:
    return Gate(APIS[api].stream_classifier(), staging_limit=limit, rewrite_capacity_codes=rewrite)


def run(g: Gate, chunks: list[bytes]) -> tuple[bytes, list]:
    """Feed chunks; returns what was emitted and the pre-output failures seen."""
    out, failures = b"", []
    for chunk in chunks:
        step = g.feed(chunk)
        out += step.emit
        if step.failure:
            failures.append(step.failure)
            return out, failures
    step = g.finish()
    out += step.emit
    if step.failure:
        failures.append(step.failure)
    return out, failures


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for point in points + [len(data)]:
        pieces.append(data[last:point])
        last = point
    return [p for p in pieces if p]


def test_lifecycle_is_held_until_output_then_flushed_in_order() -> None:
    g = gate()
    first = g.feed(wire.CHAT_ROLE)
    assert first.emit == b"" and not first.committed
    content = wire.chat_chunk({"content": "Hi"})
    step = g.feed(content)
    assert step.committed and step.emit == wire.CHAT_ROLE + content


def test_failure_before_output_emits_nothing_and_pass_through_returns_it_as_sent() -> None:
    g = gate()
    assert g.feed(wire.CHAT_ROLE).emit == b""
    error = wire.chat_error(503, "overloaded")
    step = g.feed(error + wire.CHAT_DONE + b"data: {\"partial")
    assert step.emit == b"" and step.failure is not None and step.failure.kind is FrameKind.FAILURE
    assert step.failure.error is not None and step.failure.error.status == 503
    assert g.held() == wire.CHAT_ROLE + error + wire.CHAT_DONE + b"data: {\"partial"
    assert g.pass_through() == wire.CHAT_ROLE + error + wire.CHAT_DONE + b"data: {\"partial"
    assert g.feed(b"rest").emit == b"rest"  # then everything passes through untouched


def test_all_frames_of_one_read_go_out_in_one_write() -> None:
    g = gate()
    frames = wire.chat_stream("one two three")
    step = g.feed(b"".join(frames))
    assert step.emit == b"".join(frames)


def test_incomplete_frame_after_output_waits_for_its_end() -> None:
    g = gate()
    g.feed(wire.CHAT_ROLE + wire.chat_chunk({"content": "a"}))
    tail = wire.chat_chunk({"content": "b"})
    assert g.feed(tail[:10]).emit == b""
    assert g.feed(tail[10:]).emit == tail


def test_capacity_codes_after_output_are_rewritten_only_when_asked() -> None:
    error = wire.chat_error("server_is_overloaded", "busy")
    for rewrite, expected in ((True, error.replace(b"server_is_overloaded", b"server_error")), (False, error)):
        g = gate(rewrite=rewrite)
        g.feed(wire.CHAT_ROLE + wire.chat_chunk({"content": "a"}))
        step = g.feed(error)
        assert step.emit == expected
        assert [f.error.code for f in step.failures_after_output] == ["server_is_overloaded"]


def test_eof_before_output_is_a_retryable_failure() -> None:
    g = gate()
    g.feed(wire.CHAT_ROLE)
    step = g.finish()
    assert step.failure is not None and step.failure.error is not None
    assert step.failure.error.event_type == "eof" and step.failure.error.retryable_hint


def test_output_only_in_an_unterminated_last_frame_is_no_output() -> None:
    """A client dispatches an event at its blank line: content in a last frame
    without one reaches nobody, so the attempt failed before output (and is retried)."""
    g = gate()
    tail = wire.chat_chunk({"content": "hi"}).removesuffix(b"\n\n")
    assert g.feed(wire.CHAT_ROLE + tail).emit == b""
    step = g.finish()
    assert not g.committed and not step.committed and step.emit == b""
    assert step.failure is not None and step.failure.error is not None
    assert step.failure.error.event_type == "eof"
    assert g.held() == wire.CHAT_ROLE + tail  # kept, to show the attempt as it was sent


def test_an_unterminated_last_frame_still_says_it_is_a_providers_error() -> None:
    g = gate()
    g.feed(wire.CHAT_ROLE + wire.chat_error(400, "bad request", type="invalid_request_error").removesuffix(b"\n\n"))
    step = g.finish()
    assert step.failure is not None and step.failure.error is not None
    assert step.failure.error.message == "bad request"


def test_staged_bytes_past_the_limit_commit() -> None:
    g = gate(limit=500)
    step = g.feed(wire.CHAT_ROLE * 3)
    assert step.committed and step.emit == wire.CHAT_ROLE * 3 and step.first_event == "staging_limit"


def test_an_endless_line_is_bounded_by_the_staging_limit() -> None:
    g = gate(limit=1000)
    out = b""
    for _ in range(50):
        out += g.feed(b"x" * 100).emit
        assert len(out) >= (_ + 1) * 100 - 1000  # never more than the limit held back
    assert g.committed
    out += g.finish().emit
    assert out == b"x" * 5000  # passed through, not held without bound


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6),
    fail_first=st.sampled_from([None, "sse", "role-then-sse", "done-only"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_any_chunking_gives_the_same_outcome(words: list[str], fail_first: str | None, cuts: list[int]) -> None:
    answer = b"".join(wire.chat_stream(" ".join(words)))
    prefix = {
        None: b"",
        "sse": wire.chat_error(503, "x"),
        "role-then-sse": wire.CHAT_ROLE + wire.chat_error(429, "x"),
        "done-only": wire.CHAT_DONE,
    }[fail_first]
    data = prefix + (answer if fail_first is None else b"")
    out, failures = run(gate(), chunked(data, cuts))
    if fail_first is None:
        assert out == answer and not failures  # byte-identical passthrough, whatever the chunking
    else:
        assert out == b"" and len(failures) == 1  # nothing of a failed attempt reaches the client


@settings(max_examples=300, deadline=None)
@given(
    api=st.sampled_from(sorted(APIS)),
    data=st.one_of(
        st.binary(max_size=2000),
        st.lists(st.sampled_from([b"data: ", b"event: error\n", b"{", b"}", b'"error"', b"[DONE]", b"\n", b"\r\n",
                                  b"\x00", b"\xff\xfe", b'{"choices":[{"delta":{"content":1}}]}', b'"type":"error"',
                                  b"[" * 50, b":", b"data:{\"error\":{\"code\":\"503\"}}\n\n"]), max_size=60).map(b"".join),
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
)
def test_any_bytes_from_an_upstream_never_raise_and_lose_nothing_once_committed(api: str, data: bytes, cuts: list[int]) -> None:
    g = Gate(APIS[api].stream_classifier(), staging_limit=LIMIT, rewrite_capacity_codes=False)
    out, failures = run(g, chunked(data, cuts))
    if not failures:
        assert out == data  # committed or passed through: byte for byte
    else:
        assert out == b""  # a failure before output: nothing of the attempt reached the client


def test_deeply_nested_json_and_giant_frames_never_raise() -> None:
    deep = b"data: " + b"[" * 200_000 + b"]" * 200_000 + b"\n\n"
    for api in sorted(APIS):
        g = gate(api)
        step = g.feed(deep)  # undecodable as JSON (too deep): unknown, so output
        assert step.committed and step.emit == deep
        g = gate(api, limit=1024)
        giant = b'data: {"type":"x","pad":"' + b"y" * 100_000 + b'"}\n\n'
        out, failures = run(g, [wire.CHAT_ROLE, giant])
        assert out == wire.CHAT_ROLE + giant and not failures


def test_a_cut_with_several_choices_is_not_mistaken_for_a_complete_stream() -> None:
    def chunk(index: int, delta: dict, finish: str | None = None) -> bytes:
        return wire.data({"id": "c", "object": "chat.completion.chunk",
                          "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})

    g = gate()
    g.feed(chunk(0, {"content": "a"}) + chunk(1, {"content": "b"}) + chunk(0, {}, "stop"))
    g.finish()
    assert not g.complete  # choice 1 never finished and no [DONE]: a cut
    g = gate()
    g.feed(chunk(0, {"content": "a"}) + chunk(1, {"content": "b"}) + chunk(0, {}, "stop") + chunk(1, {}, "stop"))
    assert g.complete


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.text(min_size=1, max_size=8), min_size=2, max_size=8),
    errors_at=st.lists(st.integers(min_value=1, max_value=7), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
@example(words=[" ", "0"], errors_at=[1], cuts=[])  # the first content frame is empty: not output yet
def test_after_output_whole_reads_and_frame_by_frame_reads_see_the_same_stream(
        words: list[str], errors_at: list[int], cuts: list[int]) -> None:
    """After commit, a read of whole plain-content frames passes unsplit (the hot
    path); it must notice every failure and the end exactly as frame-by-frame does."""
    frames = wire.chat_stream(" ".join(words))  # role, words..., finish, usage, [DONE]
    first_output = next(i for i, f in enumerate(frames) if b'"content":"' in f and b'"content":""' not in f)
    for index in sorted(set(errors_at), reverse=True):  # failures after output, never before
        frames.insert(min(first_output + index, len(frames) - 1), wire.chat_error("server_is_overloaded", "later"))
    data = b"".join(frames)
    results = []
    for chunks in (chunked(data, cuts), [data], frames):
        g = gate(rewrite=False)
        out, suppressed = b"", 0
        for chunk in chunks:
            step = g.feed(chunk)
            assert step.failure is None
            out += step.emit
            suppressed += len(step.failures_after_output)
        out += g.finish().emit
        results.append((out, suppressed, g.complete))
    expected_errors = sum(1 for f in frames if f.startswith(b"data: {\"error\"") or b'"error":{' in f)
    assert results[0] == results[1] == results[2] == (data, expected_errors, True)


def test_an_end_marker_too_big_to_hold_still_ends_the_stream() -> None:
    """The Responses API's `response.completed` repeats the whole response (base64
    images included): past the staging limit after output it goes on in pieces,
    byte for byte, and is still recognised as the end (else a complete answer
    would get an in-band `stream_cut`)."""
    limit = 64 * 1024
    g = gate("openai-responses", limit=limit)
    start = wire.event("response.output_text.delta", {"type": "response.output_text.delta", "delta": "hi"})
    image = "A" * (3 * limit)
    completed = wire.event("response.completed", {"type": "response.completed", "response": {
        "status": "completed", "output": [{"type": "image_generation_call", "result": image}]}})
    out, failures = run(g, [start, *(completed[i:i + 16 * 1024] for i in range(0, len(completed), 16 * 1024))])
    assert out == start + completed and not failures
    assert g.complete


def test_a_failure_too_big_to_hold_after_output_is_still_reported() -> None:
    limit = 64 * 1024
    g = gate("openai-responses", limit=limit)
    start = wire.event("response.output_text.delta", {"type": "response.output_text.delta", "delta": "hi"})
    failed = wire.event("response.failed", {"type": "response.failed", "response": {
        "status": "failed", "error": {"code": "server_error", "message": "x" * (2 * limit)}}})
    assert g.feed(start).committed
    reported = [f for i in range(0, len(failed), 16 * 1024) for f in g.feed(failed[i:i + 16 * 1024]).failures_after_output]
    assert [f.event_type for f in reported] == ["response.failed"]
    assert g.complete  # a failed response is the stream's end too


_KEYS = ["choices", "delta", "finish_reason", "index", "content", "error", "code", "message", "type", "status",
         "response", "output", "item", "part", "usage", "role", "tool_calls", "text", "name", "arguments",
         "content_block", "stop_reason", "refusal", "reasoning_content", "metadata", "param"]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.sampled_from(
        ["", "stop", "error", "insufficient_system_resource", "overloaded_error", "response.completed",
         "response.failed", "error", "message_stop", "server_error", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=5),
    max_leaves=25,
)
# the providers' shapes (reference), with any JSON where a field's value goes
_SHAPED = st.one_of(
    st.fixed_dictionaries({"choices": st.lists(st.fixed_dictionaries(
        {}, optional={"index": _JSON, "delta": _JSON, "finish_reason": _JSON, "message": _JSON}), max_size=2)},
        optional={"error": _JSON, "usage": _JSON}),
    st.fixed_dictionaries({"type": _JSON}, optional={"response": st.fixed_dictionaries(
        {}, optional={"status": _JSON, "error": _JSON, "output": _JSON}), "delta": _JSON, "item": _JSON,
        "part": _JSON, "error": _JSON, "code": _JSON, "message": _JSON}),
    st.fixed_dictionaries({"type": _JSON}, optional={"delta": _JSON, "content_block": _JSON, "error": _JSON,
                                                     "message": _JSON}),
    _JSON,
)
_NAMES = st.sampled_from([None, "error", "response.completed", "response.failed", "response.output_text.delta",
                          "message_start", "content_block_delta", "message_stop", "ping"])


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(sorted(APIS)), frames=st.lists(st.tuples(_NAMES, _SHAPED), min_size=1, max_size=6))
def test_any_json_in_any_frame_never_raises(api: str, frames: list[tuple[str | None, object]]) -> None:
    """Whatever JSON an upstream puts in a frame, and under whatever event name,
    the gate classifies it (an object where a string belongs is not an error of ours)."""
    import json

    g = gate(api)
    stream = b"".join((f"event: {name}\n".encode() if name else b"") + b"data: " + json.dumps(obj).encode() + b"\n\n"
                      for name, obj in frames)
    run(g, [stream])
    g2 = gate(api)
    out, failures = run(g2, [wire.event("x", {}) if api != "openai-chat" else b": ping\n\n", stream])
    assert failures or out  # something was decided: emitted, or a failure before output
    for _, obj in frames:
        APIS[api].body_error(obj)
