"""End to end on the local cloud: a user's own package, shipped from a temporary directory as the
task's workdir, trains through its ``make_spec``, is preempted mid-run and ends with the weights
of the same run without a preemption, losing no step (issue 31's "Done when", local cloud)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from e2e.conftest import launch

pytestmark = pytest.mark.slow

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "own-code"
STEPS = 1000          # ~20 s of training: the preemption at 4 s lands mid-run


def _user_task(tmp_path: Path) -> Path:
    """The example copied to ``tmp_path/code`` (not importable from here), with a module-level
    check that the task's ``env`` reached the process that imports it."""
    code = tmp_path / "code"
    shutil.copytree(EXAMPLE_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    train = code / "regress" / "train.py"
    train.write_text(train.read_text() + "\n\nimport os\n\nif os.environ.get('REGRESS_NOTE') != 'set on every node':\n"
                     "    raise RuntimeError('the task env did not reach this process')\n")
    spec = yaml.safe_load((code / "task.yaml").read_text())
    spec["training"]["steps"] = STEPS
    spec["training"]["checkpoint"]["interval_steps"] = 100
    (code / "task.yaml").write_text(yaml.safe_dump(spec))
    return code / "task.yaml"


def test_own_package_is_preempted_and_resumes_bitwise(tmp_path):
    assert importlib.util.find_spec("regress") is None       # only the workdir holds it
    task = _user_task(tmp_path)
    ref = launch(tmp_path / "ref", task, "--no-preempt", "--storage", f"file://{tmp_path}/ref-ckpt")
    assert ref["status"] == "succeeded", ref
    assert ref["preemptions"] == 0 and ref["steps_completed"] == STEPS

    rep = launch(tmp_path / "run", task, "--preempt-at", "4", "--storage", f"file://{tmp_path}/ckpt")
    assert rep["status"] == "succeeded", rep
    assert rep["steps_completed"] == rep["steps_total"] == STEPS     # the task's steps, not the spec's 300
    assert rep["preemptions"] == 1 and rep["resumes"] == 1
    assert rep["lost_steps"] == 0
    assert rep["model_sha256"] == ref["model_sha256"]
    kinds = [c["kind"] for c in rep["checkpoints"]]
    assert "preemption" in kinds and kinds[-1] == "final"
