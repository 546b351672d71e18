"""docs/rules.md is made from the schema (scripts/rules-reference) and must be current;
the defaults it shows are the ones the loader uses, written once in schema.py."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

from switchyard_core.rules import AttemptSettings, load_rules
from switchyard_core.rules.reference import PLACES, Place, _own, _section, render
from switchyard_core.rules.schema import Seconds, Settings, default_of, setting

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "rules.md"


def test_the_committed_reference_is_what_the_schema_makes() -> None:
    done = subprocess.run([str(ROOT / "scripts" / "rules-reference"), "--check"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert REFERENCE.read_text() == render()


def test_the_check_fails_on_a_stale_reference_and_says_what_to_run(tmp_path: Path) -> None:
    from switchyard_core.rules.reference import main

    stale = tmp_path / "rules.md"
    stale.write_text(render().replace("| `1` |", "| `2` |", 1))
    assert main(["--check", str(stale)]) == 1
    assert main([str(stale)]) == 0 and main(["--check", str(stale)]) == 0


def test_every_key_of_every_place_is_in_the_reference_with_its_meaning() -> None:
    text = REFERENCE.read_text()
    for place in PLACES:
        for name in place.keys:
            info = place.model.model_fields[name]
            assert info.description, f"{place.model.__name__}.{name}"
            row = re.search(rf'<a id="[^"]+-{name}"></a>`{name}` \|[^\n]*', text.split(f"## {place.title}\n", 1)[1])
            assert row and info.description.replace("|", "\\|") in row.group(0), name


def test_the_loaders_defaults_are_the_schemas_and_the_reference_shows_them() -> None:
    settings = AttemptSettings()
    assert {f.name for f in dataclasses.fields(AttemptSettings)} == set(Settings.model_fields)
    section = REFERENCE.read_text().split("## Settings\n", 1)[1].split("\n## ", 1)[0]
    shown = {m.group(1): m.group(2) for m in re.finditer(r"`(\w+)` \| [^|]+ \| `([^`]*)` \|", section)}
    assert shown["retries"] == "1" and settings.retries == 1
    assert shown["staging_limit"] == "8MiB" and settings.staging_limit == 8 * 1024 * 1024
    assert shown["request_timeout_s"] == "600" and settings.request_timeout_s == 600
    assert shown["retry_on"] == "[408, 429, 500, 502, 503, 504, 529]"
    assert settings.retry_on == {408, 429, 500, 502, 503, 504, 529}
    assert shown["continue_after_cut"] == "[]" and settings.continue_after_cut == ()
    assert set(shown) == set(Settings.model_fields), "every setting has its default in the schema"
    # and the loader holds exactly those: none is written a second time in AttemptSettings
    written = Settings.model_validate({name: default_of(Settings, name) for name in Settings.model_fields})
    for name in Settings.model_fields:
        value = getattr(written, name)
        value = frozenset(value) if name == "retry_on" else tuple(value) if isinstance(value, list) else value
        assert getattr(settings, name) == value, f"{name}: AttemptSettings' default is not schema.py's"


def test_a_rules_file_that_sets_nothing_runs_on_the_defaults_the_reference_shows(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: r\n    match: {path: /v1/chat/completions}\n"
                     "    upstreams: [{name: u, url: original}]\n")
    assert load_rules(rules).routes[0].settings == AttemptSettings()


def test_the_references_example_file_loads(tmp_path: Path, monkeypatch) -> None:
    example = REFERENCE.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    rules = tmp_path / "rules.yaml"
    rules.write_text(example)
    monkeypatch.setenv("BACKUP_API_KEY", "sk-backup")
    loaded = load_rules(rules)
    assert [u.name for u in loaded.routes[0].upstreams] == ["openai", "backup"] and not loaded.warnings
    assert loaded.routes[0].settings.first_output_timeout_s == 20


def test_a_setting_added_to_the_schema_shows_up_with_its_default_and_meaning() -> None:
    class More(Settings):
        hedge_after_s: Seconds | None = setting(0, "Ask the next upstream too after this long.")

    lines = "\n".join(_section(Place(More, "Settings", "`defaults`, route", _own(More))))
    assert '`hedge_after_s` | seconds ≥ 0 | `0` | Ask the next upstream too after this long. |' in lines
