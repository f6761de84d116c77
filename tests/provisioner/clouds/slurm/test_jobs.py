"""Our Slurm jobs' tags, options and what Slurm's refusals mean (sbatch's messages as recorded from
the tests' Slurm 22.05.8)."""

from __future__ import annotations

import json

import pytest

from slurm_helpers import DATA
from spotwise.provisioner.base import CapacityError, ProvisionError, QuotaError
from spotwise.provisioner.clouds.slurm.cli import SlurmCommandError
from spotwise.provisioner.clouds.slurm.jobs import classify, comment, parse_comment, parse_squeue, sbatch_args
from spotwise.provisioner.clouds.slurm.launch import job_state, preempted

RECORDED = json.loads((DATA / "sbatch_stderr.json").read_text())


def _err(text: str) -> SlurmCommandError:
    return SlurmCommandError(["sbatch"], 1, text)


@pytest.mark.parametrize("key", ["invalid_partition", "bad_gres"])
def test_an_offer_slurm_can_never_run_is_a_capacity_error(key):
    e = classify(_err(RECORDED[key]))
    assert type(e) is CapacityError and e.code == "impossible" and "sbatch: error" not in str(e)


@pytest.mark.parametrize("text", [
    # slurm_strerror's texts of ESLURM_ACCOUNTING_POLICY and a QOS limit reason, as sbatch prints them
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
    "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy",
])
def test_account_and_qos_limits_are_a_quota_error(text):
    assert type(classify(_err(text))) is QuotaError


def test_anything_else_is_a_plain_provision_error():
    e = classify(_err("sbatch: error: Batch job submission failed: Unexpected message received"))
    assert type(e) is ProvisionError and "Unexpected message received" in str(e)


def test_tags_round_trip_and_other_jobs_are_not_ours():
    c = comment("sw1", "job-1", "worker", "spot") + ",spotwise-type=gpu:h100:8"
    assert parse_comment(c) == {"spotwise-cluster": "sw1", "spotwise-job": "job-1", "spotwise-role": "worker",
                                "spotwise-market": "spot", "spotwise-type": "gpu:h100:8"}
    text = (f"15|sw-sw1-worker|RUNNING|n[1-2]|preemptible|2026-11-27T22:18:18|None|{c}\n"
            "16|train.sh|PENDING||priority|N/A|Resources|someone else's job\n"
            "17|x|PENDING||priority|N/A|Priority|(null)\n")
    [job] = parse_squeue(text)
    assert (job.job_id, job.state, job.nodelist, job.partition, job.cluster_id) == \
        ("15", "RUNNING", "n[1-2]", "preemptible", "sw1")


def test_sbatch_options_carry_the_tags_the_limit_and_the_notice_signal():
    args = sbatch_args(partition="preemptible", nodes=2, gres="gpu:h100:8", time_limit_s=7200, name="sw-c-worker",
                       tags="spotwise-cluster=c", grace_s=20)
    assert args == ["--partition=preemptible", "--nodes=2", "--ntasks-per-node=1", "--time=120",
                    "--job-name=sw-c-worker", "--comment=spotwise-cluster=c", "--signal=B:USR1@20",
                    "--no-requeue", "--output=/dev/null", "--parsable", "--gres=gpu:h100:8"]


@pytest.mark.parametrize("recorded_file,state,is_preemption", [
    # recorded from the tests' cluster: the e2e's worker job, preempted by a priority job
    ("scontrol_show_job_preempted.txt", "PREEMPTED", True),
    # the same line as Slurm prints a job whose node died under it (JobState/Reason edited: the
    # tests' nodes cannot fail on their own)
    ("scontrol_show_job_node_fail.txt", "NODE_FAIL", False),
])
def test_an_ended_jobs_state_tells_a_preemption_from_a_lost_node(recorded_file, state, is_preemption):
    """A job gone from ``squeue`` is a node gone from the cloud's listing; its ended state decides
    how the orchestrator counts it: a preemption, or (``NODE_FAIL``) a lost node, as a cloud instance
    gone without a notice — replaced either way."""
    text = (DATA / recorded_file).read_text()
    assert job_state(text) == state and preempted(job_state(text)) is is_preemption
    assert job_state("") == "UNKNOWN" and not preempted("UNKNOWN")       # forgotten (MinJobAge): lost
