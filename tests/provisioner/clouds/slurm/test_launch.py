"""Launching on the real test cluster: one job per request, Ray across the allocation, our jobs
found by their tags and ended by ``scancel``; refusals typed; nothing left queued."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from emulator.base import stock_image_python
from slurm_cluster import jobs_builds, nodes_from_wheel
from spotwise.build import build_id
from spotwise.config import SlurmClusterConfig
from spotwise.provisioner.base import CapacityError, LaunchRequest
from spotwise.provisioner.boot.shipping import NodeBuild
from spotwise.provisioner.clouds.slurm.cloud import SlurmCloud
from spotwise.provisioner.clouds.slurm.launch import ended_state


@pytest.fixture
def node_dir(tmp_path, monkeypatch) -> Path:
    """Where this test's Slurm nodes keep their venvs and install logs (sbatch exports it to them)."""
    d = tmp_path / "nodes"
    monkeypatch.setenv("SPOTWISE_SLURM_NODE_DIR", str(d))
    return d


def _cloud(slurm_cluster, store: Path | None = None) -> SlurmCloud:
    """The test cluster as a site; its nodes' base Python is the emulators' stock image (torch and
    Ray, no spotwise) and they install the build shipped through ``store``."""
    cloud = SlurmCloud([SlurmClusterConfig.model_validate({
        "name": "lab", "slurm_conf": str(slurm_cluster.conf), "python": str(stock_image_python()),
        "partitions": {"preemptible": {"price_per_gpu_hour": 0.4}, "priority": {"price_per_gpu_hour": 1.6}}})])
    if store is not None:
        cloud.node_build = NodeBuild(f"file://{store}", work_dir=store.parent / "dist")
    return cloud


def _until(what, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout} s: {what}")


def _alive_ray_nodes(cloud, cluster_id, head) -> int:
    ep = cloud.endpoint(cluster_id, head)
    try:
        req = urllib.request.Request(ep.dashboard_url + "/nodes?view=summary", headers=ep.headers)
        nodes = json.load(urllib.request.urlopen(req, timeout=2))["data"]["summary"]
    except OSError:
        return 0
    return sum(n["raylet"]["state"] == "ALIVE" for n in nodes)


def test_a_head_and_two_workers_install_the_shipped_build_form_one_ray_cluster_and_scancel_ends_them(
        slurm_cluster, node_dir, tmp_path):
    cloud = _cloud(slurm_cluster, tmp_path / "store")
    spot = next(o for o in cloud.offers() if o.zone == "preemptible")
    head_offer = cloud.head_offer("lab", "preemptible")
    assert (head_offer.zone, head_offer.usd_per_hour) == ("priority", 0.0)    # the head is never preempted
    [head] = cloud.launch(LaunchRequest(cluster_id="swt1", job_id="j1", offer=head_offer, role="head"))
    workers = cloud.launch(LaunchRequest(cluster_id="swt1", job_id="j1", offer=spot, count=2))
    try:
        assert sorted(w.extra["slurm_node"] for w in workers) == ["n1", "n2"]
        assert [w.usd_per_hour for w in workers] == [pytest.approx(3.2)] * 2
        assert _until(lambda: _alive_ray_nodes(cloud, "swt1", head) == 3)
        # no shared filesystem assumed: each node installed the wheel shipped through the run's
        # storage into its own venv over the stock Python (the head's job and a worker's share n1:
        # one installs, the other finds it installed)
        installed = nodes_from_wheel(node_dir)
        assert set(installed) == {"n1", "n2"} and {b for b, _ in installed.values()} == {build_id()}, installed
        assert len({s for _, s in installed.values()}) == 1
        reported = jobs_builds(node_dir)
        assert len(reported) == 3 and all(b == [build_id()] for b in reported.values()), reported
        listed = {n.instance_id: (n.role, n.market, n.usd_per_hour) for n in cloud.list_nodes("swt1")}
        assert listed == {head.instance_id: ("head", "on-demand", 0.0),
                          **{w.instance_id: ("worker", "spot", 3.2) for w in workers}}
        assert cloud.list_nodes("another-cluster") == []
        # the signal Slurm sends GraceTime before the time limit (and at a preemption): the batch
        # shell writes the kill's deadline, each node's watcher reads it as a notice and drains
        job = workers[0].extra["slurm_job"]
        before = time.time()
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
        notice = Path(f"/tmp/sw-swt1-{job}.notice")
        deadline_ms = int(_until(lambda: notice.is_file() and notice.read_text().strip()))
        assert before * 1000 + 20_000 <= deadline_ms <= time.time() * 1000 + 20_000    # GraceTime=20
        for w in workers:
            log = Path(f"/tmp/sw-swt1-{job}-{w.extra['slurm_node']}/watch.log")
            assert _until(lambda: log.is_file() and "drain accepted" in log.read_text())
    finally:
        cloud.terminate([head, *workers])
    assert _until(lambda: slurm_cluster.jobs() == [])
    assert cloud.list_nodes("swt1") == [] and ended_state(cloud.runner("lab"), workers[0].extra["slurm_job"]) \
        in ("CANCELLED", "UNKNOWN")


def test_refusals_are_typed_and_leave_nothing_queued(slurm_cluster, tmp_path):
    cloud = _cloud(slurm_cluster, tmp_path / "store")
    spot = next(o for o in cloud.offers() if o.zone == "preemptible")
    head = cloud.head_offer("lab", "preemptible")
    # a head this process launched (the refusals come before any node would join it)
    cloud._heads["swt2"] = {"gcs": 1, "dashboard": 2, "control": 3, "token": "t", "head_ip": "127.0.0.1"}
    nine = dataclasses.replace(spot, instance_type="gpu:h100:9")           # more GPUs than a node has
    with pytest.raises(CapacityError, match="Requested node configuration is not available") as e:
        cloud.launch(LaunchRequest(cluster_id="swt2", job_id="j2", offer=nine, count=1))
    assert e.value.code == "impossible" and e.value.offer_key == nine.key
    with pytest.raises(CapacityError, match="would never start here") as e:   # 3 nodes of a 2-node partition
        cloud.launch(LaunchRequest(cluster_id="swt2", job_id="j2", offer=spot, count=3))
    assert slurm_cluster.jobs() == []
    assert head.zone == "priority"


def test_gc_finds_a_queued_job_of_ours_by_its_tags_and_cancels_it(slurm_cluster):
    cloud = _cloud(slurm_cluster)
    tags = "spotwise-cluster=swgone,spotwise-job=j3,spotwise-role=worker,spotwise-market=spot"
    slurm_cluster.run("sbatch", "-p", "preemptible", "--begin=now+1hour", f"--comment={tags}", "-J", "sw-swgone-worker",
                      "--output=/dev/null", "--wrap", "sleep 600")
    slurm_cluster.run("sbatch", "-p", "preemptible", "--begin=now+1hour", "-J", "not-ours", "--output=/dev/null",
                      "--wrap", "sleep 600")
    try:
        assert cloud.leftovers({"swgone"}, match=False, dry_run=True) == []          # gc: another cluster's only
        [line] = cloud.leftovers({"swlive"}, match=False, dry_run=False)
        assert "of cluster swgone" in line and "PENDING" in line
        [left] = _until(lambda: slurm_cluster.jobs() if len(slurm_cluster.jobs()) == 1 else None)
        assert ended_state(cloud.runner("lab"), left).startswith("PENDING")           # someone else's: untouched
    finally:
        slurm_cluster.cancel_all()


def test_the_dead_mans_switch_ends_its_own_job(slurm_cluster):
    code = "from spotwise.runtime.node.deadman import end_self; end_self('slurm', 'test: the lease ran out')"
    job = slurm_cluster.run("sbatch", "--parsable", "-p", "priority", "--output=/dev/null",
                            "--wrap", f"{sys.executable} -c \"{code}\"; sleep 600").stdout.strip()
    assert _until(lambda: job not in slurm_cluster.jobs() and slurm_cluster.jobs() == [])
    assert ended_state(_cloud(slurm_cluster).runner("lab"), job) == "CANCELLED"
