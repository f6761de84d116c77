"""End to end on the local cloud: a user's own package, shipped from a temporary directory as the
task's workdir, trains through its ``make_spec``, is preempted mid-run and ends with the weights
of the same training without a preemption, losing no step (issue 31's "Done when", local cloud).

The uninterrupted reference is the same task's training without Ray (torchrun, one process per
node, the loop and the user's spec as the nodes run them): one launch instead of two, and a
stronger claim — a preempted Ray run equals a Ray-free one bit for bit.

A Ray Train function (``training.train_func``) preempted and resumed from the checkpoint it
reported: tests/runtime/test_ray.py (on that module's Ray cluster, without a launch's node boots)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e.conftest import launch
from spotwise.utils.net import free_port

pytestmark = pytest.mark.slow

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "own-code"
STEPS = 400           # the preemption at 4 s lands mid-run on a loaded machine

# the reference: the task's training, each rank in a torchrun process (cwd: the workdir)
_REFERENCE = """
import json, os, sys
import torch.distributed as dist
from spotwise.runtime.checkpoint import run_storage
from spotwise.runtime.loop import LocalSession, run_loop
from spotwise.runtime.usercode import spec_for
from spotwise.taskspec import load_taskspec

spec = load_taskspec(sys.argv[1])
sys.path.insert(0, spec.workdir)          # as Ray's working_dir puts it on a node's path
os.environ.update(spec.env or {})
dist.init_process_group("gloo")
res = run_loop(spec_for(spec.training), LocalSession(), run_storage(sys.argv[2], "reference"))
dist.destroy_process_group()
if os.environ["RANK"] == "0":
    print(json.dumps({"steps": res.steps_completed, "model_sha256": res.model_sha256}))
"""


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


def _reference(task: Path, storage: Path) -> dict:
    nodes = yaml.safe_load(task.read_text())["resources"]["nodes"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")}
    env.update(GLOO_SOCKET_IFNAME="lo", SPOTWISE_HOME=str(storage.parent))
    script = storage.parent / "reference.py"
    script.write_text(_REFERENCE)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nodes),
                        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), str(task),
                        f"file://{storage}"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


def test_own_package_is_preempted_and_resumes_bitwise(tmp_path):
    assert importlib.util.find_spec("regress") is None       # only the workdir holds it
    task = _user_task(tmp_path)
    (tmp_path / "ref").mkdir()
    ref = _reference(task, tmp_path / "ref" / "ckpt")
    assert ref["steps"] == STEPS

    # a 5 s notice (the example's is 10): the JIT checkpoint takes about 1.5 s, and the ranks wait
    # out the rest of the notice before the node goes
    rep = launch(tmp_path / "run", task, "--preempt-at", "4", "--notice-seconds", "5",
                 "--storage", f"file://{tmp_path}/ckpt")
    assert rep["status"] == "succeeded", rep
    assert rep["steps_completed"] == rep["steps_total"] == STEPS     # the task's steps, not the spec's 300
    assert rep["preemptions"] == 1 and rep["resumes"] == 1
    assert rep["lost_steps"] == 0
    assert rep["model_sha256"] == ref["model_sha256"], "weights differ from the uninterrupted Ray-free run"
    kinds = [c["kind"] for c in rep["checkpoints"]]
    assert "preemption" in kinds and kinds[-1] == "final"
