"""Log lines: one per decision, and the per-answer line only where it is seen."""

from __future__ import annotations

import logging

import pytest
from mitmproxy.addons.termlog import TermLogHandler
from mitmproxy.log import LegacyLogEvents

from switchyard_core import observe
from switchyard_core.apis.errors import MESSAGE_LIMIT
from switchyard_core.redaction import redact


@pytest.fixture
def tree() -> tuple[logging.Logger, logging.Logger]:
    """A logger and its parent standing in for mitmproxy's root, outside logging's
    registry (pytest puts its capture handlers on registered loggers)."""
    root = logging.Logger("root-standin", logging.DEBUG)  # mitmproxy sets its root to DEBUG
    child = logging.Logger("switchyard")
    child.parent = root
    return root, child


def test_a_debug_line_is_shown_where_the_terminal_shows_debug(tree: tuple[logging.Logger, logging.Logger]) -> None:
    root, child = tree
    terminal = TermLogHandler(out=None)
    terminal.setLevel(logging.DEBUG)
    root.addHandler(terminal)
    assert observe.shown_anywhere(logging.DEBUG, child)


def test_mitmproxys_legacy_log_hook_alone_does_not_count_as_showing(tree: tuple[logging.Logger, logging.Logger]) -> None:
    """mitmdump at its default verbosity: the terminal shows INFO and up; the
    deprecated add_log hook takes everything but shows nothing."""
    root, child = tree
    terminal = TermLogHandler(out=None)
    terminal.setLevel(logging.INFO)
    root.addHandler(terminal)
    root.addHandler(LegacyLogEvents(master=None))  # type: ignore[arg-type]
    assert not observe.shown_anywhere(logging.DEBUG, child)
    assert observe.shown_anywhere(logging.INFO, child)


def test_any_other_handler_that_takes_the_level_counts(tree: tuple[logging.Logger, logging.Logger]) -> None:
    """mitmweb's event log, a user's own handler: anything but the legacy hook."""
    root, child = tree
    root.addHandler(LegacyLogEvents(master=None))  # type: ignore[arg-type]
    root.addHandler(logging.NullHandler())
    assert observe.shown_anywhere(logging.DEBUG, child)


def test_a_logger_set_above_the_level_shows_nothing(tree: tuple[logging.Logger, logging.Logger]) -> None:
    root, child = tree
    root.addHandler(logging.NullHandler())
    child.setLevel(logging.INFO)
    assert not observe.shown_anywhere(logging.DEBUG, child)


def test_redact_hides_whole_keys_and_a_key_cut_off_at_the_length_limit() -> None:
    secrets = ("Bearer sk-live-0123456789", "sk-live-0123456789")
    assert redact("bad key sk-live-0123456789 given", secrets) == "bad key [redacted] given"
    cut = "message cut inside ".ljust(MESSAGE_LIMIT - 10, ".")
    assert redact(cut + "sk-live-01", secrets) == cut + "[redacted]"
    assert redact(cut[:-1] + "Bearer sk-li", secrets) == cut[:-1] + "Bearer [redacted]"
    assert redact(cut + "...sk-", secrets) == cut + "...sk-"  # too short to say anything of the key
    # a message that was not cut ends where the provider ended it: its tail is no key
    assert redact("the header must start with Bearer sk-live", secrets) == "the header must start with Bearer sk-live"
    assert redact("nothing here", secrets) == "nothing here"


def test_a_mitmproxy_without_its_legacy_log_hook_still_loads_and_counts_every_handler(
        tree: tuple[logging.Logger, logging.Logger], monkeypatch: pytest.MonkeyPatch) -> None:
    import mitmproxy.log

    monkeypatch.delattr(mitmproxy.log, "LegacyLogEvents")
    handlers = observe._hook_handlers()
    assert handlers == ()
    monkeypatch.setattr(observe, "HOOK_HANDLERS", handlers)
    root, child = tree
    root.addHandler(logging.NullHandler())
    assert observe.shown_anywhere(logging.DEBUG, child)


def test_mitmproxys_legacy_log_hook_is_found_where_it_is() -> None:
    assert observe.HOOK_HANDLERS == (LegacyLogEvents,)


@pytest.mark.parametrize("value, shown", [
    ("clear\x1b[2Jscreen", '"clear\\u001b[2Jscreen"'),  # no space: it would have been written raw
    ("back\x08\x08space", '"back\\b\\bspace"'),
    ("c1\x9b31m csi", '"c1\\u009b31m csi"'),
    ("del\x7f", '"del\\u007f"'),
    ("bell\x07", '"bell\\u0007"'),
    ("plain", "plain"),
    ("é ü", '"é ü"'),
])
def test_control_characters_in_a_value_are_escaped_never_written_raw(value: str, shown: str) -> None:
    line = observe.format_event("switchyard.attempt_failed", message=value)
    assert line == f"switchyard.attempt_failed message={shown}"
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in line)


def test_lines_written_whole_keep_their_line_breaks_and_lose_their_control_characters() -> None:
    assert observe.printable("rules.yaml:3: routes[0].\x1b[2Jname: bad\nrules.yaml:4: x\x08") == \
        "rules.yaml:3: routes[0].\\u001b[2Jname: bad\nrules.yaml:4: x\\u0008"
