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


# Inside the three largest packages, the same rule one level down: each subpackage (or the package's
# own modules, "") may import only the ones listed for it, so the folders are layers too. What each
# holds and why it sits where it does: its ``__init__`` docstring and docs/architecture.md's map.
INNER: dict[str, dict[str, set[str]]] = {
    "runtime": {
        "storage": set(),                                    # the leaf: object stores and their retries
        "": {"storage"},                                     # the contract: api, config, llama_config
        "checkpoint": {"storage"},
        "models": {""},
        "data": {"", "storage"},
        "weights": {"", "storage", "checkpoint", "data", "models"},  # the Hugging Face layout, in and out
        "training": {"", "storage", "checkpoint", "data", "models", "weights"},
        "node": {"", "storage", "checkpoint", "data", "models", "weights", "training"},   # beside training
    },
    "engine": {
        "": set(),
        "state": set(),                                      # the database and what it keeps
        "plan": {"state"},
        "display": {"state", "plan"},
        "run": {"state", "plan", "display"},
        "work": {"state", "plan", "display", "run"},         # the service's jobs, schedules, budgets
    },
    "provisioner": {
        "boot": set(),                                       # what a node runs at boot: no cloud
        "": {"boot"},                                        # what every cloud shares
        "clouds": {"", "boot"},
        "clouds.aws": {"", "boot"},
        "clouds.gcp": {"", "boot"},
        "clouds.azure": {"", "boot"},
        "clouds.local": {"", "boot"},
        "clouds.slurm": {"", "boot", "clouds.local"},        # the local cloud's process marker
    },
    "policies": {
        "": set(),
        "rules": {""},
        "sim": {"", "rules"},
    },
    "commands": {
        "": set(),
        "money": {""},
        "run": {"", "money"},                                # status --plot checks its path as estimate does
    },
}


def _inner(owner: str, parts: list[str]) -> str:
    """The layer of ``spotwise.<owner>.<parts...>`` within ``owner``: its subpackage (two levels for
    a cloud: ``clouds.aws``), or "" for the package's own modules."""
    pkg = SRC / owner
    if not parts or not (pkg / parts[0]).is_dir():
        return ""
    if parts[0] == "clouds" and len(parts) > 1 and (pkg / "clouds" / parts[1]).is_dir():
        return f"clouds.{parts[1]}"
    return parts[0]


def _targets(path: Path) -> set[str]:
    """Every ``spotwise.…`` module path a file imports (``from spotwise.x import y`` as ``x.y``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("spotwise"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("spotwise.")}
    return found


def test_inside_each_large_package_the_subpackages_are_layers():
    bad = []
    for owner, allowed in INNER.items():
        for path in sorted((SRC / owner).rglob("*.py")):
            rel = path.relative_to(SRC / owner).with_suffix("").parts
            me = _inner(owner, list(rel[:-1]))
            assert me in allowed, f"{owner}/{'/'.join(rel)}: a new subpackage; add it to INNER"
            for target in _targets(path):
                parts = target.split(".")
                if len(parts) < 2 or parts[1] != owner:
                    continue
                it = _inner(owner, parts[2:-1] if (SRC / owner / Path(*parts[2:])).with_suffix(".py").exists()
                            or not (SRC / owner / Path(*parts[2:])).exists() else parts[2:])
                if it != me and it not in allowed[me]:
                    bad.append(f"{owner}/{'/'.join(rel)}.py imports {target} ({it or owner + '/'} from {me or owner + '/'})")
    assert not bad, "imports up a package's layers:\n" + "\n".join(sorted(bad))
