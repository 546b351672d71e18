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
import re
from typing import Any

import mitmproxy.log

log = logging.getLogger("switchyard")


def _hook_handlers() -> tuple[type[logging.Handler], ...]:
    """mitmproxy's handler behind its deprecated `add_log` hook, if this mitmproxy has one."""
    handler = getattr(mitmproxy.log, "LegacyLogEvents", None)
    if isinstance(handler, type) and issubclass(handler, logging.Handler):
        return (handler,)
    return ()


HOOK_HANDLERS = _hook_handlers()  # checked once, at load: see `shown_anywhere`

SUPPRESSED_AFTER_OUTPUT = "switchyard.failover_suppressed_after_semantic_output"
METADATA_KEY = "switchyard"  # the flow.metadata key holding a routed flow's story


# C0 and C1 controls and DEL: an upstream's message with ESC, BS or CSI in it must not
# reach the operator's terminal as a command (clear the screen, overwrite a line)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_QUOTED = re.compile('[ "=]')


def _value(value: Any) -> str:
    """A value as it appears in a line: plain if it can be, else quoted, with every
    control character escaped (JSON escapes C0; C1 and DEL are escaped here)."""
    text = str(value)
    if text and _QUOTED.search(text) is None and _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escape, json.dumps(text, ensure_ascii=False))


def _escape(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def printable(text: str) -> str:
    """Lines written whole (a rules file's problems, one per line): control
    characters escaped as in values, line breaks kept."""
    return "\n".join(_CONTROL.sub(_escape, line) for line in text.split("\n"))


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


def shown_anywhere(level: int, logger: logging.Logger = log) -> bool:
    """Whether a line at `level` reaches something that shows it: a terminal at that
    verbosity, mitmweb's event log, a test's capture.

    mitmproxy also hands every record, formatted, to its deprecated `add_log` hook
    over every addon, whatever the verbosity, and a debug line that nobody sees
    still costs that hook's round.  A line written for every answer asks this
    first.  That handler is not someone who sees the line; on a mitmproxy without
    it (`HOOK_HANDLERS` empty) every handler counts."""
    if not logger.isEnabledFor(level):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if level >= handler.level and not isinstance(handler, HOOK_HANDLERS):
                return True
        current = current.parent if current.propagate else None
    return False
