"""The main job on an emulated AWS, end to end and offline.

AWS is a moto server on loopback; every instance it reports running becomes a local node that
executes the exact user-data spotwise gave EC2 (``tests/emulator``). The orchestrator is the
unchanged ``spotwise launch`` process: it plans from the catalog, provisions through EC2 Fleet
(failing over a capacity error), reaches the head's Jobs API at its private address, bills per
second at the prices EC2 quoted, replaces a preempted node and tears everything down.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

from e2e.helpers import assert_every_node_installed_the_launchers_build, checkpoint_committed, cloud_task, ledger, plan, run
from emulator.aws import EmulatedAws
from spotwise.provisioner.local import marked_pids

pytestmark = pytest.mark.slow


@pytest.fixture
def emu(tmp_path):
    with EmulatedAws(tmp_path / "aws") as e:
        yield e
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its instance"


def aws_task(tmp_path: Path, **over) -> Path:
    return cloud_task(tmp_path, ["aws"], ["us-east-1"], **over)


class PreemptAfterFirstCheckpoint:
    """Preempt one spot worker once a checkpoint is committed: EC2's notice, with a shorter window."""

    def __init__(self, notice_s: float = 12.0) -> None:
        self.notice_s = notice_s
        self.victim: str | None = None
        self.at: float | None = None          # when the notice was posted (Unix time)

    def __call__(self, emu: EmulatedAws) -> None:
        if self.victim is not None:
            return
        s3 = boto3.client("s3", endpoint_url=emu.endpoint, region_name=emu.region,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        if not checkpoint_committed(s3, emu.bucket):
            return
        workers = [i for i in emu.instances(("running",))
                   if {t["Key"]: t["Value"] for t in i["Tags"]}.get("spotwise-role") == "worker"
                   and i.get("InstanceLifecycle") == "spot"]
        if workers:
            self.victim = workers[0]["InstanceId"]
            self.at = time.time()
            emu.preempt(self.victim, notice_s=self.notice_s)


def test_aws_preemption_and_capacity_error_end_to_end(emu, tmp_path, reference):
    task = aws_task(tmp_path, budget_usd=5.0)
    p = plan(emu, tmp_path, task)
    chosen = p["chosen"]
    assert chosen["cloud"] == "aws" and chosen["market"] == "spot" and p["fallbacks"] and p["reason"]
    az = emu.zone_ids[chosen["zone"]]
    emu.set_no_capacity([f"{az}:spot"])              # the plan's first zone has no spot capacity
    preempt = PreemptAfterFirstCheckpoint()
    rep = run(emu, tmp_path, task, "--storage", "s3://ckpt/runs", during=preempt)

    assert rep["status"] == "succeeded", (rep["message"], (tmp_path / "launch.err").read_text()[-3000:])
    assert rep["cloud"] == "aws"
    assert rep["steps_completed"] == rep["steps_total"] == reference["steps_total"]
    assert rep["model_sha256"] == reference["model_sha256"], "weights differ from the uninterrupted local run"
    assert preempt.victim is not None
    assert rep["preemptions"] == 1 and rep["resumes"] >= 1
    assert rep["lost_steps"] <= rep["checkpoint_interval"]
    assert any(a["outcome"] == "capacity" and a["offer"] == chosen["cloud"] + "/" + chosen["region"] + "/"
               + chosen["zone"] + "/" + chosen["instance_type"] + "/spot" for a in rep["attempts"]), rep["attempts"]
    events = [e["event"] for e in rep["events"]]
    assert "preempted" in events and "replaced" in events

    # money: every node billed per second at the price EC2 quoted when it launched
    nodes, entries = ledger(rep)
    prices = json.loads(emu.prices_file.read_text())
    for iid, role, market, zone, usd, source in nodes:
        if market == "spot":
            assert usd == pytest.approx(prices["p4d.24xlarge"][zone]) and "DescribeSpotPriceHistory" in source
        else:
            assert role == "head" and usd > 0 and source
    by_node = {n[0]: n[4] for n in nodes}
    assert all(e[2] == by_node[e[0]] for e in entries if e[0] in by_node)
    assert {e[0] for e in entries if e[0] not in by_node} <= {f"{i}/{k}" for i in by_node for k in ("disk", "ipv4")}
    assert {f"{i}/disk" for i in by_node} <= {e[0] for e in entries}     # every node's disk billed too
    total = sum(e[1] * e[2] / 3600 for e in entries)
    assert rep["cost_usd"] == pytest.approx(total, abs=1e-6)
    assert rep["cost_usd"] <= rep["budget_usd"]

    # the boot script each node ran is byte for byte the user-data spotwise gave EC2
    assert len(emu.scripts) == len(nodes)
    for iid, script in emu.scripts.items():
        data = emu.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        import base64

        assert script == base64.b64decode(data)
        ran = (emu.workdir / "instances" / iid / "user-data").read_bytes()
        assert ran == script and rep["cluster_id"].encode() in ran
        assert "spotwise bootstrap done" in (emu.workdir / "instances" / iid / "state" / "bootstrap.log").read_text()
    assert_every_node_installed_the_launchers_build(emu)     # from a stock image, the wheel the launch shipped

    # what the run saw of spot is recorded for the next run there (spotwise.engine.spot_log): its spot
    # workers ran in the plan's region, so spot of that type there was obtainable for a while
    assert rep["spot_history"] is None                # the first run at this site: nothing recorded before
    import sqlite3

    con = sqlite3.connect(Path(rep["_home"]) / "spotwise.db")
    try:
        seen = con.execute("select cloud, region, instance_type, state, t_end - t_start from spot_observations "
                           "where job_id = ?", (rep["job_id"],)).fetchall()
    finally:
        con.close()
    up = [r for r in seen if r[3] == 1]
    assert up and {r[:3] for r in up} == {("aws", chosen["region"], chosen["instance_type"])}, seen
    assert sum(r[4] for r in up) > 10

    # nothing of ours is left in the cloud
    assert emu.leftovers() == {"instances": [], "volumes": [], "network_interfaces": [], "security_groups": []}
    assert not emu.errors
