"""A budget stop on a Slurm site, at the level the clouds' budget stops are tested
(tests/engine/run/test_orchestrator_run.py: the orchestrator's own parts, recording fakes of the head's
Jobs API and control endpoint and of the runner's lease), but with the real ``slurm`` site on the
test cluster: training is asked to stop at a checkpoint while the jobs still run, then every job of
the run is ``scancel``\\ led, and the run is ``budget_exhausted`` within its budget."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from emulator.base import stock_image_python
from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.provisioner.clouds.slurm.cloud import SlurmCloud
from spotwise.runtime.node.job import RESULT_PREFIX, SNAPSHOT_PREFIX
from spotwise.taskspec import parse_taskspec

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "engine"))
from orchestrator_fakes import Control, Jobs, Lease  # noqa: E402

pytestmark = pytest.mark.usefixtures("local_home")


class StopsAtACheckpoint(Jobs):
    """Training that runs until asked to stop, then saves a ``stop`` checkpoint and ends."""

    def get_job_status(self, sid: str) -> str:
        return "JobStatus.SUCCEEDED" if self.stop_requested else "JobStatus.RUNNING"

    def get_job_logs(self, sid: str) -> str:
        uri = "file:///ckpt/runs/r/checkpoints/000004"
        result = {"steps_completed": 4, "final_checkpoint": uri, "model_sha256": None, "stopped": "budget"}
        snap = {"step": 4, "started_at": 1.0, "checkpoints": [{"step": 4, "kind": "stop", "uri": uri}]}
        return f"{SNAPSHOT_PREFIX}{json.dumps(snap)}\n{RESULT_PREFIX}{json.dumps(result)}\n"


def test_a_budget_stop_on_slurm_checkpoints_then_scancels_every_job(slurm_cluster, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"slurm": {"clusters": [{
        "name": "lab", "slurm_conf": str(slurm_cluster.conf), "python": str(stock_image_python()),
        "partitions": {"preemptible": {"price_per_gpu_hour": 0.4}, "priority": {"price_per_gpu_hour": 1.6}}}]}}))
    monkeypatch.setenv("SPOTWISE_CONFIG", str(config))
    monkeypatch.setenv("SPOTWISE_SLURM_NODE_DIR", str(tmp_path / "nodes"))
    spec = parse_taskspec({"name": "r", "budget_usd": 1.0, "training": {"steps": 10, "batch_size": 16},
                           "resources": {"accelerators": "H100:8", "nodes": 2, "clouds": ["slurm"], "market": "spot"}})
    opts = LaunchOptions(tick_s=0.05, policy_interval_s=0.5, storage=f"file://{tmp_path / 'ckpt'}")
    log: list = []
    jobs = StopsAtACheckpoint(log)
    running_at_stop: list[list[str]] = []

    class RecordingControl(Control):
        def request_stop(self, reason: str) -> None:
            running_at_stop.append(slurm_cluster.jobs())         # the jobs still run when training is asked
            super().request_stop(reason)

    holder: dict = {}
    make = Factories(cloud=lambda name: SlurmCloud.for_task(spec, opts),
                     lease=lambda job_id, budget: Lease(log, holder["o"].job_id),
                     jobs_client=lambda url, headers: jobs,
                     control=lambda url, token: RecordingControl(log, jobs, url))
    o = holder["o"] = Orchestrator(spec, opts, factories=make)
    # a billing minute more of both nodes ($6.40/h) would pass $1; the hard stop's margin would not
    o.purse.ledger.spend = lambda now=None: 0.95
    try:
        rep = o.run()
        deadline = time.monotonic() + 30       # a cancelled job may linger COMPLETING for KillWait
        while slurm_cluster.jobs() and time.monotonic() < deadline:
            time.sleep(0.25)
        left = slurm_cluster.jobs()
    finally:
        slurm_cluster.cancel_all()
    assert rep["status"] == "budget_exhausted" and not o.purse.hard_stopped, rep["message"]
    assert [x for x in log if x[0] == "request_stop"] == [("request_stop", "budget")]
    assert len(running_at_stop) == 1 and len(running_at_stop[0]) == 2          # the head's job, the workers'
    assert rep["final_checkpoint"].endswith("/000004") and rep["checkpoints"][-1]["kind"] == "stop"
    # then the run's teardown scancelled every job of it (before the test's own cleanup ran)
    assert left == [] and o.fleet.nodes == {} and o.purse.ledger.open_ids() == []
    kinds = [e["event"] for e in rep["events"]]
    assert "budget_stop_requested" in kinds and "budget_hard_stop" not in kinds
