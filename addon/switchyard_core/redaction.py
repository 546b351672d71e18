"""Credentials: the headers that carry them, and their values kept out of logs.

A provider's error message can echo a key; every credential value an exchange
(or a WebSocket connection) carries is replaced by `[redacted]` before a
message is logged or recorded.
"""

from __future__ import annotations

from collections.abc import Iterable

from .apis.errors import MESSAGE_LIMIT
from .rules import Upstream

# The client's credentials: never sent to an upstream on another origin, never shown.
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "openai-organization",
        "openai-project",
        "anthropic-admin-api-key",
    }
)
PARTIAL_SECRET_MIN = 4  # shorter tails ("Bea", "sk-") say nothing of a key


def secret_values(client_headers: Iterable[tuple[str, str]], upstreams: Iterable[Upstream],
                  others: Iterable[str] = ()) -> tuple[str, ...]:
    """Credential values an exchange carries: the client's, and its upstreams' own
    (their `auth` and any header filled in from the environment), and `others`
    (credential query parameters: Gemini's `?key=`)."""
    values = [value for name, value in client_headers if name.lower() in CREDENTIAL_HEADERS]
    values += others
    for upstream in upstreams:
        if upstream.auth is not None:
            values.append(upstream.auth[1])
        values += [value for name, value in upstream.headers if name.lower() in upstream.secret_headers]
    found = {part for value in values for part in (value, *value.split()) if len(part) >= 8}
    return tuple(sorted(found, key=len, reverse=True))


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """A provider's error message can echo a key: never log or record it.  Messages
    are cut to MESSAGE_LIMIT characters before they get here, so one that was cut
    may end inside a key: a tail that begins a key goes too (a key, not a whole
    header value: "... use Bearer" says nothing of the key after it)."""
    cut = len(text) >= MESSAGE_LIMIT
    for secret in secrets:
        text = text.replace(secret, "[redacted]")
        if not cut or " " in secret:
            continue
        for kept in range(min(len(secret) - 1, len(text)), PARTIAL_SECRET_MIN - 1, -1):
            if text.endswith(secret[:kept]):
                text = text[:-kept] + "[redacted]"
                break
    return text
