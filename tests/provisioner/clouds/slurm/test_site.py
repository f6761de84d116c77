"""A Slurm cluster as a site of the plan: against the real test cluster (discovery, offers, the
queue in ``launch --dry-run``, ``spotwise prices --cloud slurm``), and the one-line refusals of a
cluster that cannot be asked or a config that does not match it."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from slurm_helpers import run_cli, write_config
from spotwise.config import SlurmClusterConfig
from spotwise.provisioner.clouds.slurm.cloud import SlurmCloud

TASK = {
    "name": "slurm-gpt",
    "resources": {"accelerators": "H100:8", "nodes": 2, "clouds": ["slurm"], "market": "auto"},
    "training": {"entrypoint": "tiny-gpt", "model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "seq_len": 64},
                 "steps": 40, "batch_size": 16,
                 "checkpoint": {"storage": "s3://bucket/ckpt", "interval_steps": 10, "keep_last": 2}},
    "budget_usd": 100.0,
    "deadline_hours": 2,
}


def _task(tmp_path, **resources):
    t = json.loads(json.dumps(TASK))
    t["resources"].update(resources)
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(t))
    return str(path)


def _lab(conf: str | None = None, ssh: str | None = None, **partitions) -> dict:
    return {"name": "lab", "slurm_conf": conf, "ssh": ssh,
            "partitions": {k: {"price_per_gpu_hour": v} for k, v in (partitions or
                                                                     {"preemptible": 0.4, "priority": 1.6}).items()}}


def test_the_live_cluster_is_discovered_and_offered(slurm_cluster):
    cloud = SlurmCloud([SlurmClusterConfig.model_validate(_lab(str(slurm_cluster.conf)))])
    offers = {o.zone: o for o in cloud.offers()}
    assert cloud.skipped_regions == {}
    assert {z: (o.market.value, o.instance_type, o.usd_per_hour) for z, o in offers.items()} == {
        "preemptible": ("spot", "gpu:h100:8", pytest.approx(3.2)),
        "priority": ("on-demand", "gpu:h100:8", pytest.approx(12.8))}
    assert cloud.notice_window_for(offers["preemptible"]) == 20.0
    assert cloud.notice_window_for(offers["priority"]) is None
    q = cloud.queue(offers["preemptible"], 2)
    assert q is not None and q.pending == 0 and q.start is not None     # sbatch --test-only's estimate
    assert q.wait_hours() is not None and q.wait_hours() < 0.1
    assert slurm_cluster.jobs() == []                                    # --test-only submitted nothing


def test_prices_and_dry_run_show_the_cluster(slurm_cluster, tmp_path):
    cfg = write_config(tmp_path / "config.yaml", [_lab(str(slurm_cluster.conf))])
    out = run_cli("prices", "--cloud", "slurm", "--format", "json", home=tmp_path, config=cfg)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["zone"], r["market"], r["usd_per_hour"]) for r in rows] == [
        ("preemptible", "spot", 3.2), ("priority", "on-demand", 12.8)]
    out = run_cli("launch", _task(tmp_path), "--dry-run", "--format", "json", home=tmp_path, config=cfg)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    chosen = plan["chosen"]
    assert (chosen["cloud"], chosen["region"], chosen["zone"], chosen["market"]) == ("slurm", "lab", "preemptible", "spot")
    assert chosen["queue"].startswith("queue: 0 job(s) pending in the partition; Slurm's estimate: starts ")
    assert [f["zone"] for f in plan["fallbacks"]] == ["priority"]
    out = run_cli("launch", _task(tmp_path), "--dry-run", home=tmp_path, config=cfg)
    assert out.returncode == 0 and "queue: 0 job(s) pending" in " ".join(out.stdout.split())


def test_a_partition_the_cluster_lacks_is_named_with_exit_2(slurm_cluster, tmp_path):
    cfg = write_config(tmp_path / "config.yaml", [_lab(str(slurm_cluster.conf), preemptible=0.4, gpu_low=0.2)])
    out = run_cli("prices", "--cloud", "slurm", home=tmp_path, config=cfg)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "slurm.clusters.0.partitions.gpu_low" in out.stderr and "preemptible, priority" in out.stderr


def test_a_cluster_that_cannot_be_asked_is_skipped_in_one_line(tmp_path):
    cfg = write_config(tmp_path / "config.yaml", [_lab(ssh="nobody@127.0.0.1")])
    for args in (["prices", "--cloud", "slurm"], ["launch", _task(tmp_path), "--dry-run"]):
        out = run_cli(*args, home=tmp_path, config=cfg)
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr and "internal error" not in out.stderr
        assert "slurm.clusters.0" in out.stderr and "ssh to nobody@127.0.0.1 failed" in out.stderr


def test_an_unreachable_cluster_beside_a_cloud_is_named_and_the_cloud_plans(tmp_path):
    cfg = write_config(tmp_path / "config.yaml", [_lab(ssh="nobody@127.0.0.1")])
    # AWS nodes' identity is set, so the plan meets only the Slurm site's problem
    out = run_cli("launch", _task(tmp_path, clouds=["slurm", "aws"]), "--dry-run", "--format", "json",
                  home=tmp_path, config=cfg, SPOTWISE_AWS_INSTANCE_PROFILE="spotwise-node")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["chosen"]["cloud"] == "aws"
    assert "ssh to nobody@127.0.0.1 failed" in plan["sites_not_ranked"]["slurm/lab"]


def test_a_partition_that_would_start_the_job_too_late_for_its_deadline_ranks_as_late(slurm_cluster, tmp_path):
    cfg = write_config(tmp_path / "config.yaml", [_lab(str(slurm_cluster.conf))])
    # a day-long job of the priority partition holds every GPU of both nodes: Slurm's own estimate
    # for ours is its end, a day away, past the task's 2-hour deadline
    job = slurm_cluster.run("sbatch", "--parsable", "-p", "priority", "--nodes=2", "--gres=gpu:h100:8",
                            "--time=1-00:00:00", "--output=/dev/null", "--wrap", "sleep 86400").stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the blocking job never ran"
            time.sleep(0.2)
        out = run_cli("launch", _task(tmp_path), "--dry-run", "--format", "json", home=tmp_path, config=cfg)
    finally:
        slurm_cluster.cancel_all()
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    for p in [plan["chosen"], *plan["fallbacks"]]:
        assert any(n.startswith("would start too late for the deadline") for n in p["notes"]), p
    assert "no offer fits the budget and deadline" in plan["reason"]
