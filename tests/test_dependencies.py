"""What the code imports, a user's install has (issue 52, item 6).

``pip install -e '.[all]'`` is what a user gets: the test tools (the ``test`` extra) are not in it. A
third-party module that ``src/`` imports but that arrives only through the test tools works in CI
and fails for the user (``pathspec`` did: ``taskcode.scan_workdir`` died with
``ModuleNotFoundError`` on a task with a ``workdir``). So every third-party import of ``src/`` is
read from the source (module level and inside functions) and its distribution must be declared
directly in ``pyproject.toml`` — not merely arrive as someone else's dependency:

* an import at module level runs on every path that loads the module: core dependencies only;
* an import inside a function runs on that function's path: core or one of the product's extras
  (``aws``, ``gcp``, ``azure``, ``data``), never the ``test`` extra;
* ``spotwise.extras.require("mod", "extra", ...)`` names the extra the user is told to install, so
  ``mod`` must be declared in exactly that extra.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import spotwise

SRC = Path(spotwise.__file__).parent
PYPROJECT = SRC.parents[1] / "pyproject.toml"
TEST_EXTRAS = {"test"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    """(core distributions, extra -> distributions), extras of spotwise itself expanded."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    name = _norm(project["name"])
    extras_raw: dict[str, list[str]] = project.get("optional-dependencies", {})

    def names(reqs: list[str], seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for req in reqs:
            m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[([^\]]*)\])?", req)
            assert m, req
            dist, extras = _norm(m.group(1)), m.group(2)
            if dist == name:
                for extra in (e.strip() for e in (extras or "").split(",") if e.strip()):
                    if extra not in seen:
                        out |= names(extras_raw[extra], seen | {extra})
            else:
                out.add(dist)
        return out

    return names(project["dependencies"]), {e: names(r, frozenset({e})) for e, r in extras_raw.items()}


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(dotted module, at module level?, line) for each non-stdlib, non-spotwise import of a file."""
    out: list[tuple[str, bool, int]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            mods: list[str] = []
            if isinstance(child, ast.Import):
                mods = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                mods = [child.module]
            for mod in mods:
                top = mod.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("spotwise", "__future__"):
                    out.append((mod, not in_function, child.lineno))
            walk(child, nested)

    walk(ast.parse(path.read_text()), False)
    return out


@cache
def _providers() -> dict[str, list[str]]:
    return dict(md.packages_distributions())


@cache
def _distributions(module: str) -> set[str]:
    """The installed distributions that provide ``module`` (a namespace package such as ``google``
    has several: the one whose files hold ``module``'s own folder is chosen)."""
    top = module.split(".")[0]
    candidates = _providers().get(top, [])
    if len(candidates) <= 1:
        return {_norm(d) for d in candidates}
    rel = module.replace(".", "/")
    exact = {_norm(d) for d in candidates
             if any(str(f).startswith(rel + "/") or str(f) == rel + ".py" for f in (md.files(d) or []))}
    return exact or {_norm(d) for d in candidates}


def _requires() -> list[tuple[str, str, str]]:
    """``require("mod", "extra", ...)`` calls: (file:line, module, extra)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"
                    and len(node.args) >= 2 and all(isinstance(a, ast.Constant) for a in node.args[:2])):
                out.append((f"{path.relative_to(SRC.parent)}:{node.lineno}", node.args[0].value, node.args[1].value))
    return out


def test_every_third_party_import_is_declared_for_its_code_path():
    core, extras = _declared()
    product = core.union(*(d for e, d in extras.items() if e not in TEST_EXTRAS))
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        for module, module_level, line in _imports(path):
            dists = _distributions(module)
            where = f"{path.relative_to(SRC.parent)}:{line} imports {module}"
            if not dists:
                bad.append(f"{where}: no installed distribution provides it")
            elif module_level and not dists & core:
                bad.append(f"{where} at module level: {sorted(dists)} not in the core dependencies")
            elif not dists & product:
                bad.append(f"{where}: {sorted(dists)} declared in no extra a user installs")
    assert not bad, "imports pyproject.toml does not declare for their path:\n" + "\n".join(bad)


def test_each_required_extra_declares_the_module_it_names():
    _, extras = _declared()
    bad = [f"{where}: require({module!r}, {extra!r}) but [{extra}] declares none of {sorted(_distributions(module))}"
           for where, module, extra in _requires()
           if extra not in extras or not _distributions(module) & extras[extra]]
    assert _requires(), "no require() call found: the test reads the wrong tree"
    assert not bad, "\n".join(bad)
