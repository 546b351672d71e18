"""What a WebSocket delivers, as values: a message (text as UTF-8 `bytes`, or
`Binary`) or its end (`Closed`).  Shared by both sides of a terminated WebSocket
and by the attempt core, which reads an upstream socket's items like a stream's reads."""

from __future__ import annotations

from dataclasses import dataclass

from .redaction import redact_bytes


class Binary(bytes):
    """A binary message's payload (text messages are plain `bytes`, UTF-8)."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection ended: a close frame's code and reason, or 1006 for a broken one."""

    code: int
    reason: str = ""


Item = bytes | Closed  # a message (Binary for binary ones), or the end


def redact_message(message: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """A message with `secrets` redacted, binary if it was."""
    redacted = redact_bytes(message, secrets) if secrets else message
    return Binary(redacted) if isinstance(message, Binary) and redacted is not message else redacted
