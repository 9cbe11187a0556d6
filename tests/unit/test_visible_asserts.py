"""Every test shows what it asserts in its own body (issue 17): a test that checks only
through a helper whose name does not say it asserts reads as if it checked nothing.

The rule, read on the source (ast) of every ``test_*`` function under tests/, sync or
async, hypothesis ``@given`` ones included: its body, nested functions included (a
hypothesis ``run`` defined in the test is part of what the reader sees), holds at least one

- an ``assert`` statement;
- a ``pytest.raises``, ``pytest.warns`` (context or call) or ``pytest.fail`` call;
- a call to a function or method whose name starts with ``assert_`` (a helper that asserts
  and says so: ``assert_no_5xx(...)``, ``mock.assert_called_once_with(...)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
PYTEST_CHECKS = frozenset({"raises", "warns", "fail"})

Test = ast.FunctionDef | ast.AsyncFunctionDef


def _is_check(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id.startswith("assert_")
    if isinstance(func, ast.Attribute):
        on_pytest = isinstance(func.value, ast.Name) and func.value.id == "pytest"
        return func.attr.startswith("assert_") or (on_pytest and func.attr in PYTEST_CHECKS)
    return False


def asserts_visibly(test: Test) -> bool:
    return any(isinstance(node, ast.Assert) or (isinstance(node, ast.Call) and _is_check(node))
               for statement in test.body for node in ast.walk(statement))


def _test_functions(source: str) -> Iterator[Test]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                and node.name.startswith("test_"):
            yield node


def unasserted(source: str) -> list[str]:
    return [f"{test.lineno}: {test.name}" for test in _test_functions(source)
            if not asserts_visibly(test)]


@pytest.mark.parametrize(("source", "flagged"), [
    ("def test_a():\n    assert f() == 1\n", []),
    ("async def test_a():\n    with pytest.raises(ValueError):\n        await f()\n", []),
    ("def test_a():\n    pytest.warns(UserWarning, f)\n", []),
    ("def test_a():\n    if f():\n        pytest.fail('f')\n", []),
    ("def test_a(api):\n    assert_no_5xx(api.call())\n", []),
    ("def test_a(mock):\n    mock.assert_called_once_with(1)\n", []),
    ("def test_a():\n    @given(st.text())\n    def run(s):\n        assert_total(s)\n"
     "    run()\n", []),
    ("def test_a():\n    f()\n", ["1: test_a"]),
    ("@given(st.binary())\ndef test_a(raw):\n    _decode(raw)\n", ["2: test_a"]),
    ("async def test_a(srv):\n    async with asyncio.timeout(1):\n        await srv.stop()\n",
     ["1: test_a"]),
    ("def test_a():\n    check(f())\n", ["1: test_a"]),
    ("def test_a():\n    raises(ValueError)\n", ["1: test_a"]),
    ("class TestA:\n    def test_b(self):\n        self.f()\n", ["2: test_b"]),
    ("def helper():\n    f()\n", []),
], ids=["assert", "raises", "warns", "fail", "helper", "mock", "nested", "none", "given",
        "timeout", "unnamed-helper", "bare-raises", "method", "not-a-test"])
def test_the_rule(source: str, flagged: list[str]) -> None:
    assert unasserted(source) == flagged


def test_every_test_asserts_in_its_own_body() -> None:
    offenders = [f"{path.relative_to(TESTS.parent)}:{where}"
                 for path in sorted(TESTS.rglob("*.py"))
                 for where in unasserted(path.read_text(encoding="utf-8"))]
    assert offenders == [], "tests with no visible assertion:\n" + "\n".join(offenders)
