"""The end-to-end tests' task (``tests/e2e/task.yaml``) is the README's main job at test size: it
differs from ``examples/tiny-gpt.yaml`` in the model's dimensions, the time of its scheduled
preemption and its batch only: the emulated clouds' runs plan it on ``A100:8`` x 2 nodes (Slurm's on
``H100:8`` x 2), 16 ranks, which a batch of 8 cannot feed (``spotwise.engine.plan.ranks``, issue 49).
Fast: no cluster."""

from __future__ import annotations

import yaml

from e2e.helpers import EXAMPLE, README_JOB
from spotwise.taskspec import load_taskspec


def test_the_e2e_task_is_the_main_job_with_a_smaller_model() -> None:
    ours, theirs = yaml.safe_load(EXAMPLE.read_text()), yaml.safe_load(README_JOB.read_text())
    assert ours["training"].pop("model") != theirs["training"].pop("model")
    assert ours["local"].pop("preempt_at") < theirs["local"].pop("preempt_at")
    assert ours["training"].pop("batch_size") % 16 == 0 and theirs["training"].pop("batch_size") == 8
    assert ours == theirs
    spec = load_taskspec(EXAMPLE)       # and it is a valid task file
    assert spec.training.model.d_model < load_taskspec(README_JOB).training.model.d_model
