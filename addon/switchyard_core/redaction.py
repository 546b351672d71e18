"""Credentials: which names carry them, and their values kept out of logs and flows.

One rule decides both where a client's header or query parameter may go and
what is shown of it: a name that looks like a credential (`looks_like_credential`)
is never sent to another origin unless that upstream's rules name it
(`forward_headers`, `forward_query`), and its value is shown as `[redacted]`.
A provider's error message can echo a key; every credential value an exchange
(or a WebSocket connection) carries is replaced by `[redacted]` before a
message is logged or recorded, and the values Switchyard filled in from the
environment also in what it passes on from an upstream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import lru_cache
from urllib.parse import unquote_plus, urlsplit

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

# Words that mark a name as a credential's anywhere in it (`X-Auth-Token`,
# `X-Amz-Security-Token`, `access_token`, `client_secret`, `sessionid`, `Set-Cookie`,
# `X-Amz-Signature`, `apikey`), and parts that do so when the name is split at `-`,
# `_` and `.` (`key`, `Ocp-Apim-Subscription-Key`, `x-goog-api-key`, Azure SAS's `sig`).
_CREDENTIAL_WORDS = re.compile(r"token|secret|auth|passw|pwd|session|cookie|credential|signature|apikey|private")
_CREDENTIAL_PARTS = frozenset({"key", "sig", "jwt", "sas"})
_PART = re.compile(r"[^a-z0-9]+")


def looks_like_credential(name: str) -> bool:
    """Whether a header or query parameter named so may carry a credential: then it
    never goes to another origin unasked, and its value is never shown."""
    lowered = name.lower()
    if lowered in CREDENTIAL_HEADERS or _CREDENTIAL_WORDS.search(lowered):
        return True
    return any(part in _CREDENTIAL_PARTS or part.endswith("key") for part in _PART.split(lowered))


def query_name(piece: str) -> str:
    """A query string piece's (`a%5Fb=c`) parameter name, as a server reads it."""
    return unquote_plus(piece.partition("=")[0])


def credential_query_values(*urls: str) -> list[str]:
    """The values of the query parameters in `urls` that look like credentials
    (`?key=`): a provider's error can echo them ("Consumer 'api_key:…' has been
    suspended")."""
    values = []
    for url in urls:
        for piece in urlsplit(url).query.split("&"):
            value = piece.partition("=")[2]
            if value and looks_like_credential(query_name(piece)):
                values.append(unquote_plus(value))
    return values


def secret_values(client_headers: Iterable[tuple[str, str]], upstreams: Iterable[Upstream],
                  others: Iterable[str] = ()) -> tuple[str, ...]:
    """Credential values an exchange carries: the client's (headers that look like
    credentials), its upstreams' own (their `auth` and anything filled in from the
    environment), and `others` (query parameters that look like credentials:
    `credential_query_values`)."""
    values = [value for name, value in client_headers if looks_like_credential(name)]
    values += others
    for upstream in upstreams:
        if upstream.auth is not None:
            values.append(upstream.auth[1])
        values += [value for name, value in upstream.headers if name.lower() in upstream.secret_headers]
        values += upstream.env_values
    return _longest_first(values)


@lru_cache(maxsize=256)  # asked for every attempt; an upstream is immutable (a reload makes new ones)
def env_secrets(upstream: Upstream) -> tuple[bytes, ...]:
    """What the upstream's `${VAR}`s were filled with, as bytes: an upstream may echo its
    own key ("Incorrect API key provided: sk-..."), and what it sends is passed on.  Each
    also as JSON strings write it (`\\u00e9`, `\\"`, `\\\\`, and `\\/` as some encoders do):
    an echo is usually inside one."""
    found = set()
    for value in _longest_first(upstream.env_values):
        for written in (value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
            found |= {written, written.replace("/", "\\/")}
    return tuple(sorted((written.encode("utf-8", "surrogateescape") for written in found), key=len, reverse=True))


def redact_bytes(data: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """`data` with every byte any value covers replaced: values that overlap (one key's
    tail another's start) or begin one another go as one `[redacted]`, whichever is
    looked for first."""
    spans = _spans(data, secrets)
    if not spans:
        return data
    out: list[bytes] = []
    at = 0
    for start, end in spans:
        out += (data[at:start], b"[redacted]")
        at = end
    out.append(data[at:])
    return b"".join(out)


def _spans(data: bytes, secrets: tuple[bytes, ...]) -> list[tuple[int, int]]:
    """Where values occur in `data`, overlapping occurrences merged, in order."""
    found = []
    for secret in secrets:
        start = data.find(secret)
        while start != -1:
            found.append((start, start + len(secret)))
            start = data.find(secret, start + 1)
    if not found:
        return []
    found.sort()
    merged = [found[0]]
    for start, end in found[1:]:
        last_start, last_end = merged[-1]
        if start < last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


class StreamRedactor:
    """`redact_bytes` over a stream of reads: a value split across two reads is still
    caught.  A read's tail is held back while it could begin a value (a shorter value
    that begins a longer one too), which is rare (it must match a value's first bytes)
    and costs nothing where none does; what is still held when the stream ends began
    a value, and is redacted as a cut message's tail is (`redact`)."""

    def __init__(self, secrets: tuple[bytes, ...]) -> None:
        self.secrets = secrets
        self._held = b""
        # how much may be held for values that overlap a held start: a run of them is passed on
        self._hold_limit = 2 * max((len(secret) for secret in secrets), default=0)

    def feed(self, data: bytes) -> bytes:
        """What may be passed on now, of what was held and `data`."""
        data = self._held + data
        keep_from = len(data) - self._open_tail(data)
        for start, end in _spans(data, self.secrets):
            if start < keep_from < end:  # a whole value runs into the held start: it waits with it
                keep_from = start if len(data) - start <= self._hold_limit else end
                break
        self._held = data[keep_from:]
        return redact_bytes(data[:keep_from], self.secrets)

    def flush(self) -> bytes:
        """What was held back, at the stream's end: the start of a value goes too."""
        held, self._held = redact_bytes(self._held, self.secrets), b""
        open_start = self._open_tail(held)
        if open_start >= PARTIAL_SECRET_MIN:
            return held[:len(held) - open_start] + b"[redacted]"
        return held

    def _open_tail(self, data: bytes) -> int:
        """How many of `data`'s last bytes begin some value (without being all of it)."""
        longest = 0
        for secret in self.secrets:
            tail = data[-(len(secret) - 1):] if len(secret) > 1 else b""
            start = tail.find(secret[:1])
            while start != -1 and len(tail) - start > longest:
                if secret.startswith(tail[start:]):
                    longest = len(tail) - start
                    break
                start = tail.find(secret[:1], start + 1)
        return longest


def redact_cut(data: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """`redact_bytes` on what may have been cut short (at a limit of the sender's or of
    Switchyard's): a value's start at its end is redacted too, as at a stream's end."""
    if not secrets:
        return data
    redactor = StreamRedactor(secrets)
    return redactor.feed(data) + redactor.flush()


CLOSE_REASON_LIMIT = 123  # bytes of a WebSocket close frame's reason (RFC 6455 5.5: 125 with its code)


def redact_text(text: str, secrets: tuple[bytes, ...], *, limit: int | None = None) -> str:
    """`redact_bytes` on a short text an upstream sent whole (a header value, a close
    reason).  With `limit` (a close reason's CLOSE_REASON_LIMIT bytes, which its sender
    may have cut inside a value) a value's start at its end goes too (`redact_cut`), and
    the result is cut to `limit` bytes on a character's edge (`[redacted]` is longer than
    a short value)."""
    if not secrets:
        return text
    data = text.encode("utf-8", "surrogateescape")
    out = (redact_bytes(data, secrets) if limit is None else redact_cut(data, secrets)).decode("utf-8", "surrogateescape")
    if limit is not None:
        while len(out.encode("utf-8", "surrogateescape")) > limit:
            out = out[:-1]
    return out


def redact_headers(headers: Iterable[tuple[str, str]], secrets: tuple[bytes, ...]) -> list[tuple[str, str]]:
    """Header values with `secrets` redacted (`WWW-Authenticate: Bearer error="invalid_token",
    token="<the key it refused>"`)."""
    if not secrets:
        return list(headers)
    return [(name, redact_text(value, secrets)) for name, value in headers]


def _longest_first(values: Iterable[str]) -> tuple[str, ...]:
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
