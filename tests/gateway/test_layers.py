"""The gateway's modules are grouped by layer, each importing only from its own layer or below:
transport (sockets, HTTP) < policy (pure decisions) < mesh (what the box knows of others) < app
(dispatch, relay, views). The package root (__init__, __main__) may import anything. The gateway
runs on a box without the collection: it imports the standard library, itself and
lobes_contract, nothing else."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gateway" / "lobes_gateway"
LAYERS = ("transport", "policy", "mesh", "app")
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def _layer(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def _imported(path: Path) -> list[tuple[str, int]]:
    """(absolute module, line) of every import in a module, relative ones resolved."""
    package = ["lobes_gateway", *path.relative_to(PACKAGE).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            if node.module is None:  # from . import x: each name is a module
                found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((module, node.lineno))
    return found


def test_every_module_lives_in_a_layer():
    assert {_layer(path) for path in MODULES} == set(LAYERS)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_or_below(path):
    own = LAYERS.index(_layer(path))
    above = [f"line {line}: {module}" for module, line in _imported(path)
             if module.startswith("lobes_gateway.") and module.split(".")[1] in LAYERS
             and LAYERS.index(module.split(".")[1]) > own]
    assert above == [], f"{_layer(path)} imports from a layer above it"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_gateway_imports_only_the_standard_library_itself_and_the_contract(path):
    allowed = set(sys.stdlib_module_names) | {"__future__", "lobes_gateway", "lobes_contract"}
    foreign = [module for module, _line in _imported(path) if module.split(".")[0] not in allowed]
    assert foreign == []


def _module_name(path: Path) -> str:
    return ".".join(["lobes_gateway", *path.relative_to(PACKAGE).with_suffix("").parts])


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (type-only imports too: a circle through
    them still ties two modules into one)."""
    names = {_module_name(path) for path in MODULES}
    return {_module_name(path): {module for module, _line in _imported(path) if module in names}
            for path in MODULES}


def _circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from `start` back to itself, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        module, path = stack.pop()
        for imported in graph[module]:
            if imported == start:
                return [*path, start]
            if imported not in seen:
                seen.add(imported)
                stack.append((imported, [*path, imported]))
    return None


def test_no_two_modules_import_each_other_even_through_others():
    graph = _import_graph()
    circles = [circle for module in sorted(graph) if (circle := _circle_through(graph, module))]
    assert circles == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circle_through(graph, "a") == ["a", "b", "c", "a"]
    assert _circle_through(graph, "d") is None
