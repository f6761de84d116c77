"""No import circles between spotwise's modules.

``tests/test_layers.py`` checks which *packages* may import which; this checks the *modules*: the
graph of every module under ``src/spotwise`` and the spotwise modules it imports has no cycle. A
circle (``a`` imports ``b``, ``b`` imports ``a``) means neither module can be read, tested or
changed alone, and only works while the import order happens to let it.

How the graph is built (from the source, with :mod:`ast`; nothing is imported):

* every ``import`` and ``from ... import`` in a module counts: at module level, inside functions
  and classes, and **also inside** ``if TYPE_CHECKING:`` **blocks** — a circle that only the type
  checker sees is still a circle of design (the fix is a leaf module or a small ``Protocol``, as
  ``runtime/training/spec.py`` and ``provisioner/clouds/local/market.MarketHost`` are);
* relative imports are resolved against the importing module's package;
* ``from pkg import name`` is an edge to the module ``pkg.name`` when there is one, else to ``pkg``;
* the parent packages Python initialises before a submodule are not edges: a package whose
  ``__init__`` re-exports its submodules is not a circle with them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import spotwise

SRC = Path(spotwise.__file__).parent


def modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def imports_of(name: str, path: Path, is_pkg: bool, known: set[str]) -> set[str]:
    """The spotwise modules that module ``name`` imports, anywhere in its file."""
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                found.add(sub if sub in known else mod)
    return {m for m in found if m in known and m != name}


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    mods = modules(src)
    known = set(mods)
    return {name: imports_of(name, path, is_pkg, known) for name, (path, is_pkg) in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a module importing
    itself), each as the path ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:             # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_a_cycle(graph, comp) for comp in components]


def _a_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first, inside it)."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(comp)}")


def test_the_module_import_graph_has_no_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles between spotwise modules:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The checker itself: relative, deferred and TYPE_CHECKING imports are edges; a package's
    re-export of its submodule is not a circle; a circle is named."""
    pkg = tmp_path / "spotwise"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from spotwise import a\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import X\n")
    (pkg / "c.py").write_text("import spotwise.a\nX = 1\n")
    graph = import_graph(pkg)
    assert graph["spotwise"] == {"spotwise.a"}
    assert graph["spotwise.a"] == {"spotwise.sub.b"}
    assert graph["spotwise.sub.b"] == {"spotwise.c"}
    assert graph["spotwise.c"] == {"spotwise.a"}
    assert find_cycles(graph) == [["spotwise.a", "spotwise.sub.b", "spotwise.c", "spotwise.a"]]
    (pkg / "c.py").write_text("X = 1\n")
    assert find_cycles(import_graph(pkg)) == []
