"""The suite's own collection rule (tests/conftest.py): the slow phase imports only the modules
that can hold a slow test, and every slow test is still among them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def pytest_ignore_collect(pytestconfig):
    """The hook of tests/conftest.py, as pytest registered it (``import conftest`` would name
    whichever of the tree's conftest modules was imported last)."""
    return pytestconfig.pluginmanager.get_plugin(str(TESTS / "conftest.py")).pytest_ignore_collect


class _Config:
    def __init__(self, markexpr: str) -> None:
        self.markexpr = markexpr

    def getoption(self, name: str, default=None):
        return self.markexpr if name == "markexpr" else default


def test_the_slow_phase_skips_only_modules_without_the_slow_mark(tmp_path, pytest_ignore_collect):
    marked, plain = tmp_path / "test_a.py", tmp_path / "test_b.py"
    marked.write_text("import pytest\npytestmark = pytest.mark.slow\n")
    plain.write_text("def test_x():\n    pass\n")
    slow = _Config("slow")
    assert pytest_ignore_collect(marked, slow) is False
    assert pytest_ignore_collect(plain, slow) is True
    assert pytest_ignore_collect(tmp_path / "helpers.py", slow) is None       # not a test module
    assert pytest_ignore_collect(tmp_path, slow) is None                      # directories: collected
    for other in ("not slow", "", "slow or not slow"):
        assert pytest_ignore_collect(plain, _Config(other)) is None


def test_no_conftest_or_helper_gives_a_test_the_slow_mark():
    """The rule holds only while the mark is written in the test's own file: nothing else in the
    tree applies it (an ``add_marker`` or a shared ``pytestmark`` imported from elsewhere)."""
    def applies_slow(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "slow":          # pytest.mark.slow
            return isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_marker")                          # item.add_marker(...)

    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_"):
            continue
        assert not any(applies_slow(n) for n in ast.walk(ast.parse(path.read_text()))), path
