"""House rules for ``provisioner/`` that import-linter does not check: small modules, no
import cycles.

Size: no module over ``MAX_LINES`` lines (STYLE: small modules with one job).

Cycles: the modules of ``provisioner/`` must not import each other in a circle. The graph
is what runs when a module is imported:

* module-level imports only, including those under ``try``/``if``/``with`` and in class
  bodies; an import inside a function runs when it is called, not on import, and an
  import under ``if TYPE_CHECKING:`` never runs (its ``else:`` branch does);
* ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``;
  relative imports are resolved against the importing module;
* importing ``a.b.c`` first runs the ``__init__`` of ``a`` and ``a.b``: an edge to each
  such package, except the packages that enclose the importer itself. Those are already
  being imported when the importer runs, so reaching them again is not a cycle by itself;
  it becomes one only when the importer takes a name from the package (``from a import
  X``, an edge to ``a`` by the rule above), which is exactly the case that fails at run
  time with a partially initialised module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import provisioner

ROOT = Path(provisioner.__file__).parent
MAX_LINES = 450
Graph = Mapping[str, frozenset[str]]


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path
    is_package: bool


def modules(root: Path) -> dict[str, Module]:
    """Every module under the package directory ``root``, by dotted name."""
    found: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module runs (see the module docstring)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _import_nodes(node.body)
            yield from _import_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _import_nodes(node.body)
            for handler in node.handlers:
                yield from _import_nodes(handler.body)
            yield from _import_nodes(node.orelse)
            yield from _import_nodes(node.finalbody)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _import_nodes(node.body)


def _targets(module: Module, node: ast.Import | ast.ImportFrom,
             known: Mapping[str, Module]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        base = module.name.split(".")
        if not module.is_package:
            base.pop()
        base = base[:len(base) - (node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    return {f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
            for alias in node.names}


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def import_graph(root: Path) -> Graph:
    """``{module: modules of the package its import runs}`` (rules: module docstring)."""
    known = modules(root)
    graph: dict[str, frozenset[str]] = {}
    for module in known.values():
        edges: set[str] = set()
        for node in _import_nodes(ast.parse(module.path.read_text()).body):
            for target in _targets(module, node, known):
                if target not in known:
                    continue  # outside the package
                edges.add(target)
                enclosing = _ancestors(module.name) | {module.name}
                edges |= {p for p in _ancestors(target) - enclosing if p in known}
        graph[module.name] = frozenset(edges - {module.name})
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle (``[a, b, …, a]``) per strongly connected component of more than one
    module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest way from the component's first module back to itself (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:  # v, came_from[v], …, start: reversed, then back to start
                    back = [v]
                    while back[-1] != start:
                        back.append(came_from[back[-1]])
                    return [*reversed(back), start]
                if w not in came_from:
                    came_from[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def _sizes() -> list[object]:
    return [pytest.param(path, id=path.relative_to(ROOT).as_posix())
            for path in sorted(ROOT.rglob("*.py"))]


@pytest.mark.parametrize("path", _sizes())
def test_module_is_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, (f"provisioner/{path.relative_to(ROOT)} has {lines} lines "
                                f"(at most {MAX_LINES}): split it by job")


def test_provisioner_has_no_import_cycle() -> None:
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def _package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import x\n",
        "b.py": "from . import c\nx = 1\n",
        "c.py": "import pkg.a\n",
    })
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_imports_that_do_not_run_on_import_make_no_cycle(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": ("from typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from pkg.a import A\n"
                 "def late() -> None:\n    from pkg import a\n"),
    })
    assert import_graph(root)["pkg.b"] == frozenset()
    assert cycles(import_graph(root)) == []


def test_a_package_init_counts_only_when_it_is_really_reentered(tmp_path: Path) -> None:
    """``sub/__init__`` re-exports ``sub.x``; ``sub.x`` imports its sibling ``sub.y``: no
    cycle (``sub`` encloses ``x``). ``sub.y`` taking a name from ``sub`` itself is one."""
    files = {"__init__.py": "", "sub/__init__.py": "from pkg.sub.x import X\n",
             "sub/x.py": "from pkg.sub.y import Y\nX = Y\n", "sub/y.py": "Y = 1\n",
             "user.py": "from pkg.sub.y import Y\n"}
    root = _package(tmp_path, files)
    assert import_graph(root)["pkg.user"] == {"pkg.sub", "pkg.sub.y"}
    assert cycles(import_graph(root)) == []
    (root / "sub/y.py").write_text("from pkg.sub import X\nY = 1\n")
    assert cycles(import_graph(root)) == [["pkg.sub", "pkg.sub.x", "pkg.sub.y", "pkg.sub"]]
