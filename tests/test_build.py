"""The launcher's own build, shipped to nodes as a wheel: deterministic, checked, installed over a
stock image's Python; never spotwise installed by name."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from emulator.base import stock_image_python
from spotwise.build import BootBuild, build_id, build_wheel, package_files
from spotwise.provisioner.boot.script import BootstrapSpec, install_script, render_script
from spotwise.runtime.node.job import BUILD_ENV, RESULT_PREFIX, TOKEN_ENV
from spotwise.runtime.node.job import main as job_main

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_is_deterministic_and_holds_exactly_the_hashed_files(tmp_path):
    a, b = build_wheel(tmp_path / "a"), build_wheel(tmp_path / "b")
    assert a.path.read_bytes() == b.path.read_bytes() and a.sha256 == b.sha256
    assert a.sha256 == hashlib.sha256(a.path.read_bytes()).hexdigest()
    assert a.build_id == build_id() and re.fullmatch(r"[0-9a-f]{16}", a.build_id)
    assert a.name == f"spotwise-{__import__('spotwise').__version__}+b{a.build_id}-py3-none-any.whl"
    files = dict(package_files())
    assert "spotwise/provisioner/boot/script.py" in files and not any("__pycache__" in n for n in files)
    with zipfile.ZipFile(a.path) as z:
        names = set(z.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        assert names - {n for n in names if n.startswith(info)} == set(files)
        meta = z.read(f"{info}/METADATA").decode()
        assert f"Version: {__import__('spotwise').__version__}+b{a.build_id}" in meta and "Requires-Dist: ray" in meta
        for line in z.read(f"{info}/RECORD").decode().splitlines():   # what pip checks on install
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                continue
            data = z.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_the_wheel_ships_the_files_the_build_id_was_taken_from(tmp_path, monkeypatch):
    """A checkout edited after the process took its build id (a developer saving a file while a
    launch boots) still ships the files of that id: the launcher's job would refuse any other."""
    import shutil

    import spotwise.build as b

    pkg = tmp_path / "pkg"
    shutil.copytree(b.package_dir(), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(b, "package_dir", lambda: pkg)
    b._snapshot.cache_clear()
    try:
        first = b.build_id()
        (pkg / "build.py").write_text((pkg / "build.py").read_text() + "\n# edited\n")
        w = b.build_wheel(tmp_path / "out")
        assert w.build_id == b.build_id() == first
        with zipfile.ZipFile(w.path) as z:
            assert b"# edited" not in z.read("spotwise/build.py")
        assert b.files_id(b.package_files()) != first           # what a new process would take
    finally:
        b._snapshot.cache_clear()


def _run_install(tmp_path: Path, build: BootBuild) -> subprocess.CompletedProcess:
    """The install of the shipped build alone (step 2 of a cloud node's boot script, the first
    step of a Slurm node's: one function renders it for both), as a node of the emulated stock
    image runs it."""
    script = tmp_path / "install.sh"
    script.write_text(f'set -euo pipefail\nVENV={tmp_path}/venv\nSTATE_DIR={tmp_path}/state\n'
                      f'mkdir -p "$STATE_DIR"\n{install_script(build, "aws")}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["SPOTWISE_PYTHON"] = str(stock_image_python())
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_a_node_installs_the_shipped_wheel_over_a_stock_image_and_reports_its_build(tmp_path):
    w = build_wheel(tmp_path / "dist")
    build = BootBuild(build_id=w.build_id, name=w.name, sha256=w.sha256, url=f"file://{w.path}")
    done = _run_install(tmp_path, build)
    assert done.returncode == 0, done.stderr
    assert f"spotwise build {w.build_id} installed from {w.name} sha256 {w.sha256}" in done.stdout
    got = subprocess.run([str(tmp_path / "venv/bin/python"), "-c",
                          "import spotwise, spotwise.build as b, torch, ray; print(b.build_id(), spotwise.__file__)"],
                         capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]}).stdout.split()
    assert got[0] == build_id() and got[1].startswith(str(tmp_path / "venv"))   # the venv's own, not this checkout's
    again = _run_install(tmp_path, build)                                       # a second boot: nothing to do
    assert again.returncode == 0 and f"spotwise build {w.build_id} already installed" in again.stdout


def test_a_tampered_wheel_is_refused_before_anything_is_installed(tmp_path):
    w = build_wheel(tmp_path / "dist")
    bad = tmp_path / "evil" / w.name
    bad.parent.mkdir()
    data = bytearray(w.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    done = _run_install(tmp_path, BootBuild(build_id=w.build_id, name=w.name, sha256=w.sha256, url=f"file://{bad}"))
    assert done.returncode != 0
    assert f"refusing the shipped build {w.name}" in done.stderr and w.sha256 in done.stderr
    assert not (tmp_path / "venv").exists() and not list((tmp_path / "state").glob("*.whl*"))


def test_a_boot_script_needs_a_shipped_build_or_an_image_that_has_spotwise():
    spec = dict(cloud="gcp", cluster_id="c1", job_id="j1", role="worker", region="r", zone="z",
                market="spot", instance_type="t", head_address="10.0.0.1:6379")
    assert "the launch shipped no build" in render_script(BootstrapSpec(**spec))
    with pytest.raises(ValueError, match="build"):
        BootstrapSpec(**spec, build=BootBuild(build_id="x", name="spotwise.whl", sha256="0", url="file:///x"))


# pip/uv installing a requirement *named* spotwise (a spec, not a file the launch shipped)
_BY_NAME = re.compile(r"""\b(?:pip3?|uv\s+pip)"?\s+install\b[^\n]*?(?<![\w/.$-])spotwise(?=\[|==|>=|<=|~=|\s|'|"|$)""",
                      re.MULTILINE)


def test_no_boot_script_recipe_or_infra_file_installs_spotwise_by_name(tmp_path):
    # the pattern catches what was there before
    assert _BY_NAME.search("""  "$VENV/bin/pip" install --quiet 'spotwise[aws]==0.1.0'""")
    assert _BY_NAME.search("(python3 -m venv /opt/v && /opt/v/bin/pip install 'spotwise[aws]')")
    assert _BY_NAME.search('"$VENV/bin/pip" install "ray[train]==2.60.0" spotwise')
    assert not _BY_NAME.search('pip install "$(ls /tmp/spotwise-dist/spotwise-*-py3-none-any.whl)[aws]"')
    texts = {str(p.relative_to(ROOT)): p.read_text(errors="replace")
             for d in ("infra", "scripts") for p in (ROOT / d).rglob("*") if p.is_file()}
    w = build_wheel(tmp_path)
    build = BootBuild(build_id=w.build_id, name=w.name, sha256=w.sha256, url="https://example.invalid/w.whl")
    for cloud in ("aws", "gcp", "azure", "local"):
        for role in ("head", "worker"):
            for b in (None, build):
                spec = BootstrapSpec(cloud=cloud, cluster_id="c", job_id="j", role=role, region="r", zone="z",
                                     market="spot", instance_type="t", build=b)
                texts[f"boot script {cloud} {role} {'shipped' if b else 'image'}"] = render_script(spec)
    assert len(texts) > 16
    assert {k: _BY_NAME.findall(v) for k, v in texts.items() if _BY_NAME.search(v)} == {}


def test_a_head_of_another_build_refuses_the_job(monkeypatch, capsys):
    monkeypatch.setenv(TOKEN_ENV, "t")
    monkeypatch.setenv(BUILD_ENV, "0123456789abcdef")
    assert job_main(["unused"]) == 1
    out = capsys.readouterr().out
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX))[len(RESULT_PREFIX):])
    assert f"the head runs spotwise build {build_id()}, the launcher build 0123456789abcdef" in result["error"]


def test_unmet_requirements_name_what_the_environment_lacks(monkeypatch):
    from importlib import metadata

    from spotwise import build

    reqs = ["ray==0.0.1; extra == 'aws'", "surely-not-installed-xyz>=1", "pytest>=1"]
    monkeypatch.setattr(metadata, "requires", lambda name: reqs if name == "spotwise" else None)
    assert build.unmet_requirements(set()) == ["surely-not-installed-xyz>=1"]
    unmet = build.unmet_requirements({"aws"})
    assert unmet[0].startswith("ray==0.0.1") and "(have " in unmet[0] and len(unmet) == 2
