"""The topology core is pure: its modules import only the standard library, provisioner.errors
and each other (DESIGN §3; import-linter checks the I/O frameworks, this checks the rest)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import provisioner.topology

PACKAGE = Path(provisioner.topology.__file__).parent
ALLOWED = {"provisioner.errors", "provisioner.topology"}
BLOCKING = {"asyncio", "socket", "subprocess", "threading", "urllib", "http"}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_topology_modules_are_pure() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            if name == "__future__" or top in sys.stdlib_module_names and top != "provisioner":
                assert top not in BLOCKING, f"{path.name} imports {name}"
                continue
            assert any(name == a or name.startswith(a + ".") for a in ALLOWED), \
                f"{path.name} imports {name}"
