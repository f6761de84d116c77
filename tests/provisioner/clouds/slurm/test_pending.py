"""How long a launch waits for its Slurm job to leave the queue: from the task's deadline, when it
has one (what the deadline leaves after the estimated run time, bounded), else the fixed default."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.clouds.slurm.cloud import SlurmCloud
from spotwise.provisioner.clouds.slurm.launch import MAX_PENDING_S, MIN_PENDING_S, pending_allowance
from spotwise.taskspec import parse_taskspec

H100 = Offer(cloud="slurm", instance_type="gpu:h100:8", accelerator="H100", accelerator_count=8, region="lab",
             zone="preemptible", market=Market.SPOT, usd_per_hour=3.2, source="config", as_of="2026-11-28")


@pytest.mark.parametrize("left,run,want", [
    (None, 600.0, 300.0),                  # no deadline: the default
    (7200.0, None, 300.0),                 # no estimate: the default
    (7200.0, 6000.0, 1200.0),              # what the deadline leaves after the run
    (7200.0, 7190.0, MIN_PENDING_S),       # a tight deadline: a short look at the queue
    (3600.0, 7200.0, MIN_PENDING_S),       # one the run no longer fits: the same
    (90000.0, 600.0, MAX_PENDING_S),       # a far deadline parks no launch for hours
])
def test_the_wait_is_what_the_deadline_leaves_after_the_run_bounded(left, run, want):
    assert pending_allowance(default_s=300.0, deadline_left_s=left, run_s=run) == want


def _spec(**over):
    data = {"name": "r", "resources": {"accelerators": "H100:8", "nodes": 2, "clouds": ["slurm"]},
            "training": {"steps": 200}}
    data.update(over)
    return parse_taskspec(data)


def test_a_task_with_a_deadline_waits_what_its_deadline_leaves_and_one_without_the_default(tmp_path):
    opts = SimpleNamespace(storage=f"file://{tmp_path}")
    plain = SlurmCloud.for_task(_spec(), opts)
    assert plain.pending_for(H100, 2) == plain.pending_s == 300.0
    assert plain.node_build is not None and plain.node_build.storage_uri == f"file://{tmp_path}"  # the build ships
    cloud = SlurmCloud.for_task(_spec(deadline_hours=0.5), opts)
    assert cloud.deadline_at == pytest.approx(time.time() + 1800, abs=60)
    run_s = cloud.run_seconds(H100, 2)
    assert 0 < run_s < 1800 - MIN_PENDING_S                  # the built-in model on 16 H100s: seconds
    assert cloud.pending_for(H100, 2) == pytest.approx(min(MAX_PENDING_S, 1800 - run_s), abs=60)
    cloud.deadline_at = time.time() + run_s + 90              # the deadline leaves 90 s after the run
    assert cloud.pending_for(H100, 2) == pytest.approx(90, abs=5)
