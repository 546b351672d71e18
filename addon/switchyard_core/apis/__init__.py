"""One module per API; this registry maps API names and request paths to them."""

from __future__ import annotations

from .anthropic_messages import AnthropicMessages
from .base import Api, Classification, ErrorInfo, FrameKind, StreamClassifier
from .errors import Decision, ErrorPolicy
from .google_gemini import GoogleGemini, speaks_gemini
from .openai_chat import OpenAIChat
from .openai_responses import OpenAIResponses

APIS: dict[str, Api] = {
    api.name: api for api in (OpenAIChat(), OpenAIResponses(), AnthropicMessages(), GoogleGemini())
}


def api_for_path(path: str) -> str | None:
    """The API a request path speaks, by its last segments; None if unknown."""
    if speaks_gemini(path):  # `…/models/{model}:streamGenerateContent`: the model is in the path
        return "google-gemini"
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "openai-chat"
    if path.endswith("/responses"):
        return "openai-responses"
    if path.endswith("/messages"):
        return "anthropic-messages"
    return None


__all__ = [
    "APIS",
    "Api",
    "Classification",
    "Decision",
    "ErrorInfo",
    "ErrorPolicy",
    "FrameKind",
    "StreamClassifier",
    "api_for_path",
]
