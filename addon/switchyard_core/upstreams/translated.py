"""The request an upstream that speaks another API gets: the client's, translated.

The body is translated by `translate/request.py` (docs/translation.md); this
module aims it (the upstream's own URL; a Gemini upstream's model call and
method, its base URL completed as `GOOGLE_GEMINI_BASE_URL` is) and chooses its
headers.  Another API is another vendor: the client's credentials never go
there (unless the upstream names them in `forward_headers`), nor the headers
only the client's API reads (`anthropic-version`, `openai-beta`, ...); the
upstream's own `auth` and `headers` do, and whatever its API requires
(`anthropic-version`).  Pure: values in, values out.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit, urlunsplit

from ..apis.google_gemini import NAME as GEMINI
from ..apis.google_gemini import upstream_path
from ..exchange import OriginalRequest
from ..redaction import env_secrets, looks_like_credential
from ..rules import Upstream
from ..sse import compact_json
from ..translate.request import TranslatedRequest, Untranslatable, translate_request
from .messages import ACCEPT_ENCODING, HOP_BY_HOP, UpstreamRequest, is_cross_origin

ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version every current Anthropic SDK sends
# headers only one API's servers read: never sent to another API's
_API_ONLY = ("anthropic-", "openai-", "x-goog-", "x-stainless-", "x-api-key", "api-key", "x-switchyard-")


def translated_request(original: OriginalRequest, upstream: Upstream, client_api: str) -> tuple[
        UpstreamRequest, TranslatedRequest]:
    """The request for `upstream` (which speaks `upstream.api`), and what translation
    left out.  Raises `Untranslatable` when the client's content cannot be carried."""
    assert upstream.api is not None and upstream.model is not None  # the loader's rule
    try:
        body = json.loads(original.body)
    except (ValueError, RecursionError):
        raise Untranslatable("the request body is not JSON") from None
    translated = translate_request(client_api, upstream.api, body, model=upstream.model, stream=original.wants_stream)
    url = _url(upstream, original.wants_stream)
    request = UpstreamRequest("POST", url, _headers(original, upstream), compact_json(translated.body),
                              secrets=env_secrets(upstream), other_origin=is_cross_origin(url, original.url))
    return request, translated


def translated_display_url(upstream: Upstream, stream: bool) -> str:
    """The URL as it may be shown (`${VAR}` unexpanded where it was written so)."""
    return _url(upstream, stream, shown=True)


def _url(upstream: Upstream, stream: bool, *, shown: bool = False) -> str:
    written = upstream.display_url if shown and upstream.display_url else upstream.url
    assert written is not None
    if upstream.api != GEMINI:
        return written
    parts = urlsplit(written)
    method = "streamGenerateContent" if stream else "generateContent"
    path = upstream_path(f"/v1beta/models/{upstream.model}:{method}", parts.path, upstream.model) or parts.path
    query = [piece for piece in parts.query.split("&") if piece and piece.partition("=")[0] != "alt"]
    if stream:
        query.append("alt=sse")
    return urlunsplit((parts.scheme, parts.netloc, path, "&".join(query), ""))


def _headers(original: OriginalRequest, upstream: Upstream) -> tuple[tuple[str, str], ...]:
    replaced = {name.lower() for name, _ in upstream.headers}
    if upstream.auth is not None:
        replaced.add(upstream.auth[0].lower())
    headers: list[tuple[str, str]] = []
    for name, value in original.headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in replaced or lowered in ("content-type", "accept"):
            continue
        if lowered.startswith(_API_ONLY) or lowered == "cookie":
            continue
        if looks_like_credential(lowered) and lowered not in upstream.forward_headers:
            continue  # the client's credentials stay with their vendor
        headers.append((name, ACCEPT_ENCODING if lowered == "accept-encoding" else value))
    headers += [("Content-Type", "application/json"),
                ("Accept", "text/event-stream" if original.wants_stream else "application/json")]
    if upstream.api == "anthropic-messages" and "anthropic-version" not in replaced:
        headers.append(("anthropic-version", ANTHROPIC_VERSION))
    headers.extend(upstream.headers)
    if upstream.auth is not None:
        headers.append(upstream.auth)
    return tuple(headers)
