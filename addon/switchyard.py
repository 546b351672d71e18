"""Switchyard: survive LLM provider failures that arrive before the answer.

Load with `mitmdump -s addon/switchyard.py` (or mitmweb).  Everything lives in
the `switchyard_core` package beside this file; this script only wires it up.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Make the package importable even when it was not installed (plain `-s` use).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from switchyard_core.addons import CommentColumn, QuietCollections, Router, RulesKeeper, SseView  # noqa: E402

_rules = RulesKeeper()

# QuietCollections after the Router: its `responseheaders` runs once the Router's held head is out
addons = [_rules, Router(_rules), SseView(), CommentColumn(), QuietCollections()]
