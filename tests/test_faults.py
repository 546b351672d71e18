"""Fault injection, pure: which fault fires, and what a faulty answer reads like."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.faults import FaultPlan
from switchyard_core.apis import APIS, Decision, ErrorPolicy, FrameKind
from switchyard_core.upstreams.body import Body
from switchyard_core.attempts.faulty_answer import FaultyAnswer
from switchyard_core.rules.schema import FaultSpec
from switchyard_core.sse import FrameSplitter
from tests.support import wire


class Recorded:
    """A real answer's bytes, arriving chunk by chunk once the loop runs."""

    def __init__(self, chunks: list[bytes], content_type: str = "text/event-stream", status: int = 200) -> None:
        self.status = status
        self.headers: Mapping[str, str] = CIMultiDictProxy(CIMultiDict({"Content-Type": content_type}))
        self.body = Body()
        self.closed = False
        loop = asyncio.get_running_loop()
        for chunk in chunks:
            loop.call_soon(self.body.feed, chunk)
        loop.call_soon(self.body.end)

    def close(self) -> None:
        self.closed = True


def read(make: Callable[[], FaultyAnswer], wait_s: float = 5.0) -> tuple[FaultyAnswer, bytes, BaseException | None]:
    """Build the faulty answer inside an event loop and read it to its end (or `wait_s`)."""
    async def go() -> tuple[FaultyAnswer, bytes, BaseException | None]:
        answer = make()
        out = b""
        try:
            async with asyncio.timeout(wait_s):
                while True:
                    chunk, error = await answer.body.read_some()
                    out += chunk
                    if error is not None or not chunk:
                        return answer, out, error
        except TimeoutError:
            return answer, out, TimeoutError()
    return asyncio.run(go())


def spec(**fields: object) -> FaultSpec:
    return FaultSpec.model_validate({"route": "r", **fields})


def test_plan_honours_route_upstream_rate_and_count() -> None:
    rolls = iter([0.9, 0.1])
    plan = FaultPlan((spec(upstream="a", kind="reset", count=1), spec(kind="stall", rate=0.5)), rng=lambda: next(rolls))
    assert plan.pick("other", "a") is None
    assert plan.pick("r", "a").kind == "reset"  # type: ignore[union-attr]
    assert plan.pick("r", "a") is None  # count reached; the 50% stall rolls 0.9: no
    assert plan.pick("r", "b").kind == "stall"  # type: ignore[union-attr]  # rolls 0.1


def test_sse_error_after_frames_truncates_the_real_stream() -> None:
    real = wire.chat_stream("one two three")
    answer, body, error = read(lambda: FaultyAnswer(Recorded([b"".join(real)]), spec(kind="sse_error", status=429, after_frames=2), "openai-chat"))
    assert error is None
    assert body.startswith(real[0] + real[1])
    frames = FrameSplitter().feed(body)
    result = [APIS["openai-chat"].stream_classifier().classify(f.event) for f in frames][-1]
    assert result.kind is FrameKind.FAILURE and result.error is not None and result.error.status == 429
    assert b"three" not in body


def test_http_error_replaces_the_answer_with_a_json_error_and_a_real_content_type() -> None:
    answer, body, _ = read(lambda: FaultyAnswer(Recorded(wire.chat_stream("hi")), spec(kind="http_error", status=529), "anthropic-messages"))
    assert answer.status == 529
    assert answer.headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"type": "error", "error": {"type": "overloaded_error", "message": "provider overloaded (switchyard fault)"}}


def test_stream_faults_on_a_non_streaming_answer_become_an_error_body() -> None:
    real = json.dumps(wire.chat_completion("hi")).encode()
    answer, body, _ = read(lambda: FaultyAnswer(Recorded([real], content_type="application/json"), spec(kind="sse_error", status=503), "openai-chat"))
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/json"
    info = APIS["openai-chat"].body_error(json.loads(body))
    assert info is not None and ErrorPolicy().decide(info) is Decision.RETRY


def test_overload_message_carries_no_code_and_is_still_retryable() -> None:
    for api in ("openai-chat", "openai-responses", "anthropic-messages"):
        _, body, _ = read(lambda: FaultyAnswer(Recorded([]), spec(kind="overload_message"), api))
        frame = FrameSplitter().feed(body)[0]
        result = APIS[api].stream_classifier().classify(frame.event)
        assert result.kind is FrameKind.FAILURE and result.error is not None, api
        assert result.error.code is None and ErrorPolicy().decide(result.error) is Decision.RETRY, api


def test_reset_reports_a_connection_error_after_the_real_frames() -> None:
    real = wire.chat_stream("one two")
    _, body, error = read(lambda: FaultyAnswer(Recorded(real), spec(kind="reset", after_frames=1), "openai-chat"))
    assert body == real[0] and isinstance(error, ConnectionResetError)


def test_frames_arriving_one_by_one_are_cut_at_the_fault_point() -> None:
    real = wire.chat_stream("one two three four")
    _, body, error = read(lambda: FaultyAnswer(Recorded(real), spec(kind="sse_error", after_frames=3), "openai-chat"))
    assert error is None and body.startswith(b"".join(real[:3])) and real[3] not in body
    assert body.count(b"\n\n") == 4  # three real frames and the error frame


def test_stall_sends_the_frames_before_it_and_then_never_ends() -> None:
    real = wire.chat_stream("one two")
    _, body, error = read(lambda: FaultyAnswer(Recorded(real), spec(kind="stall", after_frames=2), "openai-chat"),
                          wait_s=0.3)
    assert body == b"".join(real[:2]) and isinstance(error, TimeoutError)


def test_a_real_answer_that_ends_before_the_fault_point_still_gets_the_fault() -> None:
    real = wire.chat_stream("hi")
    _, body, error = read(lambda: FaultyAnswer(Recorded(real), spec(kind="reset", after_frames=50), "openai-chat"))
    assert body == b"".join(real) and isinstance(error, ConnectionResetError)
