"""End to end on a real Slurm cluster (issue 36): the main job on two nodes of the preemptible
partition, preempted mid-run by a job of the priority partition, checkpointed inside the grace
time, replaced, and ending with the weights of the uninterrupted run; billed at the configured
price; nothing of ours left in ``squeue``.

Where OpenSSH is installed (tests/sshd.py) the launch runs as from a laptop that reaches only the
cluster's login host: the config names the cluster with ``ssh: root@127.0.0.1`` (a private sshd in
front of the test cluster), so every Slurm command and the batch script go over ssh and the
orchestrator reaches the head through ssh port forwards, which are gone when the run is. Without
OpenSSH it runs on the cluster's own machine (the direct path is also covered by tests/provisioner/clouds/slurm)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from e2e.conftest import EXAMPLE, launch
from e2e.helpers import ledger
from emulator.base import stock_image_python
from slurm_cluster import jobs_builds, nodes_from_wheel
from sshd import missing as sshd_missing
from spotwise.build import build_id

# generous bounds, never timings: on a machine 1.5x slower (2026-12-06) the first attempt's nodes took
# over 100 s to install the build and start training, and the launch outlived 300 s by its teardown
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_main_job_preempted_on_slurm_resumes_bitwise_and_is_billed_at_the_configured_price(
        slurm_cluster, reference, tmp_path, request):
    server = None if sshd_missing() else request.getfixturevalue("sshd")
    env = dict(server.env if server else os.environ)
    config = tmp_path / "config.yaml"
    # the nodes' base Python: the emulators' stock image (torch and Ray, no spotwise), so every node
    # must install the build the launch shipped through the run's storage
    config.write_text(yaml.safe_dump({"slurm": {"clusters": [{
        "name": "lab", "slurm_conf": str(slurm_cluster.conf), "python": str(stock_image_python()),
        "ssh": server.destination if server else None,
        "partitions": {"preemptible": {"price_per_gpu_hour": 0.4}, "priority": {"price_per_gpu_hour": 1.6}}}]}}))
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["resources"] = {"accelerators": "H100:8", "nodes": 2, "clouds": ["slurm"], "market": "spot"}
    spec.pop("local")
    task = tmp_path / "slurm.yaml"
    task.write_text(yaml.safe_dump(spec))
    ckpt = tmp_path / "ckpt"

    preempted_at: list[float] = []

    def preempt_after_the_first_checkpoint() -> None:
        # mid-run: once a periodic checkpoint (step 20 of 200) is committed, a job of the priority
        # partition asks for every GPU of both nodes; slurmctld preempts ours for it
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and not list(ckpt.glob("*/checkpoints/step_*/COMMITTED")):
            time.sleep(0.2)
        preempted_at.append(time.time())
        slurm_cluster.run("sbatch", "-p", "priority", "--nodes=2", "--gres=gpu:h100:8", "-J", "priority-job",
                          "--output=/dev/null", "--wrap", "sleep 2")

    t = threading.Thread(target=preempt_after_the_first_checkpoint, daemon=True)
    t.start()
    node_dir = tmp_path / "nodes"         # the nodes' venvs and install logs (sbatch exports it to them)
    rep = launch(tmp_path, task, "--storage", f"file://{ckpt}", timeout=800,
                 env=dict(env, SPOTWISE_CONFIG=str(config), SPOTWISE_SLURM_NODE_DIR=str(node_dir)))
    t.join(5)
    rep["_home"] = str(tmp_path)
    assert preempted_at, "the run ended before its first checkpoint"
    assert rep["status"] == "succeeded", rep
    assert rep["steps_completed"] == rep["steps_total"] == reference["steps_total"]
    assert rep["preemptions"] >= 1 and rep["resumes"] >= 1
    kinds = [c["kind"] for c in rep["checkpoints"]]
    assert "preemption" in kinds, kinds            # written inside the grace time, on Slurm's signal
    assert rep["lost_steps"] == 0
    assert rep["model_sha256"] == reference["model_sha256"]
    # no shared filesystem assumed: each node installed the launcher's build, shipped as a wheel
    # through the run's storage and checked by its sha256, into a venv of its own; every job on a
    # node ran that build (installed then, or found installed by an earlier job on the node)
    installed = nodes_from_wheel(node_dir)
    assert set(installed) == {"n1", "n2"} and {b for b, _ in installed.values()} == {build_id()}, installed
    assert len({sha for _, sha in installed.values()}) == 1
    reported = jobs_builds(node_dir)
    assert len(reported) >= 5 and all(b == [build_id()] for b in reported.values()), reported
    # billed per second at the configured price: $0.40 per GPU-hour x 8 GPUs a node; the head, no GPU, $0
    nodes, entries = ledger(rep)
    assert {(role, market, zone, price) for _, role, market, zone, price, _ in nodes} == {
        ("head", "on-demand", "priority", 0.0), ("worker", "spot", "preemptible", 3.2)}
    assert len([n for n in nodes if n[1] == "worker"]) >= 4        # two, then their two replacements
    assert {src for _, role, *_, src in nodes if role == "worker"} == {
        f"config {config}: slurm.clusters.0.partitions.preemptible.price_per_gpu_hour"}
    assert sum(usd for *_, usd in entries) == pytest.approx(rep["cost_usd"], abs=1e-6)
    assert all(usd == pytest.approx(seconds * rate / 3600, abs=1e-9) for _, seconds, rate, usd in entries)
    # nothing of ours left queued or running (a cancelled job may linger as COMPLETING for KillWait)
    deadline = time.monotonic() + 30
    while slurm_cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert slurm_cluster.jobs() == []
    if server:           # over ssh: the run's tunnel went with it (the launch's process is gone, and so is its ssh)
        marker = f"SPOTWISE_SSH_TUNNEL={rep['cluster_id']}".encode()
        assert not [p for p in Path("/proc").glob("[0-9]*") if _has(p, marker)], "an ssh tunnel outlived the run"


def _has(proc: Path, marker: bytes) -> bool:
    try:
        return marker in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
