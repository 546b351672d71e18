"""A Gemini continuation's frames re-framed into the original stream (see reframe.py).

Gemini: every frame is a whole `GenerateContentResponse` with no ids or
indexes of its own beyond `responseId` and `modelVersion`, which are the
original's (a client that groups chunks by `responseId` sees one answer).  Its
text parts are cut to what the client has not seen, its thought parts dropped
(the answer the client has has none), and the `finishReason` and
`usageMetadata` of its last frame end the stream.
"""

from __future__ import annotations

from typing import Any

from ..sse import SseEvent, compact_json
from .reframe_base import BaseReframer
from .transcript import GEMINI_TEXT_FIELDS


class GeminiReframer(BaseReframer):
    def feed(self, event: SseEvent) -> bytes:
        if event.comment_only or event.data is None or not event.data.strip():
            return b""  # Google's SDKs read only `data:` lines: nothing to keep alive with
        if event.data == "[DONE]":
            self.overlap.ended()
            return b""  # not Gemini's: a gateway's, which no Gemini client reads
        chunk = event.json()
        if not isinstance(chunk, dict):
            self.overlap.not_text("a frame that is not JSON")
            return b""
        candidates = chunk.get("candidates")
        if not isinstance(candidates, list):
            # usage or prompt feedback alone: worth sending only once the text flows
            return self._frame(chunk) if self.forwarded else b""
        out: list[Any] = []
        for position, candidate in enumerate(candidates):
            if not isinstance(candidate, dict) or candidate.get("index", position) != 0:
                # one candidate was asked for (several are never continued): another is not
                # part of the client's answer
                self.overlap.not_text("another candidate")
                continue
            kept = self._candidate(candidate)
            if kept is not None:
                out.append(kept)
        if not out:
            return b""
        return self._frame({**chunk, "candidates": out})

    def _candidate(self, candidate: dict[str, Any]) -> dict[str, Any] | None:
        """The candidate as the client gets it, or None when it carries nothing new."""
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        kept: list[Any] = []
        news = False  # a part the client gets that carries something
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, dict) and part.get("thought"):
                continue  # thinking again: the client's answer has none
            if not _plain(part):
                self.overlap.not_text("a part that is not text")
                kept.append(part)
                news = True
                continue
            text = part.get("text")
            if not text:
                kept.append(part)  # carries nothing (an empty text, a signature): as it came
                continue
            new = self._text(text)
            if new:
                kept.append({**part, "text": new})
                news = True
        finish = candidate.get("finishReason")
        if finish and finish != "FINISH_REASON_UNSPECIFIED":
            self.overlap.ended()
        elif not news:
            return None  # lifecycle, thinking, or text the client already has
        out = dict(candidate)
        if isinstance(content, dict):
            out["content"] = {**content, "parts": kept or [{"text": ""}]}
        return out

    def _frame(self, chunk: dict[str, Any]) -> bytes:
        t = self.transcript
        for key, value in (("responseId", t.response_id), ("modelVersion", t.model)):
            if value is not None and key in chunk:
                chunk = {**chunk, key: value}
        return b"data: " + compact_json(chunk) + b"\r\n\r\n"


def _plain(part: Any) -> bool:
    """A Gemini part of plain text (or of nothing): its text and a thought's signature
    (`thought: true` parts are thinking, dropped before this is asked)."""
    return (isinstance(part, dict) and isinstance(part.get("text", ""), str)
            and all(key in GEMINI_TEXT_FIELDS or value is None for key, value in part.items()))
