"""End to end on the local cloud: a user's own package, shipped from a temporary directory as the
task's workdir (handed to Ray as the directory it is), trains through its ``make_spec``, is
preempted mid-run and ends with the weights of the same training without Ray and without a
preemption, losing no step (issue 31's "Done when", local cloud).

The same on the emulated AWS, with the workdir as a zip in the run's S3 storage and a move between
regions: tests/e2e/test_launch_aws.py. A Ray Train function (``training.train_func``) preempted
and resumed from the checkpoint it reported: tests/runtime/test_ray.py (on that module's Ray
cluster, without a launch's node boots)."""

from __future__ import annotations

import importlib.util

import pytest

from e2e import owncode
from e2e.conftest import launch

pytestmark = pytest.mark.slow

STEPS = 400


def test_own_package_is_preempted_and_resumes_bitwise(tmp_path):
    assert importlib.util.find_spec("regress") is None       # only the workdir holds it
    task = owncode.user_task(tmp_path, steps=STEPS, interval=100)
    ref = owncode.reference(task, tmp_path / "ref" / "ckpt")
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
    assert not [e for e in rep["events"] if e["event"] == "workdir_staged"]   # the local cloud: the directory as is
