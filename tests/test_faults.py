"""Fault injection, pure: which fault fires, and what a faulty answer reads like."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from switchyard_core.faults import FaultPlan, FaultyAnswer
from switchyard_core.protocols import APIS, Decision, ErrorPolicy, FrameKind
from switchyard_core.rules.schema import FaultSpec
from switchyard_core.sse import FrameSplitter
from tests.support import wire


class Recorded:
    """A real answer's bytes, replayed chunk by chunk."""

    def __init__(self, chunks: list[bytes], content_type: str = "text/event-stream", status: int = 200) -> None:
        self.status = status
        self.headers: Mapping[str, str] = CIMultiDictProxy(CIMultiDict({"Content-Type": content_type}))
        self._chunks = list(chunks)
        self.closed = False

    async def read_some(self) -> tuple[bytes, BaseException | None]:
        return (self._chunks.pop(0) if self._chunks else b""), None

    def close(self) -> None:
        self.closed = True


def read(answer: FaultyAnswer) -> tuple[bytes, BaseException | None]:
    async def go() -> tuple[bytes, BaseException | None]:
        out = b""
        while True:
            chunk, error = await answer.read_some()
            out += chunk
            if error is not None or not chunk:
                return out, error
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
    answer = FaultyAnswer(Recorded([b"".join(real)]), spec(kind="sse_error", status=429, after_frames=2), "openai-chat")
    body, error = read(answer)
    assert error is None
    assert body.startswith(real[0] + real[1])
    frames = FrameSplitter().feed(body)
    result = [APIS["openai-chat"].stream_classifier().classify(f.event) for f in frames][-1]
    assert result.kind is FrameKind.FAILURE and result.error is not None and result.error.status == 429
    assert b"three" not in body


def test_http_error_replaces_the_answer_with_a_json_error_and_a_real_content_type() -> None:
    answer = FaultyAnswer(Recorded(wire.chat_stream("hi")), spec(kind="http_error", status=529), "anthropic-messages")
    assert answer.status == 529
    assert answer.headers["Content-Type"] == "application/json"
    body, _ = read(answer)
    assert json.loads(body) == {"type": "error", "error": {"type": "overloaded_error", "message": "provider overloaded (switchyard fault)"}}


def test_stream_faults_on_a_non_streaming_answer_become_an_error_body() -> None:
    real = Recorded([json.dumps(wire.chat_completion("hi")).encode()], content_type="application/json")
    answer = FaultyAnswer(real, spec(kind="sse_error", status=503), "openai-chat")
    body, _ = read(answer)
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/json"
    info = APIS["openai-chat"].body_error(json.loads(body))
    assert info is not None and ErrorPolicy().decide(info) is Decision.RETRY


def test_overload_message_carries_no_code_and_is_still_retryable() -> None:
    for api in ("openai-chat", "openai-responses", "anthropic-messages"):
        answer = FaultyAnswer(Recorded([]), spec(kind="overload_message"), api)
        body, _ = read(answer)
        frame = FrameSplitter().feed(body)[0]
        result = APIS[api].stream_classifier().classify(frame.event)
        assert result.kind is FrameKind.FAILURE and result.error is not None, api
        assert result.error.code is None and ErrorPolicy().decide(result.error) is Decision.RETRY, api


def test_reset_reports_a_connection_error_after_the_real_frames() -> None:
    real = wire.chat_stream("one two")
    answer = FaultyAnswer(Recorded(real), spec(kind="reset", after_frames=1), "openai-chat")
    body, error = read(answer)
    assert body == real[0] and isinstance(error, ConnectionResetError)
