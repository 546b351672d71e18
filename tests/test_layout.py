"""The layout docs/architecture.md promises ("The parts"): no import circle between
the addon's modules (type-only imports count too), no module past about 400
lines, and no module importing another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "addon" / "switchyard_core"
LONGEST = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], list[str]]:
    """The addon modules `name` imports (wherever in it: type-only too), and the private names it takes."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    private: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if not target.startswith("switchyard_core"):
            continue
        for alias in node.names:
            full = f"{target}.{alias.name}"
            deps.add(full if full in modules else target)
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                private.append(f"{name} imports {alias.name} from {target}")
    return {dep for dep in deps if dep in modules and dep != name}, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for dep in graph[module]:
            if dep not in index:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in on_stack:
                low[module] = min(low[module], index[dep])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_import_circles_and_no_private_names_taken() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    taken: list[str] = []
    for name, path in modules.items():
        graph[name], private = _imports(name, path, modules)
        taken += private
    assert _cycles(graph) == []
    assert taken == []


def test_no_module_past_about_four_hundred_lines() -> None:
    long = {str(path.relative_to(PACKAGE)): lines for path in PACKAGE.rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > LONGEST}
    assert long == {}
