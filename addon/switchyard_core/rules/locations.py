"""Where things are in `rules.yaml`, and its problems told by file, line and field.

YAML is composed into nodes first so that every key keeps its line; once
pydantic has validated the plain data, a validation error's location is mapped
back to the deepest node that exists.
"""

from __future__ import annotations

from difflib import get_close_matches
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from .schema import RulesFile


class RulesError(Exception):
    """A rules file that cannot be used; the message names file, line and field."""


# What a rules file may make the proxy read: it is read in the proxy's own event loop, at
# start-up and on every edit.  A 500-byte file of nested aliases ("billion laughs") expands
# to billions of nodes; a deeply nested one overflows Python's stack.
RULES_SIZE_LIMIT = 1024 * 1024
ALIAS_LIMIT = 100
DEPTH_LIMIT = 50
EXPANDED_NODE_LIMIT = 100_000  # nodes, counting each alias as all it stands for


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing within the bounds above."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # a composed node's size as expanded, by id

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            self._aliases += 1
            if self._aliases > ALIAS_LIMIT:
                raise yaml.composer.ComposerError(None, None, f"more than {ALIAS_LIMIT} aliases (`*name`)", mark)
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise yaml.composer.ComposerError(None, None, "an alias inside the node it names", mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > DEPTH_LIMIT:
            raise yaml.composer.ComposerError(None, None, f"nested more than {DEPTH_LIMIT} levels deep", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:
            return None
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self._sizes.get(id(item), 1) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(self._sizes.get(id(key), 1) + self._sizes.get(id(value), 1) for key, value in node.value)
        if size > EXPANDED_NODE_LIMIT:
            raise yaml.composer.ComposerError(None, None, f"more than {EXPANDED_NODE_LIMIT:,} values once its "
                                              "aliases are expanded", mark)
        self._sizes[id(node)] = size
        return node


class _BadKey(Exception):
    def __init__(self, loc: tuple[Any, ...], line: int, message: str) -> None:
        self.loc, self.line, self.message = loc, line, message


def _record_lines(node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> None:
    """Map each key path (as pydantic reports locations) to its line in the file.

    A key given twice in one mapping is an error: YAML loaders keep the last one
    silently, and a setting the user wrote would be ignored without a word."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):  # YAML's `? [a, b]`: no field is named so
                raise _BadKey(path, key_node.start_mark.line + 1, "a key must be a plain name, not a list or mapping")
            key = path + (key_node.value,)
            if key_node.value in seen:
                raise _BadKey(key, key_node.start_mark.line + 1, f"given twice (the first is line {lines.get(key, '?')})")
            seen.add(key_node.value)
            lines[key] = key_node.start_mark.line + 1
            _record_lines(value_node, key, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, path + (index,), lines)


def _field_name(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def line_of(loc: tuple[Any, ...], lines: dict[tuple[Any, ...], int]) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def field_problem(path: Path, lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...], message: str) -> str:
    """One problem as the user reads it: file, line, field, what is wrong."""
    return f"{path}:{line_of(loc, lines)}: {_field_name(loc)}: {message}"


def compose_with_lines(path: Path, text: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    if len(text) > RULES_SIZE_LIMIT:
        raise RulesError(f"{path}: the file is over {RULES_SIZE_LIMIT // 1024} KiB; rules are never that long")
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        where = ""
        if exc.context and exc.context_mark is not None and exc.context_mark.line + 1 != line:
            # an unclosed `{` or quote is found only on a later line: say where it opened
            where = f" ({exc.context} that starts on line {exc.context_mark.line + 1})"
        raise RulesError(f"{path}:{line}: invalid YAML: {exc.problem or exc}{where}") from None
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    if root is None:
        raise RulesError(f"{path}:1: the file is empty; it needs at least `version: 1`")
    lines: dict[tuple[Any, ...], int] = {}
    try:
        _record_lines(root, (), lines)
    except _BadKey as bad:
        raise RulesError(f"{path}:{bad.line}: {_field_name(bad.loc)}: {bad.message}") from None
    try:
        data = yaml.SafeLoader("").construct_document(root)
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: invalid YAML: {exc}") from None
    return data, lines


def validation_problems(path: Path, exc: ValidationError, lines: dict[tuple[Any, ...], int]) -> str:
    """Every problem pydantic found, one line each in file order: fixing a file
    one restart per mistake wastes a user's time."""
    found: list[tuple[int, str]] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "not a known key here"
            close = get_close_matches(str(loc[-1]), _keys_beside(loc), n=1, cutoff=0.6)
            if close:
                message += f" (did you mean {close[0]}?)"
        elif error["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        found.append((line_of(loc, lines), field_problem(path, lines, loc, message)))
    return "\n".join(text for _, text in sorted(found, key=lambda item: item[0]))


def _keys_beside(loc: tuple[Any, ...]) -> list[str]:
    """The keys a file may have where `loc`'s last key is (for a did-you-mean)."""
    model: type[BaseModel] | None = RulesFile
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an item of a list: its model was taken with the list's key
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
