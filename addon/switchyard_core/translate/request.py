"""The request half of translation: a client's request body in its API, as the
body an upstream that speaks another API takes (docs/translation.md, "Requests").

Each API has a decoder into the intermediate form (`requests/ir.py`) and an
encoder out of it, so four of each serve all twelve ordered pairs.  What the
client sent that the upstream cannot take is either refused (`Untranslatable`:
the client's content, which is never dropped) or left out with a reason (an
option, a record only its own vendor can read).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .requests import anthropic, chat, gemini, responses
from .requests.anthropic import ANTHROPIC_DEFAULT_MAX_TOKENS
from .requests.ir import API_NAMES, Request, Untranslatable

Encoder = Callable[..., tuple[dict[str, Any], list[str]]]

_DECODERS: dict[str, Callable[[Mapping[str, Any]], Request]] = {
    chat.API: chat.decode, responses.API: responses.decode, anthropic.API: anthropic.decode, gemini.API: gemini.decode,
}
_ENCODERS: dict[str, Encoder] = {
    chat.API: chat.encode, responses.API: responses.encode, anthropic.API: anthropic.encode, gemini.API: gemini.encode,
}


@dataclass(frozen=True, slots=True)
class TranslatedRequest:
    """`body`: JSON for the upstream's API (for google-gemini without the model or
    streaming, which live in the URL).  `left_out`: each request option not carried,
    as a short reason for a log line, never quoting the request's content."""

    body: dict[str, Any]
    left_out: tuple[str, ...] = ()


def translate_request(client_api: str, upstream_api: str, body: dict[str, Any], *, model: str,
                      stream: bool) -> TranslatedRequest:
    """The client's `body` (in `client_api`) as `upstream_api` takes it, asking for
    `model` and, where `stream`, a streamed answer.  Raises `Untranslatable` when
    the client's content cannot be carried there."""
    if client_api not in _DECODERS or upstream_api not in _ENCODERS:
        raise ValueError(f"unknown API: {client_api if client_api not in _DECODERS else upstream_api}")
    if not isinstance(body, dict):
        raise Untranslatable("the request body is not a JSON object")
    if client_api == upstream_api:
        return TranslatedRequest(_same_api(upstream_api, body, model, stream))
    request = _DECODERS[client_api](body)
    translated, left_out = _ENCODERS[upstream_api](request, model=model, stream=stream)
    return TranslatedRequest(translated, tuple(dict.fromkeys([*request.left_out, *left_out])))


def _same_api(api: str, body: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
    """Nothing to translate: the client's body with the upstream's model."""
    out = copy.deepcopy(body)
    if api == gemini.API:
        return out
    out["model"] = model
    if stream:
        out["stream"] = True
    return out


__all__ = ["ANTHROPIC_DEFAULT_MAX_TOKENS", "API_NAMES", "TranslatedRequest", "Untranslatable", "translate_request"]
