"""The import graph between spotwise's packages is the one docs/architecture.md draws.

Each package may import only the packages listed for it (``ALLOWED``); the test reads every ``import``
of every module under ``src/spotwise`` (deferred imports inside functions included), so a shortcut
across layers fails here rather than in a review. Change ``ALLOWED`` and the doc's table together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import spotwise

SRC = Path(spotwise.__file__).parent

# Leaves every package may use: errors, paths, output formatting (and a run's curves drawn), the
# registry, the extras gate, the running build's id and wheel (spotwise.build) and the small shared
# utilities.
BASE = {"errors", "paths", "output", "curveplot", "registry", "extras", "utils", "build", "config", "__version__"}

ALLOWED: dict[str, set[str]] = {
    "pricing": set(),
    "policies": set(),
    "runtime": set(),
    "provisioner": {"pricing", "runtime"},   # runtime: the node-side contract (watcher, dead man's switch)
    "train": {"runtime"},                    # the public name of what user code imports (TrainSpec)
    "taskcode": {"runtime"},                 # the task's own code: workdir, pip, env, entrypoint checks
    "taskspec": {"pricing", "policies", "provisioner", "runtime", "taskcode"},
    "engine": {"pricing", "policies", "provisioner", "runtime", "taskspec", "taskcode"},
    "service": {"pricing", "policies", "provisioner", "runtime", "taskspec", "taskcode", "engine"},
    "commands": {"pricing", "policies", "provisioner", "runtime", "taskspec", "taskcode", "engine", "service"},
    "cli": {"commands"},
}


def _part(module: str) -> str:
    """``spotwise.engine.state.db`` → ``engine``; ``spotwise.taskspec`` → ``taskspec``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "spotwise":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("spotwise."):
                found.add(_part(node.module))
        elif isinstance(node, ast.Import):
            found |= {_part(a.name) for a in node.names if a.name.startswith("spotwise.")}
    return found


def test_every_package_imports_only_what_its_layer_allows():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        owner = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if owner not in ALLOWED:
            assert owner in BASE | {"__init__", "__main__"}, f"{rel}: a new top-level part; add it to ALLOWED"
            continue
        for target in _imports(path) - {owner} - BASE:
            if target not in ALLOWED[owner]:
                bad.append(f"{rel} imports spotwise.{target}")
    assert not bad, "imports across layers that docs/architecture.md does not allow:\n" + "\n".join(bad)


def test_the_base_modules_import_nothing_but_errors():
    for name in ("errors", "registry", "extras"):
        assert _imports(SRC / f"{name}.py") <= {"errors"}, name
