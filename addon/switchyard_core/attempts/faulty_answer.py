"""An upstream answer with a fault applied (`faults:` in rules.yaml), read like a real one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from ..faults import IN_BODY_KINDS, RESET_MESSAGE, error_body, error_frame, status_and_message
from ..rules.schema import FaultSpec
from ..sse import Frame, FrameSplitter
from ..upstreams.body import Body
from ..upstreams.messages import Answer


class FaultyAnswer:
    """A real upstream answer with a fault applied; read like a real one.

    A filter between the real answer's body and its own: the real bytes are
    piped in as they arrive, cut at the fault point, and followed by the
    fault's ending."""

    def __init__(self, real: Answer, spec: FaultSpec, api: str) -> None:
        self._real = real
        self._spec = spec
        self._api = api
        self._status_code, self._message = status_and_message(spec)
        self._passed = 0
        self._splitter = FrameSplitter()
        self._done = False
        self.body = Body(producer=self)
        streaming = "text/event-stream" in real.headers.get("Content-Type", "").lower()
        if spec.kind == "http_error" or (not streaming and spec.kind in IN_BODY_KINDS):
            # an HTTP error; or, on a non-streaming answer, the same error inside a
            # 200 JSON body (as OpenRouter sends them), which a frame could not be
            self.status = self._status_code if spec.kind == "http_error" else real.status
            self.headers: Mapping[str, str] = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))
            self._done = True
            self.body.feed(error_body(api, self._status_code, self._message))
            self.body.end()
            return
        self.status = real.status
        self.headers = real.headers
        if spec.after_frames == 0:
            self._fire()
            return
        real.body.pipe(self._on_real).add_done_callback(self._on_real_end)

    def _on_real(self, chunk: bytes) -> None:
        if self._done:
            return
        self._pass(self._splitter.feed(chunk))

    def _on_real_end(self, finished: asyncio.Future[BaseException | None]) -> None:
        if self._done or finished.cancelled():
            return
        self._pass(self._splitter.finish())
        if not self._done:  # the real answer ended (or broke) before the fault point
            self._fire()

    def _pass(self, frames: list[Frame]) -> None:
        out: list[bytes] = []
        for frame in frames:
            out.append(frame.raw)
            self._passed += 1
            if self._passed >= self._spec.after_frames:
                break
        self.body.feed(b"".join(out))
        if self._passed >= self._spec.after_frames:
            self._fire()

    def _fire(self) -> None:
        """The fault point: the real answer is cut here and the fault's ending follows."""
        self._done = True
        kind = self._spec.kind
        if kind == "stall":
            return  # nothing more, ever: until a timeout or the client ends it
        if kind == "reset":
            self.body.end(ConnectionResetError(RESET_MESSAGE))
            return
        self.body.feed(error_frame(self._api, kind, self._status_code, self._message))
        self.body.end()

    def pause_reading(self) -> None:
        self._real.body.hold(True)

    def resume_reading(self) -> None:
        self._real.body.hold(False)

    def close(self) -> None:
        self._real.close()
