"""One launch that moves between sites: a region out of spot capacity sends the whole job to the
next region of the plan, from its last checkpoint, on the emulated AWS (two regions, one moto).

The orchestrator is the unchanged ``spotwise launch`` process: the worker it lost to a preemption
cannot be replaced in its region (every spot override answers InsufficientInstanceCapacity), so it
ends that cluster, brings one up in the next region the task allows, resubmits, and training
resumes from the preemption's just-in-time checkpoint — with the weights of an uninterrupted run.
"""

from __future__ import annotations

import pytest

from e2e.test_launch_aws import PreemptAfterFirstCheckpoint, aws_task, ledger, run
from emulator.aws import EmulatedAws
from spotwise.provisioner.local import marked_pids

pytestmark = pytest.mark.slow

NOTHING = {"instances": [], "volumes": [], "network_interfaces": [], "security_groups": []}


@pytest.fixture
def emu2(tmp_path):
    with EmulatedAws(tmp_path / "aws", regions=("us-east-1", "us-east-2")) as e:
        yield e
    assert marked_pids(home_prefix=str(tmp_path)) == [], "an emulated node outlived its instance"


def test_a_region_out_of_spot_moves_the_job_to_the_next_region(emu2, tmp_path, reference):
    task = aws_task(tmp_path, resources={"regions": ["us-east-1", "us-east-2"]}, budget_usd=5.0)
    preempt = PreemptAfterFirstCheckpoint(notice_s=8.0)
    taken = {"done": False}

    def during(e: EmulatedAws) -> None:
        preempt(e)
        if preempt.victim and not taken["done"]:
            e.set_no_capacity(["us-east-1*:spot"])        # the first region runs out of spot for good
            taken["done"] = True

    rep = run(emu2, tmp_path, task, "--storage", "s3://ckpt/runs", during=during)
    assert rep["status"] == "succeeded", (rep["message"], (tmp_path / "launch.err").read_text()[-3000:])
    assert preempt.victim is not None
    assert rep["model_sha256"] == reference["model_sha256"], "weights differ from the uninterrupted local run"
    assert rep["steps_completed"] == reference["steps_total"]
    assert rep["lost_steps"] <= rep["checkpoint_interval"]

    [mig] = rep["migrations"]
    assert (mig["from"], mig["to"], mig["market"]) == ("aws/us-east-1", "aws/us-east-2", "spot")
    assert "no spot capacity" in mig["reason"]
    assert rep["region"] == "us-east-2" and rep["cloud_used"] == ["aws"]
    # the replacement was tried in the first region and refused there, before the move
    refused = [a for a in rep["attempts"] if a["outcome"] == "capacity" and a["offer"].startswith("aws/us-east-1/")
               and a["offer"].endswith("/spot")]
    assert refused, rep["attempts"]

    # money: both clusters billed per second at their launch prices, all under the budget
    nodes, entries = ledger(rep)
    regions = {zone[:-1] for _, _, _, zone, _, _ in nodes if zone}
    assert regions == {"us-east-1", "us-east-2"}, nodes
    total = sum(e[1] * e[2] / 3600 for e in entries)
    assert rep["cost_usd"] == pytest.approx(total, abs=1e-6) and rep["cost_usd"] <= rep["budget_usd"]

    assert emu2.leftovers() == NOTHING
    assert not emu2.errors
