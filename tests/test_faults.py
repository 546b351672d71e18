"""Fault injection, pure: which fault fires, and what a faulty answer reads like."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.faults import FaultPlan, error_frame
from switchyard_core.apis import APIS, Decision, ErrorPolicy, FrameKind
from switchyard_core.upstreams.body import Body
from switchyard_core.attempts.faulty_answer import FaultyAnswer
from switchyard_core.attempts.faulty_messages import FaultStep, FaultyMessages
from switchyard_core.rules.schema import FaultSpec
from switchyard_core.sse import FrameSplitter, SseEvent
from switchyard_core.ws_items import Closed
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


def test_a_retired_plan_never_fires() -> None:
    plan = FaultPlan((spec(kind="reset"),))
    plan.retire()
    assert plan.pick("r", "a") is None and plan.fired == [0]


def test_a_reload_retires_only_the_faults_that_left_the_file() -> None:
    kept, gone = spec(kind="reset", count=2), spec(kind="stall")
    plan = FaultPlan((gone, kept))
    plan.retire((spec(kind="reset", count=2), spec(kind="sse_error")))
    assert [plan.pick("r", "a") for _ in range(3)] == [kept, kept, None]  # its own count goes on
    plan.retire(())
    assert plan.pick("r", "a") is None and plan.fired == [0, 2]


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


# --- WebSocket turns: FaultyMessages --------------------------------------------------

def _messages(kind: str, real: list[bytes | Closed], **fields: object) -> tuple[list[bytes | Closed], str | None]:
    """Feed `real` through a fault; what the turn reads, and what became of the real socket."""
    faulty = FaultyMessages(spec(kind=kind, **fields), "openai-responses")
    out: list[bytes | Closed] = []
    cut: str | None = None
    for item in real:
        step = faulty.feed(item)
        out += step.items
        cut = cut or step.cut
    return out, cut


def _turn(text: str = "one two") -> list[bytes | Closed]:
    from tests.support.ws_provider import answer_turn
    return [message.encode() for message in answer_turn("resp_1", text)]


def test_ws_sse_error_passes_after_frames_real_messages_then_the_sse_frames_data() -> None:
    real = _turn()
    out, cut = _messages("sse_error", real, status=429, after_frames=2, message="slow down")
    assert out[:2] == real[:2] and len(out) == 3 and cut == "close"
    assert json.loads(out[2]) == {"type": "error", "sequence_number": 0, "error": {
        "type": "invalid_request_error", "code": "rate_limit_exceeded", "message": "slow down", "param": None}}
    # the same JSON an HTTP stream's fault frame carries
    frame = FrameSplitter().feed(error_frame("openai-responses", "sse_error", 429, "slow down"))[0]
    assert json.loads(out[2]) == json.loads(frame.event.data or "")


def test_ws_http_error_replaces_the_answer_with_a_status_error_the_classifier_reads() -> None:
    out, cut = _messages("http_error", _turn(), status=401, after_frames=3)
    assert cut == "close" and len(out) == 1
    assert json.loads(out[0]) == {"type": "error", "status": 401, "error": {
        "message": "provider overloaded (switchyard fault)", "type": "invalid_request_error", "param": None,
        "code": "invalid_request_error"}}
    seen = APIS["openai-responses"].stream_classifier().classify(SseEvent(data=out[0].decode()))
    assert seen.kind is FrameKind.FAILURE and seen.error is not None and seen.error.status == 401
    assert ErrorPolicy().decide(seen.error) is Decision.FATAL  # a 401 is not retried, as over HTTP


def test_ws_reset_is_a_broken_connection_and_stall_is_silence() -> None:
    real = _turn()
    assert _messages("reset", real, after_frames=1) == ([real[0], Closed(1006, "connection reset (switchyard fault)")],
                                                        "abort")
    assert _messages("stall", real, after_frames=2) == (real[:2], "close")


def test_ws_answer_shorter_than_after_frames_gets_the_fault_in_place_of_its_end() -> None:
    real = _turn()
    out, _ = _messages("response_failed", real, after_frames=50)
    assert out[:-1] == real[:-1]  # everything but response.completed
    assert json.loads(out[-1])["type"] == "response.failed"
    closed = Closed(1000, "bye")
    out, _ = _messages("overload_message", [real[0], closed], after_frames=5)
    assert out[0] == real[0] and out[2] == closed  # the failure, then the real close
    assert json.loads(out[1])["message"] == "Our servers are currently overloaded. Please try again later."


def test_ws_nothing_of_the_real_answer_is_read_after_the_fault_point() -> None:
    faulty = FaultyMessages(spec(kind="sse_error"), "openai-responses")
    first = faulty.feed(b'{"type":"response.created"}')
    assert len(first.items) == 1 and first.items[0] != b'{"type":"response.created"}'
    assert faulty.feed(b'{"type":"response.output_text.delta","delta":"x"}') == FaultStep()
