"""provisioner/cli is a tree: ``entry`` imports the command groups, the groups import ``client``
and ``formatting``, nothing imports back (lazy imports inside functions count too), and no
module takes a private name (``_x``) from another provisioner module, by ``from m import _x``
or by ``m._x``. Read from the source with ast: nothing is imported or run."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import provisioner
import provisioner.cli

SOURCE_ROOT = Path(provisioner.__file__).parent.parent
CLI = Path(provisioner.cli.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = SOURCE_ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def parse(path: Path) -> tuple[ast.Module, str]:
    """The file's syntax tree, and the package its relative imports start from."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return ast.parse(path.read_text(encoding="utf-8"), str(path)), package


def imports(tree: ast.Module, package: str) -> Iterator[tuple[str, ast.alias, int]]:
    """``(module, alias, line)`` for every import, at any depth: ``alias.name`` is the module
    itself for ``import m``, the imported name for ``from m import name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield "", alias, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                yield base, alias, node.lineno


def targets(tree: ast.Module, package: str) -> set[str]:
    """The provisioner modules imported: ``from p import m`` is ``p.m`` when that is a module,
    else ``p`` (the package's ``__init__``)."""
    found = set()
    for module, alias, _ in imports(tree, package):
        name = f"{module}.{alias.name}" if module else alias.name
        if is_module(name):
            found.add(name)
        elif module.split(".")[0] == "provisioner":
            found.add(module)
    return found


def private_uses(tree: ast.Module, package: str) -> list[str]:
    """Private names taken from provisioner modules, as ``line: code``."""
    found: list[str] = []
    bound: set[str] = set()  # local names that hold a provisioner module
    for module, alias, line in imports(tree, package):
        name = f"{module}.{alias.name}" if module else alias.name
        if name.split(".")[0] != "provisioner":
            continue
        if any(is_private(part) for part in name.split(".")):
            found.append(f"{line}: {name}")
        if is_module(name):
            bound.add(alias.asname or (alias.name if module else name.split(".")[0]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda entry: (int(entry.split(":")[0]), entry))


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle in ``graph`` as the modules around it, or [] when there is none."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def cli_files() -> list[Path]:
    return sorted(CLI.glob("*.py"))


def cli_graph() -> dict[str, set[str]]:
    names = {module_name(path) for path in cli_files()}
    return {module_name(path): targets(*parse(path)) & names for path in cli_files()}


def test_no_module_takes_a_private_name_from_another() -> None:
    for path in cli_files():
        assert private_uses(*parse(path)) == [], f"{path.name} uses private names"


def test_the_cli_modules_form_no_cycle() -> None:
    graph = cli_graph()
    assert "provisioner.cli.entry" in graph and len(graph) > 5
    assert cycle(graph) == [], " -> ".join(cycle(graph))


def test_entry_imports_the_groups_and_the_groups_only_the_shared_modules() -> None:
    graph = cli_graph()
    shared = {"provisioner.cli.client", "provisioner.cli.formatting"}
    groups = set(graph) - shared - {"provisioner.cli", "provisioner.cli.entry"}
    assert graph["provisioner.cli"] == {"provisioner.cli.entry"}
    assert groups <= graph["provisioner.cli.entry"]
    for group in sorted(groups):
        assert graph[group] <= shared, f"{group} imports {graph[group] - shared}"
    assert graph["provisioner.cli.client"] == graph["provisioner.cli.formatting"] == set()


def test_the_checks_catch_the_old_circle_and_private_names() -> None:
    """What provisioner/cli_power.py did before the CLI became a package, and a few more."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    old = ast.parse("from provisioner import cli, errors\n"
                    "from provisioner.cli.client import _query, api_client\n"
                    "from . import formatting as f\n"
                    "def run(self: object) -> None:\n"
                    "    import provisioner.cli.client\n"
                    "    import provisioner.cli.client as c\n"
                    "    cli._node_path('x'), c._api_error, f._one_line, self._token\n"
                    "    provisioner.cli.client._reason, errors.__name__\n")
    assert private_uses(old, "provisioner.cli") == [
        "2: provisioner.cli.client._query", "7: c._api_error", "7: cli._node_path",
        "7: f._one_line", "8: provisioner.cli.client._reason"]
    assert targets(old, "provisioner.cli") == {
        "provisioner.cli", "provisioner.errors", "provisioner.cli.client",
        "provisioner.cli.formatting"}
