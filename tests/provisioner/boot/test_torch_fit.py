"""A GPU node's torch must use its GPUs (:mod:`spotwise.provisioner.boot.torch_fit`): the rendered block,
run by bash against a real venv (real pip) whose torch is a fake that "sees" the GPUs of a stub
``nvidia-smi`` only where its CUDA fits the stub driver's, with a local PyTorch wheel index
(``file://``, PEP 503 pages) holding fake builds. Nothing here reaches download.pytorch.org."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from spotwise.provisioner.boot.script import VENV_FUNCTIONS
from spotwise.provisioner.boot.torch_fit import TORCH_FIT_ATTEMPTS, torch_fit_block

V = "2.13.0"

# The fake torch: a CUDA build for `_CUDA`. Like a real one, it runs on a driver of its own CUDA
# major (minor-version compatibility) or a newer major, and uses no GPU on an older driver; it
# counts the GPUs nvidia-smi lists.
FAKE_TORCH = '''import re, subprocess
__version__ = "{version}"
_CUDA = {cuda!r}


class version:
    cuda = _CUDA


def _smi(*args):
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True).stdout


class cuda:
    @staticmethod
    def is_available():
        m = re.search(r"CUDA Version: *([0-9]+)[.]([0-9]+)", _smi())
        return bool(m and _CUDA and int(_CUDA.split(".")[0]) <= int(m[1]))

    @staticmethod
    def device_count():
        return len(_smi("--query-gpu=index", "--format=csv,noheader").split()) if cuda.is_available() else 0


class _Tensor:
    def __init__(self, v):
        self.v = v

    def add(self, o):
        return _Tensor(self.v + o)

    def item(self):
        return self.v


def ones(n, device="cpu"):
    if device == "cuda" and not cuda.is_available():
        raise RuntimeError("The NVIDIA driver on your system is too old")
    return _Tensor(1)
'''


def _wheel(d: Path, tag: str, cuda: str | None) -> Path:
    """``torch-V+TAG-py3-none-any.whl`` whose torch reports CUDA ``cuda`` (None: a CPU build)."""
    ver = f"{V}+{tag}"
    info = f"torch-{ver}.dist-info"
    files = {"torch/__init__.py": FAKE_TORCH.format(version=ver, cuda=cuda),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {ver}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: spotwise-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(c.encode())}\n" for p, c in files.items())
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"torch-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _index(root: Path, builds: dict[str, str]) -> str:
    """A PyTorch-style wheel index at ``root``: per tag, ``cuNNN/torch/index.html`` listing one
    wheel whose torch reports CUDA ``builds[tag]``; its ``file://`` URL."""
    for tag, cuda in builds.items():
        w = _wheel(root / tag / "torch", tag, cuda)
        (root / tag / "torch" / "index.html").write_text(
            f'<!DOCTYPE html>\n<html><body>\n<a href="{w.name}">{w.name}</a><br/>\n</body></html>\n')
    root.mkdir(parents=True, exist_ok=True)
    return root.as_uri()


def _pip_env() -> dict[str, str]:
    """This machine's environment without its pip configuration (a find-links dir with a real torch,
    extra indexes, constraints): the block's pip sees only the index the test gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """One throwaway venv with pip and no site packages of this machine (its real torch unseen),
    made by spotwise's install (the mark it leaves: the refit changes it in place)."""
    return _new_venv(tmp_path_factory.mktemp("node") / "venv", ours=True)


def _new_venv(v: Path, *, ours: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(v)], check=True, env=_pip_env(), timeout=120)
    if ours:
        next((v / "lib").glob("python*/site-packages")).joinpath("_spotwise_image.pth").write_text("")
    return v


def _torch(venv: Path, tag: str, cuda: str | None, tmp_path: Path) -> None:
    """The venv's torch, before the boot: the fake build ``V+tag`` (reporting CUDA ``cuda``)."""
    w = _wheel(tmp_path / "image-wheels", tag, cuda)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                    "--force-reinstall", str(w)], check=True, env=_pip_env(), timeout=120)


def _torch_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=True, env=_pip_env())
    return out.stdout.strip()


def _boot(tmp_path: Path, venv: Path, *, driver: str, index: str, gpus: int = 8) -> subprocess.CompletedProcess:
    """Run the rendered block as a boot script runs it (``set -euo pipefail``, after the GPU wait)
    on a node whose stub ``nvidia-smi`` lists ``gpus`` GPUs under a driver of CUDA ``driver``;
    what the boot does next (Ray) is a marker file."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/bash\nif [ $# -eq 0 ]; then\n'
                   f'  echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: {driver}     |"\n'
                   f'else seq 0 {gpus - 1}; fi\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    script = (f'set -euo pipefail\nVENV="{venv}"\nSTATE_DIR="{state}"\nNUM_GPUS={gpus}\n{VENV_FUNCTIONS}\n'
              f'{torch_fit_block()}\necho "$VENV" >"$STATE_DIR/ray-started"\n')
    env = {**_pip_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SPOTWISE_TORCH_INDEX": index}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)


def test_a_torch_that_uses_the_gpus_is_kept_and_named_in_the_log(venv, tmp_path):
    _torch(venv, "cu124", "12.4", tmp_path)
    r = _boot(tmp_path, venv, driver="12.4", index=_index(tmp_path / "empty-index", {}))  # pip would fail
    assert r.returncode == 0, r.stderr
    assert "spotwise: torch 2.13.0+cu124 (CUDA 12.4) uses 8 GPU(s) of the 8 nvidia-smi lists (driver CUDA 12.4)" \
        in r.stdout
    assert "installing" not in r.stdout and (tmp_path / "state" / "ray-started").exists()
    assert _torch_version(venv) == f"{V}+cu124"


def test_a_torch_built_for_a_newer_cuda_is_replaced_by_the_same_version_built_for_the_drivers(venv, tmp_path):
    """PyPI's torch (CUDA 13) on a driver 550 (CUDA 12.4): cu124, the driver's own CUDA, is tried
    first and kept (cu126 would run too, cu130 would not)."""
    _torch(venv, "cu130", "13.0", tmp_path)
    index = _index(tmp_path / "index", {"cu124": "12.4", "cu126": "12.6", "cu130": "13.0"})
    r = _boot(tmp_path, venv, driver="12.4", index=index)
    assert r.returncode == 0, r.stderr
    assert "spotwise: torch 2.13.0+cu130 (CUDA 13.0) uses none of this node's 8 GPU(s) (driver CUDA 12.4)" in r.stdout
    assert f"installing torch {V}+cu124 from {index}/cu124 (attempt 1 of 3)" in r.stdout
    assert r.stdout.count("installing torch") == 1
    assert (f"spotwise: torch {V}+cu124 (CUDA 12.4) uses 8 GPU(s) of the 8 nvidia-smi lists (driver CUDA 12.4), "
            f"installed from {index}/cu124") in r.stdout
    assert _torch_version(venv) == f"{V}+cu124" and (tmp_path / "state" / "ray-started").exists()
    site = next((venv / "lib").glob("python*/site-packages"))
    assert [p.name for p in site.glob("torch-*.dist-info")] == [f"torch-{V}+cu124.dist-info"]


@pytest.mark.parametrize("driver,tried", [("11.8", "cu118 (not listed)"), ("10.2", "nothing (no CUDA 10.x tag known)")])
def test_without_a_build_that_fits_the_driver_the_boot_ends_with_one_line_before_ray(venv, tmp_path, driver, tried):
    _torch(venv, "cu130", "13.0", tmp_path)
    index = _index(tmp_path / "index", {"cu124": "12.4", "cu126": "12.6"})     # CUDA 12 builds only
    r = _boot(tmp_path, venv, driver=driver, index=index)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"spotwise: no torch build uses this node's GPUs: driver CUDA {driver}, torch {V}+cu130 (CUDA 13.0) uses none; "
        f"tried from {index}: {tried}"]
    assert "installing" not in r.stdout and not (tmp_path / "state" / "ray-started").exists()
    assert _torch_version(venv) == f"{V}+cu130"


def test_tags_are_tried_driver_cuda_and_older_first_then_newer_minors_at_most_three_installs(venv, tmp_path):
    """Driver CUDA 12.4: cu124, cu121 (newest first, <= the driver), then cu126, cu128, cu129
    (nearest newer first). Builds that install but use no GPU (here: reporting CUDA 13.0) count
    as attempts; a tag whose page lists no build of the version does not."""
    _torch(venv, "cu130", "13.0", tmp_path)
    broken = {"cu124": "13.0", "cu121": "13.0", "cu126": "13.0", "cu128": "12.8"}
    index = _index(tmp_path / "index", broken)
    r = _boot(tmp_path, venv, driver="12.4", index=index)
    assert r.returncode == 1
    assert r.stdout.count("installing torch") == TORCH_FIT_ATTEMPTS == 3
    assert r.stderr.splitlines()[-1].endswith(
        f"tried from {index}: cu124 (uses no GPU) cu121 (uses no GPU) cu126 (uses no GPU)")
    assert _torch_version(venv) == f"{V}+cu126", "the last build pip installed is the third candidate's"
    assert not (tmp_path / "state" / "ray-started").exists()

    index = _index(tmp_path / "index2", {k: v for k, v in broken.items() if k != "cu121"})
    r = _boot(tmp_path, venv, driver="12.4", index=index)
    assert r.returncode == 0, r.stderr
    assert f"{index}/cu121 lists no torch {V} for cp3" in r.stdout
    assert [ln.split(" (attempt")[0].rsplit("/", 1)[1] for ln in r.stdout.splitlines() if "installing torch" in ln] \
        == ["cu124", "cu126", "cu128"]
    assert f"uses 8 GPU(s) of the 8 nvidia-smi lists (driver CUDA 12.4), installed from {index}/cu128" in r.stdout
    assert _torch_version(venv) == f"{V}+cu128" and (tmp_path / "state" / "ray-started").exists()


def test_a_cpu_build_on_a_gpu_node_is_replaced_and_a_node_without_gpus_checks_nothing(venv, tmp_path):
    _torch(venv, "cpu", None, tmp_path)
    r = _boot(tmp_path, venv, driver="12.4", index=_index(tmp_path / "empty-index", {}), gpus=0)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""            # NUM_GPUS=0: nothing to check
    index = _index(tmp_path / "index", {"cu126": "12.6"})
    r = _boot(tmp_path, venv, driver="12.8", index=index, gpus=2)
    assert r.returncode == 0, r.stderr
    assert "torch 2.13.0+cpu (CUDA none) uses none of this node's 2 GPU(s) (driver CUDA 12.8)" in r.stdout
    assert "CUDA builds of torch 2.13.0 to try: cu128 cu126 cu124 cu121 cu129" in r.stdout
    assert _torch_version(venv) == f"{V}+cu126"


def test_an_images_own_venv_is_never_changed_its_torch_is_refitted_in_a_venv_beside_it(tmp_path):
    """A custom image's environment (no spotwise mark) whose torch uses no GPU: the refit goes into
    a fresh venv beside it that still sees the image's packages, and the boot goes on with that
    one; the image's venv keeps its own torch (issue 48, item 7: before, pip replaced it in place)."""
    image = _new_venv(tmp_path / "image-venv", ours=False)
    _torch(image, "cu130", "13.0", tmp_path)
    (next((image / "lib").glob("python*/site-packages")) / "imagepkg.py").write_text("WHO = 'the image'\n")
    index = _index(tmp_path / "index", {"cu124": "12.4"})
    r = _boot(tmp_path, image, driver="12.4", index=index)
    assert r.returncode == 0, r.stderr
    beside = Path(f"{image}-spotwise")
    assert f"the image's venv is left as it is; torch is refitted in {beside} beside it" in r.stdout
    assert (tmp_path / "state" / "ray-started").read_text().strip() == str(beside)     # what Ray runs
    assert _torch_version(image) == f"{V}+cu130"                                     # untouched
    assert _torch_version(beside) == f"{V}+cu124"
    out = subprocess.run([str(beside / "bin" / "python"), "-c", "import imagepkg; print(imagepkg.WHO)"],
                         capture_output=True, text=True, check=True, env=_pip_env())
    assert out.stdout.strip() == "the image"                  # the image's packages stay visible
