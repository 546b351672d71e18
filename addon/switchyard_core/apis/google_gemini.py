"""Google Gemini (`…/models/{model}:streamGenerateContent?alt=sse`, `:generateContent`).

Every frame is `data: <GenerateContentResponse>`, with no event names and no
`[DONE]`.  Answer content is a candidate part that carries something: text
(thinking too), a function call, inline or file data, code and its result, or
any part Switchyard does not know (fail closed).  A part with empty text or
only a `thoughtSignature`, and frames with only `usageMetadata`,
`modelVersion` or `responseId`, are lifecycle.  A stream is complete once
every candidate seen has a `finishReason`; one that ends the answer without
content (`SAFETY`, `MALFORMED_FUNCTION_CALL`) is a legitimate end.  A prompt
blocked by `promptFeedback.blockReason` is a failure nobody can retry away;
`{"error": {...}}` in the stream (after a 200) is Google's error model
(google_rpc.py).

The model lives in the path, not in the body: routes match it there, and an
upstream's `model` is written there (`upstream_path`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..sse import SseEvent
from .base import Classification, ErrorInfo, FrameKind, StreamState
from .errors import MESSAGE_LIMIT, error_info
from .google_rpc import DAILY_QUOTA, GRPC_HTTP

NAME = "google-gemini"
PROMPT_BLOCKED = "prompt_blocked"  # the error type of a prompt refused by `promptFeedback.blockReason`

_KEEPALIVE = Classification(FrameKind.KEEPALIVE)
_LIFECYCLE = Classification(FrameKind.LIFECYCLE, "chunk")
_OUTPUT = Classification(FrameKind.OUTPUT, "chunk")
_FINISH = Classification(FrameKind.TERMINAL, "finishReason")
_UNKNOWN = Classification(FrameKind.OUTPUT, "unknown")

# `…/models/{model}:{method}` (or `…/tunedModels/{model}:…`), the last segment of every
# Gemini (and Vertex) model call; `…/models/{model}` alone asks about the model
_MODEL_CALL = re.compile(r"^(?P<base>.*/)(?P<collection>models|tunedModels)/(?P<model>[^/:]+)"
                         r"(?::(?P<method>[A-Za-z]+))?$")
_COLLECTIONS = ("models", "tunedModels")
_METHODS = frozenset({"generateContent", "streamGenerateContent"})
STREAM_METHOD = "streamGenerateContent"

# top-level response fields that are no answer content of their own
_LIFECYCLE_FIELDS = frozenset({"usageMetadata", "modelVersion", "responseId", "createTime", "promptFeedback",
                               "modelStatus"})
# part fields that carry no answer: an empty text, the thinking flag, the signature of a thought
_EMPTY_PART_FIELDS = frozenset({"text", "thought", "thoughtSignature"})

# Switchyard's own error codes, as Gemini would say them: HTTP status and canonical status
_OWN_CODES: dict[str, tuple[int, str]] = {
    "upstream_unavailable": (502, "UNAVAILABLE"),
    "upstream_timeout": (504, "DEADLINE_EXCEEDED"),
    "stream_cut": (503, "UNAVAILABLE"),
    "stream_stalled": (503, "UNAVAILABLE"),
    "switchyard_internal_error": (502, "INTERNAL"),
    "non_streaming_answer": (502, "INTERNAL"),
}

# the error types the classifier gives, as Gemini would say them: never a server error
_TYPES: dict[str, tuple[int, str]] = {
    PROMPT_BLOCKED: (400, "INVALID_ARGUMENT"),
    DAILY_QUOTA: (429, "RESOURCE_EXHAUSTED"),
}


@dataclass(frozen=True, slots=True)
class ModelCall:
    """A Gemini request path split where its model is."""

    base: str  # up to the collection, with its `/`
    collection: str  # `models` or `tunedModels`
    model: str
    method: str | None  # generateContent, streamGenerateContent, countTokens, ...; None: the model itself

    @property
    def prefix(self) -> str:
        return f"{self.base}{self.collection}/"

    def with_model(self, model: str) -> ModelCall:
        """This call of another model: `models/x` and `tunedModels/x` say their
        collection (written once, not twice); a plain id is a base model."""
        collection, _, name = model.rpartition("/")
        if collection not in _COLLECTIONS:
            collection, name = "models", model
        return ModelCall(self.base, collection, name, self.method)

    @property
    def path(self) -> str:
        return f"{self.prefix}{self.model}" + (f":{self.method}" if self.method else "")


def model_call(path: str) -> ModelCall | None:
    """The model (and method) a Gemini request path names, or None.

    Read as Google reads it: only a literal `:` starts the method.  An encoded one
    (`%3A`) is part of the model's name there, so the path names no call Google
    serves (it answers 404); such a path is nobody's model call, and is sent on as
    the client wrote it rather than rewritten into another request."""
    found = _MODEL_CALL.match(path.split("?", 1)[0])
    if found is None or ":" in unquote(found.group("model")):
        return None
    return ModelCall(found.group("base"), found.group("collection"), found.group("model"), found.group("method"))


def model_in_path(path: str) -> str | None:
    """The model of a Gemini model call (`…/models/{model}:{method}`), for route matching,
    percent-decoded as Google decodes a path's names (`gemini%2D2.5-pro` is
    `gemini-2.5-pro` there, and matches its route here).  A path without a method
    is left alone: `/v1/models/{model}` is OpenAI's too."""
    call = model_call(path)
    return unquote(call.model) if call is not None and call.method is not None else None


def streams(url: str) -> bool:
    """A Gemini call says in its URL that it streams: `:streamGenerateContent?alt=sse`.
    Without `alt=sse` the answer is a JSON array, held whole like any JSON answer (a
    keepalive would announce an event stream that never comes)."""
    parts = urlsplit(url)
    call = model_call(parts.path)
    return call is not None and call.method == STREAM_METHOD and ("alt", "sse") in parse_qsl(parts.query)


def speaks_gemini(path: str) -> bool:
    """Whether a request path (or a route's path glob) is Gemini's: a generate call, or
    a glob that ends at one (`/v1beta/models/*`, `…/models/*:streamGenerateContent`)."""
    path = path.split("?", 1)[0].rstrip("/")
    call = model_call(path)
    if call is not None and call.method in _METHODS:
        return True
    return "/models/" in path and (path.endswith("/models/*") or path.endswith("GenerateContent"))


def upstream_path(original_path: str, upstream_url_path: str | None, model: str | None) -> str | None:
    """The path an upstream of a Gemini route is asked at; None: its URL's as written
    (or the request's own, for `url: original`).

    The method is always the request's own (one upstream serves a stream, a whole
    answer and a token count alike).  An upstream URL that names a model call keeps
    its prefix and its model; one that names none is a base URL, as
    `GOOGLE_GEMINI_BASE_URL` is: the request's path is appended to it.  An
    upstream's `model` replaces the model."""
    call = model_call(original_path)
    if upstream_url_path is None:  # the request's own destination
        target = call
    else:
        own = model_call(upstream_url_path)
        base = upstream_url_path.rstrip("/")
        if own is None:
            if call is None:
                return base + original_path
            target = ModelCall(base + call.base, call.collection, call.model, call.method)
        else:
            target = ModelCall(own.base, own.collection, own.model, call.method) if call is not None else None
    if target is None:
        return None
    if model is not None:
        target = target.with_model(model)
    return target.path


def _part_carries_content(part: Any) -> bool:
    if not isinstance(part, dict):
        return True
    for key, value in part.items():
        if key in _EMPTY_PART_FIELDS:
            if key == "text" and value:
                return True
            continue
        if value is not None:
            return True  # functionCall (even with no args), inlineData, fileData, executableCode, anything new
    return False


def _candidate_carries_content(candidate: dict[str, Any]) -> bool:
    content = candidate.get("content")
    if content is None:
        return False
    if not isinstance(content, dict):
        return True
    parts = content.get("parts")
    if parts is None:
        return False
    if not isinstance(parts, list):
        return True
    return any(_part_carries_content(part) for part in parts)


def _blocked(obj: dict[str, Any]) -> ErrorInfo | None:
    """A prompt refused before any candidate: the same prompt is refused anywhere."""
    feedback = obj.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if not isinstance(reason, str) or not reason or obj.get("candidates"):
        return None
    message = feedback.get("blockReasonMessage") if isinstance(feedback, dict) else None
    text = message if isinstance(message, str) and message else f"prompt blocked: {reason}"
    return ErrorInfo(code=reason, type=PROMPT_BLOCKED, message=text[:MESSAGE_LIMIT], event_type="promptFeedback")


def _failure(obj: Any, kind_name: str) -> Classification | None:
    if not isinstance(obj, dict):
        return None
    found = error_info(obj, event_type=kind_name) if "error" in obj else None
    if found is None:
        found = _blocked(obj)
    return Classification(FrameKind.FAILURE, found.event_type, found) if found is not None else None


class GeminiStream(StreamState):
    """Classifies one Gemini stream; complete once every candidate seen has finished."""

    __slots__ = ("_candidates", "_finished")

    def __init__(self) -> None:
        super().__init__()
        self._candidates: set[int] = set()
        self._finished: set[int] = set()

    @property
    def complete(self) -> bool:
        return self._complete or (bool(self._candidates) and self._candidates <= self._finished)

    def worth_a_look(self, raw: bytes) -> bool:
        find = raw.find
        return find(b'"error"') >= 0 or find(b'"finishReason"') >= 0 or find(b"[DONE]") >= 0

    def _classify(self, event: SseEvent) -> Classification:
        if event.comment_only:
            return _KEEPALIVE
        data = event.data
        if data is None:
            return _LIFECYCLE if event.event else _KEEPALIVE
        if data.startswith("[DONE]"):
            return self._done()  # never sent by Gemini; a gateway may append it
        if not data.strip():
            return _LIFECYCLE
        obj = event.json()
        failed = _failure(obj, "bare_json" if event.bare_json else "chunk")
        if failed is not None:
            if failed.event_type == "promptFeedback":
                self._complete = True
            return failed
        if not isinstance(obj, dict):
            return _UNKNOWN
        candidates = obj.get("candidates")
        if candidates is None:
            return _LIFECYCLE if obj.keys() & _LIFECYCLE_FIELDS else _UNKNOWN
        if not isinstance(candidates, list):
            return _UNKNOWN
        content = finished = False
        for position, candidate in enumerate(candidates):
            if not isinstance(candidate, dict):
                return _UNKNOWN
            index = candidate.get("index", position)
            index = index if isinstance(index, int) else position
            self._candidates.add(index)
            if _candidate_carries_content(candidate):
                content = True
            reason = candidate.get("finishReason")
            if isinstance(reason, str) and reason and reason != "FINISH_REASON_UNSPECIFIED":
                self._finished.add(index)
                finished = True
        if content:
            return _OUTPUT
        return _FINISH if finished else _LIFECYCLE


def _status_of(code: str, error_type: str | None) -> tuple[int, str]:
    """The HTTP status and canonical name of an error told in Gemini's shape."""
    for name in (code, error_type):
        if name is not None and name in GRPC_HTTP:
            return GRPC_HTTP[name], name
    if error_type in _TYPES:
        return _TYPES[error_type]
    return _OWN_CODES.get(code, (500, "INTERNAL"))


def _error(message: str, code: str, error_type: str | None) -> dict[str, Any]:
    http, status = _status_of(code, error_type)
    error: dict[str, Any] = {"code": http, "message": message, "status": status}
    if code not in GRPC_HTTP:
        # a code of Switchyard's own (or a provider's that is no canonical name), where
        # Google's error model keeps machine-readable reasons
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code,
                             "domain": "switchyard"}]
    return {"error": error}


class GoogleGemini:
    name = NAME

    def stream_classifier(self, usage_expected: bool = False) -> GeminiStream:
        return GeminiStream()

    def body_error(self, body: Any) -> ErrorInfo | None:
        """A whole answer's error: `{"error": ...}`, a blocked prompt, or either inside
        the JSON array `streamGenerateContent` sends without `alt=sse` (held whole, so
        even an error after content is safe to retry)."""
        for item in body if isinstance(body, list) else [body]:
            failed = _failure(item, "body")
            if failed is not None:
                return failed.error
        return None

    def error_event(self, message: str, code: str, error_type: str | None = None) -> bytes:
        """Gemini's in-stream error, as python-genai and Gemini CLI read one (`code` the
        HTTP status, `status` the canonical name), framed as Gemini frames (CRLF)."""
        return b"data: " + json.dumps(_error(message, code, error_type)).encode() + b"\r\n\r\n"

    def error_body(self, message: str, code: str, error_type: str | None = None) -> bytes:
        """Pretty-printed with two spaces, as Google sends its error bodies."""
        return json.dumps(_error(message, code, error_type), indent=2).encode() + b"\n"

    def comment(self, text: str) -> bytes:
        """A blank line, saying nothing: Google's SDKs read only `data:` lines and blank
        lines.  An SSE comment is a JSON parse error to python-genai, and it stops the
        JS SDK's parser (Gemini CLI's) for the rest of the stream."""
        return b"\r\n"
