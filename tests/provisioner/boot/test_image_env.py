"""The install step (:func:`spotwise.provisioner.boot.script.install_script`) against a node image
of its own: a custom image's environment at ``$VENV`` is kept when it holds the shipped build, and
otherwise left as it is with the build in a fresh venv beside it (issue 48, item 7). Real wheel,
real venvs, real pip, offline: the image's venv sees the test venv's packages (torch, Ray) as a
DL image's does, never this checkout's spotwise."""

from __future__ import annotations

import glob
import os
import shutil
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
    assert f"spotwise: {image} is the image's own venv, left as it is; the build goes in {beside}" \
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


def _install_on_py310_image(tmp_path: Path, build: BootBuild, **image) -> subprocess.CompletedProcess:
    """The install step on the GCP emulator's node image (emulator.images: python3 is 3.10, apt's
    lists are empty and its locks held at first boot), with its ``$VENV`` not there yet."""
    from emulator.base import stock_image_python
    from emulator.images import py310_image

    bin_dir = py310_image(tmp_path / "image", stock_python=stock_image_python(), **image)
    script = tmp_path / "install.sh"
    script.write_text(f'set -euo pipefail\nVENV={tmp_path}/venv\nSTATE_DIR={tmp_path}/state\nmkdir -p "$STATE_DIR"\n'
                      f'{install_script(build, "aws")}\necho "VENV=$VENV"\n')
    env = {**_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_a_node_whose_image_has_python_3_10_installs_3_11_through_apt_at_first_boot(tmp_path, build):
    """GCP's default image: no Python >= 3.11, empty package lists, apt's locks held by first-boot
    jobs. The node updates the lists (again while their lock is held), waits for dpkg's lock,
    installs python3.11 and makes its venv over it (issue 48, item 4: before, a bare `apt-get
    install` found no package, its error was discarded and the boot ended with no Python)."""
    done = _install_on_py310_image(tmp_path, build, lock_s=3)
    assert done.returncode == 0, done.stderr + (tmp_path / "state" / "apt.log").read_text()
    assert "no Python >= 3.11 on this image; installing python3.11 from its archive" in done.stdout
    assert f"spotwise build {build.build_id} installed from {build.name}" in done.stdout
    assert f"(python {tmp_path}/image/bin/python3.11)" in done.stdout
    venv = tmp_path / "venv"
    assert _py(venv, "import sys, spotwise.build as b; print(sys.version_info[:2] >= (3, 11), b.build_id())") \
        == f"True {build.build_id}"


def test_a_python_apt_cannot_install_is_one_line_and_exit_1(tmp_path, build):
    """An archive without python3.11: the boot ends at once with apt's own error on one line."""
    done = _install_on_py310_image(tmp_path, build, lock_s=0, archive=())
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["spotwise: apt-get could not install python3.11: "
                                        "E: Unable to locate package python3.11"]
    assert not (tmp_path / "venv").exists()


def test_debians_shared_dist_packages_stay_out_of_a_venv_over_another_python(tmp_path):
    """Ubuntu's /usr/lib/python3/dist-packages holds modules built for its own python3 (3.10): a
    venv over an archive's python3.11 must not see them; a venv over that python3 itself does."""
    from spotwise.provisioner.boot.script import VENV_FUNCTIONS

    shared = tmp_path / "usr" / "lib" / "python3" / "dist-packages"
    shared.mkdir(parents=True)
    (shared / "built_for_310.py").write_text("")
    system = Path(os.path.realpath("/usr/bin/python3")).name if Path("/usr/bin/python3").exists() else ""
    others = [p for p in map(shutil.which, ("python3.11", "python3.12", "python3.13")) if p] \
        + sorted(glob.glob("/root/.pyenv/versions/3.1*/bin/python3.1?"))
    other = next((p for p in others if _version(p) not in ("", system)), None)
    if other is None:
        pytest.skip("needs a Python >= 3.11 of another version than /usr/bin/python3")

    def pth_of(base: str, venv: Path) -> str:
        py = tmp_path / f"py-{venv.name}"
        py.write_text(f'#!/bin/bash\nPYTHONPATH={shared} exec {base} "$@"\n')
        py.chmod(0o755)
        script = f'set -euo pipefail\n{VENV_FUNCTIONS}\nsw_venv {py} {venv}\n'
        subprocess.run(["bash", "-c", script], check=True, env=_env(), timeout=120)
        return next((venv / "lib").glob("python*/site-packages/_spotwise_image.pth")).read_text()

    pth = pth_of(other, tmp_path / "venv")
    assert str(shared) not in pth and pth.strip()
    own = next((p for p in others if _version(p) == system), None)
    if own:                                         # the distribution's own version keeps them
        assert str(shared) in pth_of(own, tmp_path / "venv-system")


def _version(py: str) -> str:
    out = subprocess.run([py, "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, env=_env())
    return out.stdout.strip() if out.returncode == 0 else ""
