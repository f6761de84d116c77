"""The runner SIGKILLed mid-run on each emulated cloud: every instance is gone from the cloud within
the documented bound, ended by its own node, with no ``gc``.

Issue 29 asks a node's own way of ending itself to reach the fake cloud as it reaches the real one:
an EC2 node's ``shutdown -h now`` terminates it (the shutdown behaviour spotwise sets), a GCP or
Azure node deletes its own instance through its identity (a guest shutdown would leave a GCP VM
``TERMINATED`` with its disk, and an Azure VM allocated, both still billed). Here the real chain
runs: ``spotwise launch`` boots a head and a worker from the stock image on the emulator, pushes its
node lease, trains until a checkpoint is committed in the cloud's own store, and is SIGKILLed; the
nodes' watchers (:mod:`spotwise.runtime.deadman`) see the lease pass and end their instances. The
bound is the lease's term after the kill (15 s here, the shortest an operator may set through
``SPOTWISE_NODE_LEASE_S``) plus :data:`~spotwise.engine.lease.SELF_END_S`; the wait polls with
slack, no timing is asserted tightly. ``spotwise gc`` then only marks the job ``lost`` (once), with
the gone nodes billed no later than their lease let them run, and deletes what outlives an instance
by design (firewall rules, security groups, a network security group): nothing of ours is left.

On AWS and Azure the run is the smallest that is mid-run (one worker). On GCP it is the e2e
job's training (two workers, 600 steps), and after ``gc`` the lost run goes on with ``spotwise resume
JOB --budget``: the same job, from its last committed checkpoint, on a new cluster, to the weights
of the uninterrupted run, in one ledger. (This was the local cloud's SIGKILL test, in
test_kill_runner.py; the local node's own way of ending itself, ``--self-end local``, is held with
the real watcher in tests/engine/test_lease.py.) The preemption and billing of each cloud are
proven by its own e2e run (test_launch_aws/gcp/azure.py), and each node's way of ending itself
against the fakes, without Ray, by tests/test_emulator_guest_shutdown.py and
tests/provisioner/test_gcp_cluster.py / test_azure_cluster.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from e2e.conftest import standalone_reference
from e2e.helpers import checkpoint_committed, cloud_task, job_row, launch_env, wait_for
from spotwise.engine.lease import SELF_END_S
from spotwise.provisioner.local import marked_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

NODE_LEASE_S = 15.0      # the shortest term an operator may set (NODE_LEASE_BOUNDS_S): the bound below
SLACK_S = 120.0          # a loaded 2-core machine: generous, and only an upper bound
CAP_USD = 5.0
RESUMED_ON = "gcp"       # the cloud whose lost run `spotwise resume` then takes to the end
RESUMED_STEPS = 600      # see the test
RESUME_USD = 4.0         # what the resume adds to the budget (two 8 x A100 spot workers: ~$20/h)


def _aws(tmp_path: Path):
    import boto3

    from emulator.aws import EmulatedAws

    emu = EmulatedAws(tmp_path / "aws")
    s3: list[Any] = []

    def committed() -> bool:
        if not s3:
            s3.append(boto3.client("s3", endpoint_url=emu.endpoint, region_name=emu.region,
                                   aws_access_key_id="testing", aws_secret_access_key="testing"))
        return checkpoint_committed(s3[0], emu.bucket)
    return emu, "us-east-1", lambda: "s3://ckpt/runs", committed, "instances"


def _gcp(tmp_path: Path):
    from emulator.gcp import EmulatedGcp

    emu = EmulatedGcp(tmp_path / "gcp")
    return (emu, "us-central1", lambda: "gs://ckpt/runs",
            lambda: any(k.endswith("/COMMITTED") for k in emu.objects("runs/")), "instances")


def _azure(tmp_path: Path):
    from emulator.azure import EmulatedAzure

    emu = EmulatedAzure(tmp_path / "azure")
    return emu, "eastus", lambda: emu.storage, emu.committed, "vms"


CLOUDS: dict[str, Callable] = {"aws": _aws, "gcp": _gcp, "azure": _azure}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_sigkilled_runner_every_instance_ends_itself_without_gc(cloud, tmp_path):
    emu, region, storage, committed, kind = CLOUDS[cloud](tmp_path)
    resume = cloud == RESUMED_ON
    with emu:
        home = tmp_path / "home"
        if cloud == "azure":
            emu.refresh_prices(home)
        # the resumed cloud trains the e2e job with two workers, long enough that the kill lands
        # mid-run (the e2e's 200 steps took 2 s past the first checkpoint's marker on an idle
        # machine), against its own uninterrupted run made meanwhile; the others the smallest
        # cluster that is mid-run
        size = {"training": {"steps": RESUMED_STEPS}} if resume else {"resources": {"nodes": 1},
                                                                       "training": {"steps": 100000}}
        task = cloud_task(tmp_path, [cloud], [region], budget_usd=CAP_USD, **size)
        reference: dict = {}
        ref = threading.Thread(target=lambda: reference.update(standalone_reference(task, tmp_path / "ref")))
        if resume:
            ref.start()
        env = dict(launch_env(emu, tmp_path), SPOTWISE_NODE_LEASE_S=str(NODE_LEASE_S))
        with open(tmp_path / "launch.err", "w") as err:
            p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                                  "--storage", storage()], env=env, stdout=subprocess.DEVNULL, stderr=err,
                                 start_new_session=True)
        try:
            wait_for(lambda: committed() or p.poll() is not None, 600, "the first committed checkpoint")
            assert p.poll() is None, (tmp_path / "launch.err").read_text()[-3000:]
            wait_for(lambda: job_row(home)["node_deadline"], 60, "a node lease pushed to the head")
            machines = set(emu.nodes)
            want = 3 if resume else 2                              # the head and its workers
            assert len(machines) == want, machines
            assert len(emu.leftovers()[kind]) == want, emu.leftovers()
            os.killpg(p.pid, signal.SIGKILL)                       # the runner, and nothing of the nodes'
            killed_at = time.time()
            p.wait()
            assert job_row(home)["status"] == "running"               # nobody has told the database

            bound = NODE_LEASE_S + SELF_END_S
            wait_for(lambda: not emu.leftovers()[kind], bound + SLACK_S,
                      f"every {kind[:-1]} gone from the cloud (bound {bound:.0f} s after the kill + slack)")
            gone_after = time.time() - killed_at
            for m in machines:
                log = (emu.workdir / emu.NODES_DIR / m / "state" / "watch.log").read_text()
                assert "dead man's switch: ending this node" in log, log[-2000:]
            assert not emu.errors, emu.errors
            print(f"{cloud}: every instance gone {gone_after:.0f} s after SIGKILL (bound {bound:.0f} s + slack)")

            # gc only tells the database and removes what outlives an instance by design
            r = subprocess.run([sys.executable, "-m", "spotwise.cli", "gc", "--cloud", cloud, "--format", "json"],
                               env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-3000:]
            sweep = json.loads(r.stdout)
            job = job_row(home)
            assert [j["job_id"] for j in sweep["jobs"]] == [job["id"]]
            assert job["status"] == "lost" and job["open_nodes"] == 0
            assert 0 < job["spend"] <= CAP_USD
            # gone nodes are billed no later than their lease let them run
            assert job["ledger_end"] <= job["node_deadline"] + SELF_END_S + 1
            assert all(not v for v in emu.leftovers().values()), emu.leftovers()
            r = subprocess.run([sys.executable, "-m", "spotwise.cli", "gc", "--cloud", cloud, "--format", "json"],
                               env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and json.loads(r.stdout)["jobs"] == [], r.stdout   # once only
            if resume:
                ref.join()
                assert reference, "the uninterrupted run failed (its assertion is in the thread's output)"
                _resume_to_the_reference(env, home, job, reference)
                assert all(not v for v in emu.leftovers().values()), emu.leftovers()
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its instance"


def _resume_to_the_reference(env: dict, home: Path, lost: dict, reference: dict) -> None:
    """``spotwise resume JOB --budget RESUME_USD``: the lost run continues as the same job (same run name
    and store) from its last committed checkpoint, on a new cluster, to the uninterrupted weights."""
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "resume", lost["id"], "--budget", str(RESUME_USD),
                        "--format", "json"],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0 and r.stdout.strip(), f"rc={r.returncode}\n{r.stderr[-4000:]}"
    rep = json.loads(r.stdout)
    [leg] = rep["resumed"]
    assert leg["from_status"] == "lost" and 20 <= leg["from_step"] < RESUMED_STEPS, leg   # killed mid-run
    assert leg["budget_usd"] == pytest.approx(lost["spend"] + RESUME_USD) and rep["budget_usd"] == leg["budget_usd"]
    assert rep["status"] == "succeeded", rep["message"]
    assert rep["steps_completed"] == rep["steps_total"] == reference["steps_total"]
    assert rep["model_sha256"] == reference["model_sha256"]            # exact: the uninterrupted weights
    assert rep["resume_points"][0]["from_step"] == leg["from_step"]    # the runtime restored that checkpoint
    done = job_row(home)
    assert done["id"] == lost["id"] and done["status"] == "succeeded" and done["open_nodes"] == 0
    assert done["spend"] == pytest.approx(rep["cost_usd"], abs=1e-5)   # one ledger: both legs, once each
    assert lost["spend"] < done["spend"] <= leg["budget_usd"]
    print(f"resumed from step {leg['from_step']}: ${done['spend']:.4f} in all, weights equal to the reference")
