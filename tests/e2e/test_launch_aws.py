"""A user's own package on an emulated AWS, end to end and offline: a capacity error, a
preemption, a move to the next region, an exact resume (one run; see the test's docstring).

AWS is a moto server on loopback; every instance it reports running becomes a local node that
executes the exact user-data spotwise gave EC2 (``tests/emulator``). The orchestrator is the
unchanged ``spotwise launch`` process: it plans from the catalog, provisions through EC2 Fleet
(failing over a capacity error), reaches the head's Jobs API as from a laptop (ssh port forwards to
the head's public address, a real sshd per emulated head that admits only the cluster's port-22
rule's address and the key the head's user data authorized), bills per
second at the prices EC2 quoted, replaces a preempted node (or moves the job to the next region when
the node's region has no spot left) and tears everything down.

The launcher is outside the cloud's network (issue 48 item 3): each region's nodes run in a network
namespace the emulator makes (:mod:`emulator.netns`: a ``/22`` VPC per region and the public
addresses from ``198.18.0.0/15``; the IMDS and moto relayed in at their ``127.0.0.1`` URLs). While
the run goes on, each region's head is tried directly at its dashboard port: a connection made inside its
region connects, the same from this process fails (no route); so the launch that succeeds, in both
regions, through the heads' sshds is one whose heads the launcher could not reach directly. Where
``ip netns`` is not permitted (not root) the nodes stay on loopback and that assertion is skipped,
saying why in the test's output.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from e2e import owncode as own_code
from e2e.helpers import (assert_every_node_installed_the_launchers_build, checkpoint_committed, launch_env, ledger,
                         plan, run_cli)
from emulator import netns
from emulator.aws import EmulatedAws
from spotwise.provisioner.clouds.local.cloud import marked_pids

pytestmark = pytest.mark.slow

NOTHING = {"instances": [], "volumes": [], "network_interfaces": [], "security_groups": []}


REGIONS = ("us-east-1", "us-east-2")
TOKENS = "s3://ckpt/data/tokens.bin"


@pytest.fixture
def emu(tmp_path):
    with EmulatedAws(tmp_path / "aws", regions=REGIONS, netns=netns.missing() is None) as e:
        yield e
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its instance"


class PreemptAfterFirstCheckpoint:
    """Preempt one spot worker once a checkpoint is committed: EC2's notice, with a shorter window."""

    def __init__(self, notice_s: float = 12.0) -> None:
        self.notice_s = notice_s
        self.victim: str | None = None
        self.region: str | None = None        # the victim's region
        self.at: float | None = None          # when the notice was posted (Unix time)
        self._s3 = None

    def __call__(self, emu: EmulatedAws) -> None:
        if self.victim is not None:
            return
        if self._s3 is None:
            self._s3 = boto3.client("s3", endpoint_url=emu.endpoint, region_name=emu.region,
                                    aws_access_key_id="testing", aws_secret_access_key="testing")
        if not checkpoint_committed(self._s3, emu.bucket):
            return
        workers = [i for i in emu.instances(("running",))
                   if {t["Key"]: t["Value"] for t in i["Tags"]}.get("spotwise-role") == "worker"
                   and i.get("InstanceLifecycle") == "spot"]
        if workers:
            self.victim, self.region = workers[0]["InstanceId"], workers[0]["Region"]
            self.at = time.time()
            emu.preempt(self.victim, notice_s=self.notice_s)


def test_own_code_on_aws_fails_over_is_preempted_moves_region_and_resumes_bitwise(emu, tmp_path):
    """The whole AWS path, with a user's own package (issue 31) and a move between regions, in one run:

    * the task's workdir is zipped into the run's S3 storage once, before any node is paid for,
      and every node of both clusters trains from it (the code's module checks the task's ``env``);
    * the code trains on the task's ``training.data``, a token file in S3 that each node fetches
      with its instance profile's credentials (``spotwise.train.token_batches``);
    * the plan's first zone answers InsufficientInstanceCapacity, so the launch fails over;
    * after the first committed checkpoint a spot worker gets EC2's interruption notice, and its
      region runs out of spot for good: the replacement is refused there, so the orchestrator ends
      that cluster, brings one up in the other region, resubmits, and training resumes from the
      notice's just-in-time checkpoint without losing a step;
    * the weights equal those of the same training run without Ray and without interruption;
    * every node booted a stock image and installed the wheel the launch shipped; each ran byte for
      byte the user-data spotwise gave EC2; every node and disk is billed per second at the price EC2
      quoted when it launched, within the budget; nothing of ours is left in either region.

    (This was two runs before: the AWS path with the built-in model, and the move between regions.
    The own package on the local cloud, its workdir handed over as a directory: test_launch.py.)"""
    # the data: a token file that `spotwise data tokenize` writes straight to S3, which the user's
    # make_spec reads through spotwise.train.token_batches (issue 32: the token file read from S3 on
    # the emulated AWS, by nodes whose only credentials are their instance profile's)
    stdlib = Path(json.__file__).parent
    subprocess.run([sys.executable, "-m", "spotwise.cli", "data", "tokenize", *map(str, sorted(stdlib.glob("*.py"))),
                    TOKENS], env=launch_env(emu, tmp_path), check=True, capture_output=True, text=True)
    task = own_code.user_task(tmp_path, steps=600, interval=100, budget_usd=5.0, local=None,
                              resources={"accelerators": "A100:8", "clouds": ["aws"], "regions": list(REGIONS),
                                         "market": "spot"},
                              training={"data": {"uri": TOKENS}, "config": {**own_code.CONFIG, "on_tokens": True}})
    ref = own_code.reference(task, tmp_path / "ref" / "ckpt", env=emu.env())
    assert ref["steps"] == 600

    p = plan(emu, tmp_path, task)
    chosen = p["chosen"]
    assert chosen["cloud"] == "aws" and chosen["market"] == "spot" and p["fallbacks"] and p["reason"]
    assert p["workdir"]["sha256"], p.get("workdir")
    no_capacity = [f"{emu.zone_ids[chosen['zone']]}:spot"]
    emu.set_no_capacity(no_capacity)                  # the plan's first zone has no spot capacity
    preempt = PreemptAfterFirstCheckpoint(notice_s=8.0)
    env = launch_env(emu, tmp_path)
    # each head's dashboard (the launcher's forward goes there through the sshd), at its private address
    direct = netns.DirectProbe(emu.nets, int(env["SPOTWISE_RAY_DASHBOARD_PORT"])) if emu.nets else None

    def during(e: EmulatedAws) -> None:
        preempt(e)
        if direct is not None:
            direct(e.heads_in_netns())
        if preempt.region is not None and f"{preempt.region}*:spot" not in no_capacity:
            no_capacity.append(f"{preempt.region}*:spot")     # the victim's region is out of spot for good
            e.set_no_capacity(no_capacity)

    rep = run_cli(emu, tmp_path, ["launch", str(task), "--storage", "s3://ckpt/runs"], during=during, env=env)
    assert rep["status"] == "succeeded", (rep["message"], (tmp_path / "launch.err").read_text()[-3000:])
    assert preempt.victim is not None
    [other] = [r for r in REGIONS if r != preempt.region]

    # training: the task's steps, resumed once from the notice's checkpoint, nothing lost, the same weights
    assert rep["steps_completed"] == rep["steps_total"] == 600            # the task's steps, not the spec's 300
    assert rep["model_sha256"] == ref["model_sha256"], "weights differ from the uninterrupted Ray-free run"
    assert rep["preemptions"] == 1 and rep["resumes"] >= 1
    assert rep["lost_steps"] == 0
    kinds = [c["kind"] for c in rep["checkpoints"]]
    assert "preemption" in kinds and kinds[-1] == "final"

    # the capacity error at launch; then the replacement, asked for at the victim's notice (issue 51)
    # while it still ran, refused in its region; then, once its cloud had taken it (the preemption,
    # counted), the move: not before, which had ended the noticed node uncounted
    offer = f"aws/{chosen['region']}/{chosen['zone']}/{chosen['instance_type']}/spot"
    assert any(a["outcome"] == "capacity" and a["offer"] == offer for a in rep["attempts"]), rep["attempts"]
    told = [e for e in rep["events"] if e["event"] in ("node_notice", "preempted", "capacity_error", "waiting",
                                                      "migrate_requested")]
    [notice] = [e for e in rep["events"] if e["event"] == "node_notice" and e["instance_id"] == preempt.victim]
    [gone] = [e for e in rep["events"] if e["event"] == "preempted" and e["instance_id"] == preempt.victim]
    # (an EC2 Fleet offer spans the region's zones, so the refusal may name the launch's own offer)
    refused = [e for e in rep["events"] if e["event"] == "capacity_error" and notice["t"] <= e["t"] < gone["t"]
               and e["offer"].startswith(f"aws/{preempt.region}/") and e["offer"].endswith("/spot")]
    assert refused and "ended_by" not in gone, told
    [moving] = [e for e in rep["events"] if e["event"] == "migrate_requested"]
    assert gone["t"] <= moving["t"], told
    [mig] = rep["migrations"]
    assert (mig["from"], mig["to"], mig["market"]) == (f"aws/{preempt.region}", f"aws/{other}", "spot")
    assert "no spot capacity" in mig["reason"]
    assert rep["region"] == other and rep["cloud"] == "aws" and rep["cloud_used"] == ["aws"]

    # the code: one zip in the run's storage, staged once, used by both clusters
    [staged] = [e for e in rep["events"] if e["event"] == "workdir_staged"]
    assert staged["uploaded"] is True and staged["uri"] == f"s3://ckpt/runs/_code/{p['workdir']['sha256']}.zip", staged
    s3 = boto3.client("s3", endpoint_url=emu.endpoint, region_name=emu.region,
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    code = [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="runs/_code/").get("Contents", [])]
    assert code == [staged["uri"].removeprefix("s3://ckpt/")], code

    # the data: fetched from S3 into the nodes' cache (their SPOTWISE_HOME is the emulator's
    # folder), the file the launch checked and pinned; the weights above depend on it
    meta = json.loads(s3.get_object(Bucket="ckpt", Key="data/meta.json")["Body"].read())
    cached = list((emu.workdir / "cache" / "data").rglob("tokens.bin"))
    assert cached and all(hashlib.sha256(f.read_bytes()).hexdigest() == meta["sha256"] for f in cached), cached
    assert not (tmp_path / "home" / "cache" / "data").exists()         # the launcher checked it without a download

    # money: every node billed per second at the price EC2 quoted when it launched, in both regions
    nodes, entries = ledger(rep)
    assert {zone[:-1] for _, _, _, zone, _, _ in nodes if zone} == set(REGIONS), nodes
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
        data = emu.ec2_of(iid).describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        assert script == base64.b64decode(data)
        ran = (emu.workdir / "instances" / iid / "user-data").read_bytes()
        assert ran == script and rep["cluster_id"].encode() in ran
        assert "spotwise bootstrap done" in (emu.workdir / "instances" / iid / "state" / "bootstrap.log").read_text()
    assert_every_node_installed_the_launchers_build(emu)     # from a stock image, the wheel the launch shipped

    # as from a laptop: only a head had a public address, and the launcher reached each head (one per
    # region) through that head's sshd with the cluster's key, from the port-22 rule's address only
    heads = [i for i, role, *_ in nodes if role == "head"]
    assert len(heads) == 2, nodes
    # ... and could not reach either head directly: each one's dashboard answered inside its region,
    # never this process
    if direct is None:
        print(f"not shown that the heads' private addresses were out of reach: {netns.missing()}")
    else:
        assert set(direct.tried) == set(heads) and direct.unreachable is True, direct.tried
    public = emu.nets.public_range.rsplit(".", 1)[0] + "." if emu.nets else "127.21."
    launcher = emu.nets.launcher_cidr if emu.nets else "127.0.0.1/32"
    for iid in emu.scripts:
        sshd = emu.workdir / "instances" / iid / "sshd"
        assert sshd.exists() == (iid in heads), iid            # a worker: no public address, no sshd
    for iid in heads:
        sshd = emu.workdir / "instances" / iid / "sshd"
        log = (sshd / "sshd.log").read_text()
        assert f"Server listening on {public}" in log and "Accepted publickey" in log, log[-2000:]
        assert f"@{launcher}\n" in (sshd / "sshd_config").read_text()      # the cluster's port-22 rule

    # what the run saw of spot is recorded for the next run there (spotwise.engine.state.spot_log): its
    # first cluster's spot workers ran in the victim's region for a while
    assert rep["spot_history"] is None                # the first run at these sites: nothing recorded before
    con = sqlite3.connect(Path(rep["_home"]) / "spotwise.db")
    try:
        seen = con.execute("select cloud, region, instance_type, state, t_end - t_start from spot_observations "
                           "where job_id = ?", (rep["job_id"],)).fetchall()
    finally:
        con.close()
    up = [r for r in seen if r[3] == 1 and r[1] == preempt.region]
    assert up and {r[:3] for r in up} == {("aws", preempt.region, chosen["instance_type"])}, seen

    # nothing of ours is left in the cloud
    assert emu.leftovers() == NOTHING
    assert not emu.errors
