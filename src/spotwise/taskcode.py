"""The task's own code: its ``workdir``, ``pip`` requirements and ``env``, checked before anything
launches and turned into the Ray runtime environment the job is submitted with.

Everything here runs on the machine that launches, *without importing the user's code*: its
requirements may not be installed here, and a launch must not run code it was only asked to
ship. So the entrypoint is checked by reading the source (:mod:`ast`): the module must exist in the
workdir, every Python file of its package must parse (a syntax error is reported as
``file:line``), and the function must be defined at the module's top level. Each problem is a
:class:`~spotwise.errors.Problem` naming the task-file field, and all of a file's problems are
reported at once (exit 2), as for every other field.

What ships is the workdir minus what its root ``.gitignore`` and ``.spotwiseignore`` exclude (and
``.git/``): :func:`scan_workdir` lists those files, their total size (refused over
:data:`WORKDIR_MAX_BYTES`, naming the largest paths) and a content hash (shown by ``launch
--dry-run``). On the local cloud the directory itself is handed to Ray's Jobs API, which zips and
uploads it (honouring ``.gitignore``; ``.spotwiseignore``'s patterns go along as Ray's
``excludes``). A workdir may also be the storage URI of a zip (``s3://bucket/code.zip``, what the
service takes): Ray fetches it on each node, and the function is checked by the head's preflight.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotwise.errors import Problem

#: the most a workdir may ship (after ignore files): Ray's own upload limit is larger, but a
#: workdir is code, and data belongs in storage the job reads
WORKDIR_MAX_BYTES = 100 << 20
#: what the cluster brings and user code must neither replace (pip) nor shadow (workdir)
CLUSTER_PACKAGES = ("spotwise", "ray", "torch")
IGNORE_FILES = (".gitignore", ".spotwiseignore")
PIN_ALLOWED = ("ray, torch and spotwise come with the cluster (the launch ships this spotwise with its own "
               "ray and torch); a pin would replace them on the nodes: remove it")


@dataclass(frozen=True, slots=True)
class Workdir:
    """What a workdir ships: ``files`` as ``(relative posix path, bytes)``, sorted."""

    path: Path
    files: tuple[tuple[str, int], ...]
    excludes: tuple[str, ...] = ()            # .spotwiseignore's patterns (Ray's ``excludes``)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", sum(n for _, n in self.files))

    def largest(self, n: int = 5) -> list[tuple[str, int]]:
        return sorted(self.files, key=lambda f: (-f[1], f[0]))[:n]

    def sha256(self) -> str:
        """Content address: every shipped file's path, size and bytes, in path order."""
        h = hashlib.sha256()
        for rel, size in self.files:
            h.update(f"{rel}\0{size}\0".encode())
            with open(self.path / rel, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()


def _patterns(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [ln for ln in (x.strip() for x in lines) if ln and not ln.startswith("#")]


def scan_workdir(path: Path) -> Workdir:
    """The files ``path`` ships (see the module docstring). Symlinks are followed as Ray does."""
    import pathspec

    excludes = _patterns(path / ".spotwiseignore")
    spec = pathspec.GitIgnoreSpec.from_lines([*_patterns(path / ".gitignore"), *excludes, ".git/"])
    files: list[tuple[str, int]] = []
    for root, dirs, names in os.walk(path):
        rel_root = Path(root).relative_to(path)
        dirs[:] = sorted(d for d in dirs if not spec.match_file(f"{(rel_root / d).as_posix()}/"))
        for name in sorted(names):
            rel = (rel_root / name).as_posix()
            if spec.match_file(rel):
                continue
            try:
                files.append((rel, (Path(root) / name).stat().st_size))
            except OSError:          # a dangling link: Ray would fail on it too
                files.append((rel, 0))
    return Workdir(path=path, files=tuple(sorted(files)), excludes=tuple(excludes))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_workdir(wd: Workdir, given: str, *, max_bytes: int = WORKDIR_MAX_BYTES) -> list[Problem]:
    out = []
    if wd.nbytes > max_bytes:
        big = ", ".join(f"{rel} ({_mib(n)})" for rel, n in wd.largest())
        out.append(Problem("workdir", given, f"at most {_mib(max_bytes)} of files to ship; it holds {_mib(wd.nbytes)} "
                                             f"after .gitignore and .spotwiseignore. Largest: {big}. Add what the "
                                             "job does not import to .spotwiseignore (data belongs in storage)"))
    tops = {rel.split("/")[0] for rel, _ in wd.files}
    shadows = [n for n in CLUSTER_PACKAGES if n in tops or f"{n}.py" in tops]
    if shadows:
        out.append(Problem("workdir", given, f"holds {', '.join(shadows)} at its top level, which would shadow the "
                                             "cluster's own package on the nodes; rename it or add it to .spotwiseignore"))
    return out


# -- the entrypoint, read, never imported ---------------------------------------------------------
def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _modules_in(root: Path, files: list[str]) -> list[str]:
    """Importable module names in a workdir, for the 'did you mean' list (at most 20)."""
    names = set()
    for rel in files:
        if rel.endswith(".py") and "/" not in rel and rel != "setup.py":
            names.add(rel[:-3])
        elif rel.endswith("/__init__.py"):
            names.add(rel[: -len("/__init__.py")].replace("/", "."))
        elif rel.endswith(".py") and "/" in rel:
            names.add(rel[:-3].replace("/", "."))
    return sorted(n for n in names if "-" not in n)[:20]


def _top_level_names(tree: ast.Module) -> tuple[set[str], list[str], bool]:
    """(every name bound at the top level, the functions among them, whether the module can
    define names a reader cannot see: a star import or a module ``__getattr__``)."""
    names: set[str] = set()
    funcs: list[str] = []
    opaque = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            funcs.append(node.name)
            opaque |= node.name == "__getattr__"
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    opaque = True
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            opaque = True          # names bound conditionally: do not guess, the head's preflight checks
    return names, funcs, opaque


def _syntax(path: Path, rel: str, field: str) -> Problem | None:
    try:
        ast.parse(path.read_bytes(), filename=rel)
    except SyntaxError as e:
        return Problem(field, f"{rel}:{e.lineno}", f"Python that parses: {e.msg} at {rel}:{e.lineno}")
    except ValueError as e:           # null bytes
        return Problem(field, rel, f"Python source: {e}")
    return None


def check_entrypoint(ref: str, wd: Workdir | None, *, has_pip: bool = False,
                     field: str = "training.entrypoint") -> list[Problem]:
    """``ref`` (``package.module:function``, the task's ``field``: ``training.entrypoint`` or
    ``training.train_func``) against the workdir, by reading it."""
    module, _, func = ref.partition(":")
    if wd is None:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found or has_pip:          # importable here, or from the requirements (the head's preflight checks)
            return []
        return [Problem(field, ref, f"a module the nodes can import: {module!r} is not importable "
                                                   "here and the task has no workdir; set workdir: to the directory "
                                                   "that holds it")]
    rels = [rel for rel, _ in wd.files]
    src = _module_file(wd.path, module)
    if src is None or src.relative_to(wd.path).as_posix() not in rels:
        have = _modules_in(wd.path, rels)
        return [Problem(field, ref, f"a module in workdir {wd.path}: there is no {module!r} (or it is "
                                                   f"ignored); modules there: {', '.join(have) or '(none)'}")]
    top = module.split(".")[0]
    problems = [p for rel in rels if rel.endswith(".py") and (rel == f"{top}.py" or rel.startswith(f"{top}/"))
                for p in [_syntax(wd.path / rel, rel, field)] if p is not None]
    if problems:
        return problems
    names, funcs, opaque = _top_level_names(ast.parse(src.read_bytes()))
    if func not in names and not opaque:
        rel = src.relative_to(wd.path).as_posix()
        return [Problem(field, ref, f"a function defined in {rel}: it has no {func!r}; functions "
                                                   f"there: {', '.join(funcs) or '(none)'}")]
    return []


# -- pip -------------------------------------------------------------------------------------------
def read_requirements(value: list[str] | str, base: Path) -> tuple[list[str], list[Problem]]:
    """``pip:`` as a list of requirements, from the list or the file it names (relative to the task
    file); each must be a PEP 508 requirement and none may pin a cluster package."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    if isinstance(value, str):
        path = (base / value).resolve()
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            return [], [Problem("pip", value, f"a list of requirements or a readable requirements file ({e})")]
        items = [(f"{value}:{i}", ln.split(" #")[0].strip()) for i, ln in enumerate(lines, 1)]
    else:
        items = [(f"pip[{i}]", str(ln).strip()) for i, ln in enumerate(value)]
    reqs, problems = [], []
    for where, line in items:
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            problems.append(Problem("pip", f"{where}: {line}", "requirements only (pip options such as -r, -e or "
                                                                "--index-url are not passed on)"))
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            problems.append(Problem("pip", f"{where}: {line}", f"a PEP 508 requirement ({e})"))
            continue
        if canonicalize_name(req.name) in CLUSTER_PACKAGES and (req.specifier or req.url or req.extras):
            problems.append(Problem("pip", f"{where}: {line}", PIN_ALLOWED))
            continue
        reqs.append(line)
    return reqs, problems


# -- all of it -------------------------------------------------------------------------------------
#: a workdir already in storage: a zip Ray fetches on every node (what the service takes: a path
#: would be read on the server's disk)
WORKDIR_URI_RE = re.compile(r"^(s3|gs|https)://[^/\s]+/\S+\.zip$")
WORKDIR_URI_ALLOWED = ("a directory (relative to the task file's), or the storage URI of a zip of it "
                       "(s3://bucket/path/code.zip; gs:// and https:// too)")


def is_uri(workdir: str) -> bool:
    """Whether ``workdir`` names storage (``scheme://``) rather than a directory."""
    return "://" in workdir


@dataclass(frozen=True, slots=True)
class UserCode:
    """A task's code, checked: what :func:`runtime_env` hands to Ray. ``workdir_uri``: a workdir
    given as a zip in storage (then ``workdir`` is None: nothing here to scan)."""

    workdir: Workdir | None
    pip: tuple[str, ...]
    env: dict[str, str]
    workdir_uri: str | None = None

    def summary(self) -> dict[str, Any] | None:
        """The workdir's path, file count, size and content hash (for ``launch --dry-run``)."""
        if self.workdir is None:
            return {"uri": self.workdir_uri} if self.workdir_uri else None
        return {"path": str(self.workdir.path), "files": len(self.workdir.files), "bytes": self.workdir.nbytes,
                "sha256": self.workdir.sha256()}


def check_code(*, entrypoint: str, user_code: bool, workdir: str | None, pip: list[str] | str | None,
               env: dict[str, str], base: Path, field: str = "training.entrypoint") -> tuple[UserCode, list[Problem]]:
    """Resolve and check a task's ``workdir`` (relative to ``base``, the task file's directory),
    ``pip`` and its code's ``package.module:function`` (``entrypoint``, the task's ``field``:
    ``training.entrypoint`` or ``training.train_func``); the checked code and every problem found."""
    problems: list[Problem] = []
    wd = None
    uri = None
    if workdir is not None and is_uri(workdir):
        if WORKDIR_URI_RE.match(workdir):
            uri = workdir            # read by Ray on the nodes; the head's preflight imports the function
        else:
            problems.append(Problem("workdir", workdir, WORKDIR_URI_ALLOWED))
    elif workdir is not None:
        path = (base / os.path.expandvars(os.path.expanduser(workdir))).resolve()
        if not path.is_dir():
            problems.append(Problem("workdir", workdir, "an existing directory (relative to the task file's)"))
        else:
            wd = scan_workdir(path)
            problems += check_workdir(wd, workdir)
    reqs: list[str] = []
    if pip is not None:
        reqs, bad = read_requirements(pip, base)
        problems += bad
    if user_code and not problems:
        problems += check_entrypoint(entrypoint, wd, has_pip=bool(reqs) or uri is not None, field=field)
    return UserCode(workdir=wd, pip=tuple(reqs), env=dict(env), workdir_uri=uri), problems


# -- the workdir in the run's storage (cloud runs) ------------------------------------------------------
#: where a workdir's zip lives in the run's storage root: one object per content, shared by every run
#: of that storage (a second launch of unchanged code uploads nothing)
CODE_PREFIX = "_code"
#: the single top-level directory of the zip: Ray strips it when it unpacks a remote working_dir
#: (without it, a workdir holding one package directory would lose that directory's name)
ZIP_ROOT = "workdir"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def zip_workdir(wd: Workdir, out: Path) -> None:
    """What ``wd`` ships, as a zip at ``out`` under one top-level directory (:data:`ZIP_ROOT`).
    Deterministic: files in path order, fixed timestamps and modes, so the same content makes the
    same bytes."""
    import zipfile

    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for rel, _ in wd.files:
            info = zipfile.ZipInfo(f"{ZIP_ROOT}/{rel}", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(wd.path / rel, "rb") as src, z.open(info, "w") as dst:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    dst.write(chunk)


def stage_workdir(code: UserCode, storage_uri: str) -> tuple[UserCode, bool]:
    """On a cloud run whose storage is a bucket (``s3://``): ``code`` with its workdir as the URI
    of its zip in that storage, ``<storage>/_code/<sha256>.zip`` (the content hash of
    :meth:`Workdir.sha256`), uploaded only when no object is at that key yet; and whether it was
    uploaded now. Why in the run's storage rather than Ray's own upload: it outlives the head (a
    migration's new head, a service restart fetch it again from there), it is not bounded by Ray's
    package limit, and unchanged code is never uploaded twice. A local storage (``file://``, the
    local cloud) or a workdir already given as a URI: ``code`` unchanged."""
    from dataclasses import replace

    from spotwise.runtime.storage.base import open_storage

    if code.workdir is None or code.workdir_uri is not None or not storage_uri.startswith("s3://"):
        return code, False
    store = open_storage(storage_uri)
    key = f"{CODE_PREFIX}/{code.workdir.sha256()}.zip"
    uploaded = False
    if key not in store.list(key):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="spotwise-workdir-") as tmp:
            z = Path(tmp) / "workdir.zip"
            zip_workdir(code.workdir, z)
            store.put_file(z, key)
        uploaded = True
    return replace(code, workdir_uri=store.child_uri(key)), uploaded


def runtime_env(code: UserCode) -> dict[str, Any]:
    """The Ray runtime environment (``working_dir``, ``excludes``, ``pip``, ``env_vars``) that
    ships ``code`` with the job; empty for a task without code of its own."""
    out: dict[str, Any] = {}
    if code.workdir_uri is not None:
        out["working_dir"] = code.workdir_uri
    elif code.workdir is not None:
        out["working_dir"] = str(code.workdir.path)
        if code.workdir.excludes:
            out["excludes"] = list(code.workdir.excludes)
    if code.pip:
        out["pip"] = list(code.pip)
    if code.env:
        out["env_vars"] = dict(code.env)
    return out
