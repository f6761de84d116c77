"""``spotwise up`` / ``down`` / ``gc`` as a user runs them: subprocesses against a real moto_server
on a free loopback port (killed at the end), checked through boto3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from emulator.moto_server import MotoServer
from spotwise.provisioner.base import TAG_CLUSTER

VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def moto_server():
    server = MotoServer()
    try:
        yield server.endpoint
    finally:
        server.close()


@pytest.fixture
def cli_env(moto_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SPOTWISE_"))}
    env.update({"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "SPOTWISE_AWS_REGIONS": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true", "SPOTWISE_HOME": str(tmp_path / "home")})
    ec2 = _ec2(env)
    env["SPOTWISE_AWS_AMI"] = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return env


def _ec2(env):
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def _running(env, cluster_id=None):
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    if cluster_id:
        filters.append({"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]})
    return [i for r in _ec2(env).describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def _spotwise(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spotwise.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _task(tmp_path, nodes=2) -> Path:
    p = tmp_path / "task.yaml"
    p.write_text(f"name: tiny-up\nresources:\n  accelerators: A100:8\n  nodes: {nodes}\n"
                 "  regions: [us-east-1]\n  market: spot\n")
    return p


def test_up_then_down_on_moto_server(cli_env, tmp_path):
    r = _spotwise(cli_env, "up", str(_task(tmp_path)), "--cloud", "aws", "--no-wait", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    cid = out["cluster_id"]
    assert cid.startswith("tiny-up-") and len(out["nodes"]) == 2
    for n in out["nodes"]:
        assert {"cloud", "instance_id", "instance_type", "region", "zone", "market", "usd_per_hour"} <= set(n)
        assert n["cloud"] == "aws" and n["instance_type"] == "p4d.24xlarge" and n["market"] == "spot"
        assert n["usd_per_hour"] > 0
    running = _running(cli_env, cid)
    assert sorted(i["InstanceId"] for i in running) == sorted(n["instance_id"] for n in out["nodes"])

    r = _spotwise(cli_env, "down", cid, "--cloud", "aws", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["ended"]) == 2
    assert _running(cli_env) == []


def test_gc_needs_all_without_a_store_and_then_ends_everything(cli_env, tmp_path):
    r = _spotwise(cli_env, "up", str(_task(tmp_path, nodes=1)), "--cloud", "aws", "--no-wait", "--format", "json")
    assert r.returncode == 0, r.stderr
    try:
        import spotwise.engine.state.store as store  # noqa: F401
        has_store = hasattr(store, "live_cluster_ids")
    except ImportError:
        has_store = False
    if not has_store:
        r = _spotwise(cli_env, "gc", "--cloud", "aws")
        assert r.returncode != 0 and "--all" in r.stderr and "Traceback" not in r.stderr
    r = _spotwise(cli_env, "gc", "--cloud", "aws", "--all", "--dry-run", "--format", "json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["ended"]) == 1
    assert len(_running(cli_env)) == 1
    r = _spotwise(cli_env, "gc", "--cloud", "aws", "--all", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert _running(cli_env) == []


def test_up_bad_input_is_a_clear_error(cli_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nresources:\n  accelerators: A100:8\n  regions: [mars-1]\n")
    r = _spotwise(cli_env, "up", str(bad), "--cloud", "aws", "--no-wait")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error:" in r.stderr
    r = _spotwise(cli_env, "up", str(_task(tmp_path)), "--cloud", "nimbus")
    assert r.returncode == 2 and "--cloud" in r.stderr
    assert _running(cli_env) == []
