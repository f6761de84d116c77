"""The install step (:func:`spotwise.provisioner.boot.script.install_script`) against a node image
of its own: a custom image's environment at ``$VENV`` is kept when it holds the shipped build, and
otherwise left as it is with the build in a fresh venv beside it (issue 48, item 7). Real wheel,
real venvs, real pip, offline: the image's venv sees the test venv's packages (torch, Ray) as a
DL image's does, never this checkout's spotwise."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from spotwise.build import BootBuild, build_wheel
from spotwise.provisioner.boot.script import install_script


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> BootBuild:
    w = build_wheel(tmp_path_factory.mktemp("dist"))
    return BootBuild(build_id=w.build_id, name=w.name, sha256=w.sha256, url=f"file://{w.path}")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPOTWISE_PYTHON")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _image_venv(path: Path) -> Path:
    """A custom image's own environment: a venv with a package of its own, and the test venv's
    packages (torch, Ray...) visible as a plain directory (no spotwise: its editable ``.pth`` there
    is not processed)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = next((path / "lib").glob("python*/site-packages"))
    (site / "imagepkg.py").write_text("WHO = 'the image'\n")
    (site / "_image_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path


def _install(tmp_path: Path, venv: Path, build: BootBuild) -> subprocess.CompletedProcess:
    script = tmp_path / "install.sh"
    script.write_text(f'set -euo pipefail\nVENV={venv}\nSTATE_DIR={tmp_path}/state\nmkdir -p "$STATE_DIR"\n'
                      f'{install_script(build, "aws")}\necho "VENV=$VENV"\n')
    return subprocess.run(["bash", str(script)], env=_env(), capture_output=True, text=True, timeout=300)


def _py(venv: Path, code: str) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True,
                          env={"PATH": os.environ["PATH"]}).stdout.strip()


def test_an_images_venv_without_the_build_is_left_as_it_is_and_the_build_goes_beside_it(tmp_path, build):
    image = _image_venv(tmp_path / "venv")
    before = sorted(str(p.relative_to(image)) for p in image.rglob("*"))
    done = _install(tmp_path, image, build)
    assert done.returncode == 0, done.stderr
    beside = Path(f"{image}-spotwise")
    assert f"spotwise: {image} is the image's own environment, left as it is; the build goes in {beside} beside it" \
        in done.stdout
    assert f"spotwise build {build.build_id} installed from {build.name}" in done.stdout
    assert done.stdout.strip().endswith(f"VENV={beside}")                  # what Ray and the watcher run
    assert sorted(str(p.relative_to(image)) for p in image.rglob("*")) == before   # not a file changed
    assert _py(beside, "import spotwise.build as b, imagepkg; print(b.build_id(), imagepkg.WHO)") == \
        f"{build.build_id} the image"                                    # the build, and the image's packages
    again = _install(tmp_path, image, build)                             # the next boot: the same venv
    assert again.returncode == 0, again.stderr
    assert f"spotwise build {build.build_id} already installed in {beside}" in again.stdout


def test_an_images_venv_that_holds_the_build_is_kept(tmp_path, build):
    """The image was baked with this build: its venv is the node's, nothing is installed."""
    image = _image_venv(tmp_path / "venv")
    wheel = build.url.removeprefix("file://")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(image / "bin" / "python"), "install", "--quiet",
                    "--no-deps", "--disable-pip-version-check", wheel], check=True, env=_env(), timeout=300)
    done = _install(tmp_path, image, build)
    assert done.returncode == 0, done.stderr
    assert f"spotwise build {build.build_id} already installed in {image}" in done.stdout
    assert done.stdout.strip().endswith(f"VENV={image}") and not Path(f"{image}-spotwise").exists()
