"""The build of spotwise this process runs: its id, and a wheel of it that a launch ships to its nodes.

Why a launch ships itself: a cloud node must run exactly the spotwise the launcher runs (the same
runtime, the same checkpoint layout, the same watcher), and installing ``spotwise`` *by name* from
a package index would install whatever that index serves under the name: nothing (it is not
published), or, once someone registers the name, their code as root on every node with the node's
role. So the launcher builds a wheel of its own files, puts it in the run's storage and hands each
node a short-lived URL and the wheel's sha256; the node checks the hash before installing
(:mod:`spotwise.provisioner.boot.script`).

* :func:`build_id` — the sha256 over the package's files (relative path and bytes, sorted;
  ``__pycache__`` and hidden files left out), first 16 hex digits. It is the same for an editable
  install, an installed wheel and a node that installed the shipped wheel, because the wheel holds
  exactly those files. The head refuses a job whose launcher has a different one.
* :func:`build_wheel` — a deterministic ``py3-none-any`` wheel of those files (fixed timestamps and
  modes, so the same build gives the same bytes and the same sha256: the storage key is
  content-addressed and an unchanged build is uploaded once). Its metadata (dependencies, extras,
  entry points) is the installed distribution's, with the version ``X.Y.Z+b<build id>``.

How a run ships it: :mod:`spotwise.provisioner.boot.shipping` (built and uploaded on first use, then a
fresh fetch URL per boot script). This module is a leaf every package may use.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import spotwise
from spotwise import __version__
from spotwise.errors import SpotwiseError

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_DIST = "spotwise"


def package_dir() -> Path:
    """The directory of the running ``spotwise`` package."""
    return Path(spotwise.__file__).resolve().parent


def _included(rel: Path) -> bool:
    return not any(p == "__pycache__" or p.startswith(".") for p in rel.parts) and rel.suffix not in (".pyc", ".pyo")


def package_files(root: Path | None = None) -> list[tuple[str, bytes]]:
    """The package's files as ``(path inside the wheel, bytes)``, sorted: what the build id hashes
    and the wheel holds."""
    root = root or package_dir()
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and _included(rel):
            out.append((f"{_DIST}/{rel.as_posix()}", p.read_bytes()))
    return out


def files_id(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in files:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def _snapshot() -> tuple[tuple[tuple[str, bytes], ...], str]:
    """The package's files and their id, read once per process: the build id this process reports
    and the wheel it ships are the same files even if the checkout changes meanwhile (a file
    edited between the two reads would ship a wheel whose id the launcher's job refuses)."""
    files = package_files()
    return tuple(files), files_id(files)


def build_id() -> str:
    """This process's spotwise build: 16 hex digits of a sha256 over the package's files (as
    first read by this process)."""
    return _snapshot()[1]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _dist_metadata(version: str) -> tuple[str, str | None]:
    """METADATA (the installed distribution's, with ``version``) and entry_points.txt."""
    from importlib import metadata

    try:
        dist = metadata.distribution(_DIST)
    except metadata.PackageNotFoundError:
        raise SpotwiseError("spotwise is not installed as a distribution, so its dependencies are unknown and "
                            "no wheel of it can be shipped to the nodes; install it (pip install -e . or a "
                            "wheel) and launch again") from None
    text = dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: {_DIST}\n"
    text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1)
    return text, dist.read_text("entry_points.txt")


@dataclass(frozen=True, slots=True)
class Wheel:
    path: Path
    build_id: str
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name


def build_wheel(out_dir: Path) -> Wheel:
    """Write the wheel of the running build into ``out_dir`` (same build: same bytes): the files
    :func:`build_id` hashed, whatever the checkout holds now."""
    snap, bid = _snapshot()
    files = list(snap)
    version = f"{__version__}+b{bid}"
    info = f"{_DIST}-{version}.dist-info"
    meta, entry_points = _dist_metadata(version)
    extra = [(f"{info}/METADATA", meta.encode()),
             (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: spotwise.build\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n")]
    if entry_points:
        extra.append((f"{info}/entry_points.txt", entry_points.encode()))
    entries = files + extra
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    data = buf.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{_DIST}-{version}-py3-none-any.whl"
    path.write_bytes(data)
    return Wheel(path=path, build_id=bid, sha256=hashlib.sha256(data).hexdigest())


@dataclass(frozen=True, slots=True)
class BootBuild:
    """What one boot script needs to install the shipped build: where to fetch it, its sha256
    (checked before anything is installed) and the build id it must report once installed."""

    build_id: str
    name: str
    sha256: str
    url: str


def unmet_requirements(extras: set[str]) -> list[str]:
    """The installed spotwise's requirements (with ``extras``) that this environment does not
    satisfy; a requirement that cannot be checked counts as unmet. A node installs the shipped
    wheel without dependencies first and resolves them only when this is not empty: on an image
    that already has them (the emulated stock image; a baked image) that saves the resolver's
    seconds per boot."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:
        return ["packaging (to check the requirements)"]
    out = []
    for line in metadata.requires(_DIST) or []:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(line)
            continue
        if not req.specifier.contains(have, prereleases=True):
            out.append(f"{line} (have {have})")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m spotwise.build DIR``: write the running build's wheel into DIR (for an image
    recipe or ``ray up``); prints its path, sha256 and build id. ``python -m spotwise.build
    --unmet EXTRAS``: exit 1 and list the requirements this environment lacks (see
    :func:`unmet_requirements`)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--unmet":
        unmet = unmet_requirements({e for e in args[1].split(",") if e})
        for line in unmet:
            print(line)
        return 1 if unmet else 0
    if len(args) != 1:
        print("usage: python -m spotwise.build DIR | --unmet EXTRAS", file=sys.stderr)
        return 2
    w = build_wheel(Path(args[0]))
    print(f"{w.path}\nsha256 {w.sha256}\nbuild {w.build_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
