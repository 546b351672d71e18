"""An upstream that speaks another API than its route's, as `rules.yaml` may declare it."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard_core.rules import RulesError, load_rules


def test_an_upstream_of_another_api_on_the_original_destination_is_refused_at_load(tmp_path: Path) -> None:
    """`original` is the client's destination, which speaks the client's API: a
    translated request has nowhere to go there.  Refused with file, line and field,
    not found by every request failing (before, each answered 502 internal error and
    the backup after it was never asked)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("""\
version: 1
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    upstreams:
      - {name: claude, url: original, api: anthropic-messages, model: claude-sonnet-4-5}
      - {name: backup, url: "https://backup.example/v1/chat/completions"}
""")
    with pytest.raises(RulesError) as caught:
        load_rules(rules)
    assert str(caught.value) == (f"{rules}:6: routes[0].upstreams[0].url: an upstream that speaks anthropic-messages "
                                 "on a openai-chat route needs its own url (`original` is where the client's "
                                 "openai-chat request was going)")
