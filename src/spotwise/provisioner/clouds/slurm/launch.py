"""Launching one request on a Slurm cluster: submit its job, wait for Slurm to run it, return its
nodes (the :class:`~spotwise.provisioner.clouds.slurm.cloud.SlurmCloud`'s ``launch``, kept apart so each module
stays small).

One request is one job: the head (one node, one CPU, no GPU, in a partition that is not preempted)
or ``count`` workers (``--nodes=count --gres=gpu:TYPE:N`` in the offer's partition). The job runs
the batch script of :mod:`~spotwise.provisioner.clouds.slurm.script`. Its nodes are billed from the moment
Slurm runs it, at the offer's price (the team's price per GPU-hour × GPUs per node), through the
same per-second ledger as a cloud's instances.

Ports: the head's GCS, dashboard and control ports are chosen free on this machine at launch, as
the local cloud does: the tests' Slurm nodes are this machine, and on a real cluster three random
free ports collide with nothing the head's node runs. Ray's per-node agent ports are chosen on each
node by its script.

Over ssh (``ssh: user@login-host``) a launch is the same: ``sbatch`` (the script on ssh's stdin),
``squeue`` and ``scancel`` run on the login host, and the orchestrator reaches the head's dashboard
and control ports through the cluster's ssh port forwards
(:meth:`~spotwise.provisioner.clouds.slurm.cloud.SlurmCloud.endpoint`, :mod:`~spotwise.provisioner.ssh_tunnel`).
"""

from __future__ import annotations

import os
import math
import secrets
import time

from spotwise.provisioner.base import CapacityError, LaunchRequest, Node, ProvisionError
from spotwise.provisioner.clouds.slurm.cli import SlurmCommandError, SlurmRunner, SlurmUnreachable
from spotwise.provisioner.clouds.slurm.jobs import (
    NEVER_STARTS,
    SlurmJob,
    cancel,
    comment,
    hostnames,
    job_name,
    list_jobs,
    node_address,
    sbatch_args,
    submit,
)
from spotwise.provisioner.clouds.slurm.script import YIELD_COMMENT, NodeSpec, render

#: a partition without a MaxTime: the job's limit (the dead man's switch ends it far sooner when
#: the runner is gone; the limit is the last guard)
NO_MAX_TIME_S = 7 * 24 * 3600.0


def launch_job(cloud, req: LaunchRequest) -> list[Node]:
    """See :meth:`spotwise.provisioner.clouds.slurm.cloud.SlurmCloud.launch`."""
    from spotwise.runtime.node.deadman import BOOT_LEASE_S
    from spotwise.utils.net import service_port

    offer = req.offer
    if offer.cloud != "slurm":
        raise ProvisionError(f"the slurm cloud cannot launch a {offer.cloud} offer ({offer.key})")
    conf = cloud.cluster(offer.region)
    runner = cloud.runner(offer.region)
    part = cloud.partition(offer.region, offer.zone)
    head = req.role == "head"
    heads = cloud._heads
    if head:
        ports = {"gcs": service_port(), "dashboard": service_port(), "control": service_port(),
                 "token": secrets.token_hex(32)}
        heads[req.cluster_id] = ports
    elif req.cluster_id not in heads:
        raise ProvisionError(f"no head was launched for cluster {req.cluster_id} by this process")
    ports = heads[req.cluster_id]
    if cloud.node_build is None:
        raise ProvisionError("a Slurm launch ships the launcher's build through the run's storage, and this "
                             "launch has none (SlurmCloud.for_task sets it)", offer_key=offer.key, cloud="slurm")
    spec = NodeSpec(cluster_id=req.cluster_id, job_id=req.job_id, role=req.role, cloud_zone=offer.zone,
                    market=offer.market.value, build=cloud.node_build.for_boot(), python=conf.python,
                    gcs_port=ports["gcs"],
                    head_address=None if head else f"{ports['head_ip']}:{ports['gcs']}",
                    dashboard_port=ports["dashboard"], grace_s=part.grace_s or 10.0,
                    boot_lease_s=BOOT_LEASE_S, auth_token=ports["token"],
                    node_dir=os.environ.get("SPOTWISE_SLURM_NODE_DIR") or None)
    tags = comment(req.cluster_id, req.job_id, req.role, offer.market.value) + \
        f",spotwise-type={offer.instance_type},spotwise-price={offer.usd_per_hour}"
    args = sbatch_args(partition=offer.zone, nodes=1 if head else req.count,
                       gres=None if head else offer.instance_type,
                       time_limit_s=part.max_time_s or NO_MAX_TIME_S, name=job_name(req.cluster_id, req.role),
                       tags=tags, grace_s=part.grace_s, cpus=1 if head else None)
    try:
        job_id = submit(runner, args, render(spec))
    except ProvisionError as e:
        e.offer_key, e.region = offer.key, offer.region
        raise
    try:
        job = _wait_running(runner, job_id, req.cluster_id, float(os.environ.get("SPOTWISE_SLURM_PENDING_S")
                                                                   or cloud.pending_for(offer, req.count)), offer.key)
        nodes = nodes_of(cloud, offer.region, job, launched_at=time.time())
    except BaseException:     # whatever stopped the launch, its job is not left queued or running
        cancel(runner, [job_id])
        raise
    for n in nodes:
        n.usd_per_hour = offer.usd_per_hour
        n.extra.update(price_source=offer.source, price_as_of=offer.as_of)
    if head:
        ports["head_ip"] = nodes[0].address
        nodes[0].extra.update(dashboard_port=ports["dashboard"], control_port=ports["control"],
                              auth_token=ports["token"])
    return nodes


#: the bounds of how long a launch waits for its job to leave the queue when the task has a deadline
MIN_PENDING_S = 30.0
MAX_PENDING_S = 3600.0


def pending_allowance(*, default_s: float, deadline_left_s: float | None, run_s: float | None) -> float:
    """How long a launch waits for its pending job before the plan's next offer is tried: what the
    deadline leaves after the estimated run time (``deadline_left_s - run_s``), bounded to
    [:data:`MIN_PENDING_S`, :data:`MAX_PENDING_S`] — a job always gets a moment to be scheduled, and
    no far deadline parks a launch in a queue for hours — else ``default_s`` (no deadline, or no
    estimate). A deadline the run no longer fits leaves the minimum: the queue is tried briefly,
    then an offer that may start at once."""
    if deadline_left_s is None or run_s is None or not (math.isfinite(deadline_left_s) and math.isfinite(run_s)):
        return default_s
    return min(MAX_PENDING_S, max(MIN_PENDING_S, deadline_left_s - run_s))


def _wait_running(runner: SlurmRunner, job_id: str, cluster_id: str, pending_s: float, offer_key: str) -> SlurmJob:
    """The job once Slurm runs it; :class:`CapacityError` when it pends past ``pending_s`` or for
    a reason that never clears (:data:`NEVER_STARTS`), :class:`ProvisionError` when it ended."""
    deadline = time.monotonic() + pending_s
    while True:
        job = next((j for j in list_jobs(runner, cluster_id) if j.job_id == job_id), None)
        if job is None:
            raise ProvisionError(f"Slurm job {job_id} ended before it ran ({ended_state(runner, job_id)})",
                                 offer_key=offer_key, cloud="slurm")
        if job.state == "RUNNING":
            return job
        if job.reason in NEVER_STARTS:
            raise CapacityError(f"Slurm job {job_id} would never start here: pending with reason {job.reason}",
                                offer_key=offer_key, cloud="slurm", code=job.reason)
        if time.monotonic() > deadline:
            raise CapacityError(f"Slurm job {job_id} still pending after {pending_s:.0f} s ({job.reason}); "
                                "trying the plan's next offer", offer_key=offer_key, cloud="slurm", code="pending")
        time.sleep(0.5)


def nodes_of(cloud, region: str, job: SlurmJob, *, launched_at: float | None = None) -> list[Node]:
    """One :class:`Node` per host of a running job (``instance_id`` ``JOBID/HOST``)."""
    runner = cloud.runner(region)
    out = []
    for host in hostnames(runner, job.nodelist):
        out.append(Node(cloud="slurm", instance_id=f"{job.job_id}/{host}",
                        instance_type=job.tags.get("spotwise-type", ""), region=region, zone=job.partition,
                        market=job.tags.get("spotwise-market", ""),
                        usd_per_hour=float(job.tags.get("spotwise-price", 0) or 0), cluster_id=job.cluster_id,
                        job_id=job.tags.get("spotwise-job", ""), role=job.tags.get("spotwise-role", "worker"),
                        state="running", launched_at=launched_at, address=node_address(runner, host),
                        extra={"slurm_job": job.job_id, "slurm_node": host}))
    return out


def ended_state(runner: SlurmRunner, job_id: str) -> str:
    """An ended job's state (PREEMPTED, NODE_FAIL, CANCELLED...) while the controller still
    remembers it (``MinJobAge``); ``UNKNOWN`` after."""
    try:
        text = runner.run("scontrol", "show", "job", job_id, "-o")
    except (SlurmCommandError, SlurmUnreachable):
        return "UNKNOWN"
    return job_state(text)


def job_state(text: str) -> str:
    """The ``JobState`` of ``scontrol show job -o``'s line (``UNKNOWN`` where it has none); a job that
    ended itself at its notice (``CANCELLED`` with :data:`~spotwise.provisioner.clouds.slurm.script.YIELD_COMMENT`)
    is ``PREEMPTED``: the notice was the preemptor's, the job only left before the kill."""
    words = dict(w.split("=", 1) for w in text.split() if "=" in w)
    state = words.get("JobState", "UNKNOWN")
    if state == "CANCELLED" and words.get("Comment") == YIELD_COMMENT:
        return "PREEMPTED"
    return state


def preempted(state: str) -> bool:
    """Whether a job that ended in ``state`` was preempted (the orchestrator counts a preemption and
    tells the spot watch). Anything else — ``NODE_FAIL`` (a node died under the job), a time limit,
    a cancel not ours, a state the controller forgot (``UNKNOWN``) — is a lost node, as a cloud
    instance gone without a notice is; both are replaced the same way."""
    return state == "PREEMPTED"
