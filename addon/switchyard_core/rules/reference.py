"""The `rules.yaml` reference (docs/rules.md), made from the schema: every key, where
it may be set, its type, its default and its meaning.  `scripts/rules-reference`
writes it; a test checks that the committed file is what this makes, so the
reference cannot drift from the schema.  A key added to a model is picked up
here by itself; its meaning is its `Field(description=...)` and its default is
`schema.setting(...)`'s or the field's own (`default_of`).
"""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from .schema import Auth, FaultSpec, Match, RouteSpec, RulesFile, Settings, Shown, UpstreamSpec, default_of


class Place(typing.NamedTuple):
    model: type[BaseModel]
    title: str  # the section's heading
    where: str  # how the index names the place
    keys: tuple[str, ...]  # the model's keys shown in this section


def _own(model: type[BaseModel], base: type[BaseModel] | None = None) -> tuple[str, ...]:
    inherited = set(base.model_fields) if base else set()
    return tuple(name for name in model.model_fields if name not in inherited)


PLACES = (
    Place(RulesFile, "The file", "top level", _own(RulesFile)),
    Place(Settings, "Settings", "`defaults`, route", _own(Settings)),
    Place(RouteSpec, "Routes", "route", _own(RouteSpec, Settings)),
    Place(Match, "match", "route's `match`", _own(Match)),
    Place(UpstreamSpec, "Upstreams", "upstream", _own(UpstreamSpec)),
    Place(Auth, "auth", "upstream's `auth`", _own(Auth)),
    Place(FaultSpec, "Faults", "fault", _own(FaultSpec)),
)

INTRO = """\
# `rules.yaml` reference

<!-- Generated from addon/switchyard_core/rules/schema.py by scripts/rules-reference; do not edit by hand.
     A key's meaning is its description in the schema; run the script after changing one. -->

Switchyard reads `./rules.yaml` when there is one, else the file shipped with it
([`rules.yaml`](../rules.yaml): OpenAI Chat Completions, the Responses API,
Anthropic Messages and Google Gemini, each to the request's own destination with
one same-upstream retry). `--set switchyard_rules=PATH` chooses another file.

```yaml
version: 1
defaults:                      # every setting here may be set on a route instead
  retries: 1
  first_output_timeout_s: 20
routes:                        # the first route that matches a request takes it
  - name: openai-chat
    match: {host: api.openai.com, path: /v1/chat/completions, model: "gpt-4o*"}
    upstreams:                 # in order; the first to produce output wins
      - name: openai
        url: original          # the request's own destination and credentials
      - name: backup
        url: https://backup.example.com/v1/chat/completions
        model: gpt-4o-mini
        retries: 0
        auth: {header: Authorization, value: "Bearer ${BACKUP_API_KEY}"}
```

- **Secrets come from the environment.** `${VAR}` is expanded in an upstream's
  `url`, `auth.value` and `headers`. An upstream whose variable is unset is
  skipped with one warning when the rules load; a route left with no usable
  upstream is disabled (one more warning), and its requests pass through
  untouched, as if Switchyard were not there.
- **Credentials never cross origins.** An upstream on another scheme, host or
  port never gets the client's credentials (see [Security](security.md)); it
  gets its own `auth`, and `forward_headers` / `forward_query` name what it
  should get anyway.
- **Mistakes are named.** A broken file stops start-up with the file, line and
  field of every problem, one line each (`rules.yaml:8:
  routes[0].upstreams[0].retries: Input should be a valid integer`,
  `rules.yaml:3: defaults.backof_ms: not a known key here (did you mean
  backoff_ms?)`). `true`/`false` where a number belongs is an error, not 1 or 0;
  so is what no request could carry (a header name with a `:` or a space, a line
  break in a header value, a URL with port 99999, no host or a space in it). A
  route that an earlier one always takes first gets a warning: it would never
  be used.
- **Edits apply while running**, within a second; a broken edit keeps the last
  good rules and logs why. The `switchyard.reload` command re-reads on demand.
- Bounds: at most 1 MiB, 100 aliases, 100,000 values with aliases expanded, 50
  levels of nesting ([Security](security.md#bounds)).

What each failure counts as (retried, next upstream only, fatal) is in
[Which failures are retried](failures.md).
"""


def _bare(annotation: Any) -> tuple[Any, bool]:
    """The annotation without `None`, and whether it allowed None."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        optional = len(args) < len(get_args(annotation))
        return (args[0] if len(args) == 1 else Union[tuple(args)]), optional  # noqa: UP007
    return annotation, False


def type_text(annotation: Any) -> str:
    """How the reference names a key's type."""
    annotation, _ = _bare(annotation)
    origin = get_origin(annotation)
    if origin is Annotated:
        shown = [meta for meta in annotation.__metadata__ if isinstance(meta, Shown)]
        return shown[0].text if shown else type_text(get_args(annotation)[0])
    if origin is Literal:
        names = [f"`{json.dumps(value) if not isinstance(value, str) else value}`" for value in get_args(annotation)]
        return names[0] if len(names) == 1 else f"one of {', '.join(names)}"
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(arg) for arg in get_args(annotation))
    if origin is list:
        return f"list of {type_text(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return "mapping" if value is Any else f"mapping of {type_text(key)} to {type_text(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"mapping ([{_title_of(annotation)}](#{anchor(_title_of(annotation))}))"
    simple = {bool: "`true` or `false`", int: "integer", float: "number", str: "text"}
    if annotation in simple:
        return simple[annotation]
    return str(annotation)


def _title_of(model: type[BaseModel]) -> str:
    return next(place.title for place in PLACES if place.model is model)


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def default_text(model: type[BaseModel], name: str) -> str:
    info = model.model_fields[name]
    if info.is_required():
        return "required"
    value = default_of(model, name)
    if value is None or value == [] and info.default_factory is not None or value == {}:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, BaseModel):
        return "—"
    if isinstance(value, list):
        return "`[" + ", ".join(str(item) for item in value) + "]`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(place: Place) -> Iterator[str]:
    yield f"## {place.title}"
    yield ""
    yield " ".join((place.model.__doc__ or "").split())
    yield ""
    yield "| key | type | default | meaning |"
    yield "| --- | --- | --- | --- |"
    for name in place.keys:
        info = place.model.model_fields[name]
        annotation = typing.get_type_hints(place.model, include_extras=True)[name]  # aliases' `Shown` kept
        if not info.description:
            raise ValueError(f"{place.model.__name__}.{name} has no description in schema.py: say what it means "
                             "with Field(description=...) or setting(default, description)")
        yield (f"| <a id=\"{anchor(place.title)}-{name}\"></a>`{name}` | {_cell(type_text(annotation))} | "
               f"{_cell(default_text(place.model, name))} | {_cell(info.description)} |")
    yield ""


def _index() -> Iterator[str]:
    where: dict[str, list[tuple[Place, str]]] = {}
    for place in PLACES:
        for name in place.keys:
            where.setdefault(name, []).append((place, name))
    yield "## Every key"
    yield ""
    yield "| key | set in |"
    yield "| --- | --- |"
    for name in sorted(where):
        places = ", ".join(f"[{place.where}](#{anchor(place.title)}-{key})" for place, key in where[name])
        yield f"| `{name}` | {places} |"
    yield ""


def render() -> str:
    """docs/rules.md, as it should be."""
    lines = [INTRO.rstrip("\n"), "", *_index()]
    for place in PLACES:
        lines += list(_section(place))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    """`reference.py PATH` writes the reference to PATH; `--check PATH` only says whether it is current."""
    check = argv[:1] == ["--check"]
    path = Path(argv[-1])
    wanted = render()
    if check:
        if path.is_file() and path.read_text() == wanted:
            return 0
        print(f"{path} is not what the schema makes: run scripts/rules-reference and commit the result",
              file=sys.stderr)
        return 1
    path.write_text(wanted)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
