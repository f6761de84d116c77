"""spotwise's Slurm jobs: submit one (``sbatch``), find ours (``squeue``), end them (``scancel``),
and what Slurm's refusals mean to failover.

A job carries spotwise's tags twice, so ``down`` and ``gc`` find it from any process: its name
``sw-<cluster>-<role>`` and its ``--comment`` ``spotwise-cluster=C,spotwise-job=J,spotwise-role=R,
spotwise-market=M`` (:func:`comment`, parsed back by :func:`parse_comment`). The batch script goes
to ``sbatch`` on stdin, so nothing is copied to the cluster's filesystem first.

Errors (:func:`classify`): ``sbatch`` prints no error code, only ``slurm_strerror``'s text of one
(``sbatch: error: Batch job submission failed: <text>``), so the texts of the codes that matter are
matched here, and nothing looser: an invalid partition, account or QOS, a gres or node count the
partition cannot ever give (``ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE``...) make the offer
impossible (:class:`CapacityError`, so failover moves on and caches it); association and QOS limits
(``ESLURM_ACCOUNTING_POLICY``, ``QOSMax*``, ``AssocMax*``) are a :class:`QuotaError` (the whole
cluster is skipped); anything else is a plain :class:`ProvisionError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotwise.provisioner.base import (
    TAG_CLUSTER,
    TAG_JOB,
    TAG_MARKET,
    TAG_ROLE,
    CapacityError,
    ProvisionError,
    QuotaError,
)
from spotwise.provisioner.clouds.slurm.cli import SlurmCommandError, SlurmRunner

NAME_PREFIX = "sw-"
#: squeue's fields, '|'-separated: id, name, state, nodes, partition, start, reason, comment (last:
#: a comment is the only field that could hold a '|', and it is ours)
SQUEUE_FORMAT = "%i|%j|%T|%N|%P|%S|%r|%k"

#: slurm_strerror texts (Slurm's src/common/slurm_errno.c) that mean "this offer can never run here"
IMPOSSIBLE = ("Invalid partition name specified", "Requested node configuration is not available",
              "Invalid generic resource (gres) specification", "Invalid account or account/partition combination",
              "Invalid qos specification", "Node count specification invalid",
              "Requested partition configuration not available now", "Requested time limit is invalid",
              "Invalid Trackable RESource (TRES) specification", "Access/permission denied")
#: ... and "an account or QOS limit stops it" (the association's or QOS's own cap)
QUOTA = ("Job violates accounting/QOS policy", "QOSMax", "AssocMax", "QOSGrp", "AssocGrp",
         "Job exceeds association's", "Batch job submission failed: Job limit")
#: squeue reasons of a pending job that will never start as asked (so waiting for it is pointless)
NEVER_STARTS = frozenset({"PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
                          "ReqNodeNotAvail", "InvalidQOS", "InvalidAccount", "QOSMaxGRESPerJob",
                          "AssocMaxNodesPerJob", "QOSMaxNodePerJobLimit", "PartitionDown", "PartitionInactive",
                          "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit"})


def job_name(cluster_id: str, role: str) -> str:
    return f"{NAME_PREFIX}{cluster_id}-{role}"


def comment(cluster_id: str, job_id: str, role: str, market: str) -> str:
    return f"{TAG_CLUSTER}={cluster_id},{TAG_JOB}={job_id},{TAG_ROLE}={role},{TAG_MARKET}={market}"


def parse_comment(text: str) -> dict[str, str]:
    """The tags of a comment written by :func:`comment` ({} for anyone else's job)."""
    out = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if sep and k.startswith("spotwise-"):
            out[k] = v
    return out if TAG_CLUSTER in out else {}


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmJob:
    """One of our jobs as ``squeue`` shows it."""

    job_id: str
    name: str
    state: str              # PENDING, RUNNING, COMPLETING, ...
    nodelist: str           # n[1-2] ("" while pending)
    partition: str
    start: str              # the start time, or Slurm's estimate while pending (N/A: none)
    reason: str
    tags: dict[str, str]

    @property
    def cluster_id(self) -> str:
        return self.tags[TAG_CLUSTER]


def parse_squeue(text: str) -> list[SlurmJob]:
    """``squeue -h -o SQUEUE_FORMAT`` lines, only those whose comment carries our tags."""
    out = []
    for line in text.splitlines():
        bits = line.split("|", 7)
        if len(bits) < 8:
            continue
        tags = parse_comment(bits[7])
        if tags:
            out.append(SlurmJob(job_id=bits[0], name=bits[1], state=bits[2], nodelist=bits[3],
                                partition=bits[4], start=bits[5], reason=bits[6], tags=tags))
    return out


def list_jobs(runner: SlurmRunner, cluster_id: str | None = None) -> list[SlurmJob]:
    """Our jobs the controller still has (pending, running, completing), one cluster's if given."""
    jobs = parse_squeue(runner.run("squeue", "-h", "-o", SQUEUE_FORMAT))
    return [j for j in jobs if cluster_id is None or j.cluster_id == cluster_id]


def hostnames(runner: SlurmRunner, nodelist: str) -> list[str]:
    """``n[1-2]`` -> ``["n1", "n2"]`` (Slurm's own expansion, ``scontrol show hostnames``)."""
    return runner.run("scontrol", "show", "hostnames", nodelist).split() if nodelist else []


def node_address(runner: SlurmRunner, node: str) -> str:
    """The node's ``NodeAddr`` (what Ray on it listens on)."""
    for word in runner.run("scontrol", "show", "node", node, "-o").split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    return node


def sbatch_args(*, partition: str, nodes: int, gres: str | None, time_limit_s: float, name: str,
                tags: str, grace_s: float, requeue: bool = False, cpus: int | None = None) -> list[str]:
    """The ``sbatch`` options of one spotwise job: ``--nodes``, ``--gres``, the time limit, the
    signal ``grace_s`` before it (``B:USR1``, to the batch script, which turns it into a notice; with
    ``preempt_send_user_signal`` Slurm sends the same signal at preemption), name and comment.
    ``requeue``: False by default, because spotwise replaces a preempted job itself (at once, or on
    another offer), while a requeued job would wait out Slurm's requeue delay and then come back as
    a second copy of the nodes already replaced."""
    minutes = max(1, math.ceil(time_limit_s / 60))
    args = [f"--partition={partition}", f"--nodes={nodes}", "--ntasks-per-node=1", f"--time={minutes}",
            f"--job-name={name}", f"--comment={tags}", f"--signal=B:USR1@{max(10, int(grace_s))}",
            "--requeue" if requeue else "--no-requeue", "--output=/dev/null", "--parsable"]
    if gres:
        args.append(f"--gres={gres}")
    if cpus:
        args.append(f"--cpus-per-task={cpus}")
    return args


def submit(runner: SlurmRunner, args: list[str], script: str) -> str:
    """``sbatch ARGS`` with ``script`` on stdin; the new job's id. Typed errors (:func:`classify`)."""
    try:
        out = runner.run("sbatch", *args, stdin=script)
    except SlurmCommandError as e:
        raise classify(e) from None
    return out.strip().split(";")[0]


def cancel(runner: SlurmRunner, job_ids: list[str]) -> None:
    """``scancel`` the jobs (idempotent: an ended job is not an error to ``scancel``)."""
    if job_ids:
        runner.run("scancel", *job_ids)


def classify(e: SlurmCommandError) -> ProvisionError:
    """A typed error for one of Slurm's refusals (see the module's docstring)."""
    text = e.stderr
    if any(m in text for m in QUOTA):
        return QuotaError(f"Slurm refused the job (an account or QOS limit): {_last(text)}", cloud="slurm",
                          code="quota")
    if any(m in text for m in IMPOSSIBLE):
        return CapacityError(f"Slurm cannot run this job here: {_last(text)}", cloud="slurm", code="impossible")
    return ProvisionError(f"sbatch failed: {_last(text)}", cloud="slurm")


def _last(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].removeprefix("sbatch: error: ") if lines else "(no message)"
