"""`switchyard.status` as a user reads it: the upstreams being skipped and until when,
an upstream that speaks another API, the counters of hedges and skips."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from switchyard_core.addons.rules_keeper import RulesKeeper
from switchyard_core.addons.status import status_text
from switchyard_core.attempts.outages import FailureKind, Outages
from switchyard_core.rules import load_rules

RULES = """\
version: 1
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    upstreams:
      - {name: openai, url: original}
      - {name: claude, url: "https://api.anthropic.com/v1/messages", api: anthropic-messages, model: claude-x}
"""


def test_status_lists_skipped_upstreams_with_time_left_and_what_each_upstream_speaks(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    keeper = RulesKeeper()
    keeper.rules = load_rules(path)
    keeper.outages = Outages()
    visit = keeper.outages.begin(keeper.rules.routes[0], 100.0)
    visit.failed("openai", FailureKind.ANSWERED, 100.0, retry_after_s=60, detail="429 rate_limit_exceeded")
    counters = Counter({"skipped": 3, "hedged": 2, "hedges_won": 1})
    text = status_text(keeper, counters, None, 130.0)
    assert "skipped: route=chat upstream=openai skipped: said to wait 60s (429 rate_limit_exceeded); 30.0s left" in text
    assert "upstream claude: https://api.anthropic.com/v1/messages; no auth; retries=1; speaks anthropic-messages, " \
           "model claude-x" in text
    assert "skipped=3, hedged=2, hedges_won=1" in text
    assert "skipped:" not in status_text(keeper, counters, None, 161.0)  # the delay has passed
