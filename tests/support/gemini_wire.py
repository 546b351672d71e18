"""Gemini's wire shapes, as recorded or documented, for the fake provider.

Frames are `data: <GenerateContentResponse>` ended by CRLF CRLF, JSON with a
space after each colon and none after commas, as Gemini writes it.  A normal
answer carries the upstream's name, so a test can tell whose answer a client
got.  A `generateContent` request that asks for JSON (Gemini CLI's model
router, which scores the prompt's complexity) gets JSON its schema accepts.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fake_provider import Reply

MODEL_CALL = re.compile(r"/models/(?P<model>[^/:]+):(?P<method>streamGenerateContent|generateContent)$")
MODEL_VERSION = "gemini-2.5-flash"
# the canonical status Google sends beside each HTTP status it fails with
STATUS_NAMES = {400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
                504: "DEADLINE_EXCEEDED"}

# what Gemini CLI's routers ask for (numerical classifier: a complexity score; the
# older classifier: a model choice); zod drops the keys its schema does not name
ROUTER_ANSWER = {"complexity_reasoning": "A short, direct request.", "complexity_score": 10,
                 "reasoning": "A short, direct request.", "model_choice": "flash"}


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ": "), ensure_ascii=False).encode()


def frame(obj: object) -> bytes:
    return b"data: " + dumps(obj) + b"\r\n\r\n"


def words(text: str) -> list[str]:
    pieces = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(pieces)]


def usage(candidates: int) -> dict[str, int]:
    return {"promptTokenCount": 8, "candidatesTokenCount": candidates, "totalTokenCount": 8 + candidates}


def chunk(text: str, response_id: str = "fake-response-1", model: str = MODEL_VERSION) -> bytes:
    return frame({"candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}],
                  "usageMetadata": usage(0), "modelVersion": model, "responseId": response_id})


def stream(text: str, response_id: str = "fake-response-1", model: str = MODEL_VERSION) -> list[bytes]:
    """A normal stream: one frame per word, the last with `finishReason` and usage."""
    pieces = words(text)
    frames = [chunk(piece, response_id, model) for piece in pieces[:-1]]
    frames.append(frame({"candidates": [{"content": {"parts": [{"text": pieces[-1]}], "role": "model"},
                                         "finishReason": "STOP", "index": 0}],
                         "usageMetadata": usage(len(pieces)), "modelVersion": model,
                         "responseId": response_id}))
    return frames


def response(text: str) -> dict[str, object]:
    """A whole `generateContent` answer."""
    return {"candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP",
                            "index": 0}],
            "usageMetadata": usage(5), "modelVersion": MODEL_VERSION, "responseId": "fake-response-2"}


def status_of(status: int) -> tuple[int, str]:
    """The code and canonical status Google fails with for `status` (an overload is
    503 UNAVAILABLE there, never Anthropic's 529)."""
    code = 503 if status == 529 else status
    return code, STATUS_NAMES.get(code, "UNAVAILABLE")


def error(code: int, status: str, message: str) -> dict[str, object]:
    return {"error": {"code": code, "message": message, "status": status}}


def error_frame(code: int, status: str, message: str) -> bytes:
    """An error inside a 200 stream, as python-genai checks every chunk for."""
    return frame(error(code, status, message))


def error_body(code: int, status: str, message: str, details: list[object] | None = None) -> bytes:
    """A pre-stream HTTP error body: pretty-printed with two spaces, as Google sends it."""
    body = error(code, status, message)
    if details:
        body["error"]["details"] = details  # type: ignore[index]
    return json.dumps(body, indent=2).encode() + b"\n"


def asks_for_json(request: bytes) -> bool:
    try:
        config = json.loads(request).get("generationConfig") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(config, dict) and (config.get("responseMimeType") == "application/json"
                                         or "responseJsonSchema" in config or "responseSchema" in config)


def normal_reply(path: str, text: str, request: bytes) -> "Reply | None":
    """The normal answer to a Gemini model call, or None if `path` is none."""
    from .fake_provider import Reply

    found = MODEL_CALL.search(path)
    if found is None:
        return None
    if found.group("method") == "streamGenerateContent":
        return Reply.sse(*stream(text))
    if asks_for_json(request):
        return Reply.json(200, response(json.dumps(ROUTER_ANSWER)))
    return Reply.json(200, response(text))


# --- a tool call, as Gemini answers with one ------------------------------------------

def tool_call_stream(name: str, args: dict[str, object], response_id: str = "fake-response-3",
                     model: str = MODEL_VERSION, *, call_id: str | None = None, text: str = "",
                     thought_signature: str | None = None) -> list[bytes]:
    """A function call answer: Gemini sends a call whole (no argument pieces), here in
    the last frame beside `finishReason` STOP (Gemini says STOP for a tool-call answer
    too) and the usage; with `text`, the text's frames first.  `call_id`: the id newer
    models give a call; `thought_signature`: what a thinking model puts beside it."""
    frames = [chunk(piece, response_id, model) for piece in words(text)] if text else []
    call: dict[str, object] = {"name": name, "args": args}
    if call_id is not None:
        call = {"id": call_id, **call}
    part: dict[str, object] = {"functionCall": call}
    if thought_signature is not None:
        part["thoughtSignature"] = thought_signature
    frames.append(frame({"candidates": [{"content": {"parts": [part], "role": "model"}, "finishReason": "STOP",
                                         "index": 0}],
                         "usageMetadata": usage(12), "modelVersion": model, "responseId": response_id}))
    return frames


def tool_call_response(name: str, args: dict[str, object], call_id: str | None = None) -> dict[str, object]:
    """A whole `generateContent` answer that calls a function."""
    call: dict[str, object] = {"name": name, "args": args}
    if call_id is not None:
        call = {"id": call_id, **call}
    return {"candidates": [{"content": {"parts": [{"functionCall": call}], "role": "model"}, "finishReason": "STOP",
                            "index": 0}],
            "usageMetadata": usage(12), "modelVersion": MODEL_VERSION, "responseId": "fake-response-4"}
