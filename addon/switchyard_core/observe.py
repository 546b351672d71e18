"""Log events: one line per decision, greppable, never a credential or a body.

Every line starts with the event name (`switchyard.attempt_failed`, ...) and
carries `key=value` pairs.  Only facts chosen here are logged: route,
upstream, attempt, status, code, type, event, decision, the provider's error
message (truncated) and its request id.  Request bodies and headers never
reach this module.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("switchyard")

SUPPRESSED_AFTER_OUTPUT = "switchyard.failover_suppressed_after_semantic_output"
METADATA_KEY = "switchyard"  # the flow.metadata key holding a routed flow's story


def _value(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n\r\t'):
        return json.dumps(text, ensure_ascii=False)
    return text


def format_event(name: str, **fields: Any) -> str:
    parts = [name]
    for key, value in fields.items():
        if value is None or value == "":
            continue
        parts.append(f"{key}={_value(value)}")
    return " ".join(parts)


def emit(level: int, name: str, **fields: Any) -> None:
    if log.isEnabledFor(level):
        log.log(level, format_event(name, **fields))
