"""The ``slurm`` cloud: the Slurm clusters the config file names (``slurm.clusters``), as a site.

Each cluster is a region (its ``name``), each configured partition a zone; its offers
(:mod:`~spotwise.provisioner.clouds.slurm.offers`) rank in the same plan as the clouds' because this cloud
prices itself (``priced_by_catalog = False``, like the local cloud): the price is the team's own,
from the config file, and the shapes are read from the cluster
(:mod:`~spotwise.provisioner.clouds.slurm.discovery`) through :class:`~spotwise.provisioner.clouds.slurm.cli.
SlurmRunner` (here, or over ``ssh`` to a login host).

A cluster that cannot be asked (ssh fails, Slurm's commands are missing, the controller does not
answer) is skipped with one line of why in :attr:`skipped_regions`; the plan says so, and when no
other site is left it is an :class:`~spotwise.errors.InputError` (exit 2), never a traceback.

Before a launch, :meth:`SlurmCloud.queue` tells how many jobs wait ahead in a partition and when
Slurm itself expects such a job to start (``sbatch --test-only``, the scheduler's own estimate for
exactly this request), which the plan shows and weighs against the deadline.

A launch is one ``sbatch`` job (:mod:`~spotwise.provisioner.clouds.slurm.launch`): the Ray head's, or the
workers'; our jobs are found again by the tags in their ``--comment``
(:mod:`~spotwise.provisioner.clouds.slurm.jobs`), so ``list_nodes``, ``down`` and ``gc`` work from any
process, and ended with ``scancel``. docs/slurm.md has the whole design.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import Cloud, LaunchRequest, Node, register_cloud
from spotwise.provisioner.head_path import HeadEndpoint
from spotwise.provisioner.clouds.slurm.cli import SlurmCommandError, SlurmRunner, SlurmUnreachable
from spotwise.provisioner.clouds.slurm.discovery import SlurmPartition, discover
from spotwise.provisioner.clouds.slurm.jobs import cancel, list_jobs
from spotwise.provisioner.clouds.slurm.offers import ClusterOffers, cluster_offers


#: the head's "instance type": a one-CPU job without GPUs running the Ray head
HEAD_TYPE = "ray-head"


@dataclass(frozen=True, slots=True)
class Queue:
    """What waits ahead of a job in a partition, and Slurm's own estimate of its start."""

    pending: int
    start: dt.datetime | None = None      # sbatch --test-only's "to start at" (None: none given)

    def wait_hours(self, now: dt.datetime | None = None) -> float | None:
        if self.start is None:
            return None
        now = now or dt.datetime.now()
        return max(0.0, (self.start - now).total_seconds() / 3600)

    def describe(self) -> str:
        when = f"Slurm's estimate: starts {self.start:%Y-%m-%d %H:%M}" if self.start else "no start estimate"
        return f"queue: {self.pending} job(s) pending in the partition; {when}"


def parse_test_only(stderr: str) -> dt.datetime | None:
    """The start time in ``sbatch --test-only``'s answer (``sbatch: Job 1 to start at
    2026-11-27T22:04:56 using 2 processors on nodes n[1-2] in partition p``), local time of the
    cluster as Slurm prints it; None where it gives none."""
    for line in stderr.splitlines():
        if " to start at " in line:
            stamp = line.split(" to start at ", 1)[1].split()[0]
            try:
                return dt.datetime.fromisoformat(stamp)
            except ValueError:
                return None
    return None


@register_cloud("slurm")
class SlurmCloud(Cloud):
    """The Slurm clusters of the config file (see the module's docstring)."""

    priced_by_catalog = False
    listing_lag_s = 0.0
    #: a ``file://`` run storage is allowed: the tests' cluster is this machine, and a cluster with a
    #: shared filesystem sees the path. Nodes assume nothing else of this machine: they install the
    #: build shipped through the run's storage (:mod:`~spotwise.provisioner.clouds.slurm.script`); a cluster
    #: whose nodes cannot see the path needs an ``s3://`` storage (docs/slurm.md)
    on_this_machine = True

    def __init__(self, clusters: list | None = None) -> None:
        self._clusters = clusters          # SlurmClusterConfig list; None: the config file's, when asked
        self._found: dict[str, ClusterOffers] = {}
        self.skipped_regions: dict[str, str] = {}
        self.notes: list[str] = []
        #: per cluster launched by this process: the head's ports, address and Ray auth token
        #: (workers join it; the orchestrator reaches its dashboard and control endpoint)
        self._heads: dict[str, dict] = {}
        #: per cluster whose head is reached over ssh: its port forwards (provisioner/ssh_tunnel.py)
        self._tunnels: dict = {}

    #: the run's deadline (epoch seconds; None: no deadline) and the estimated run time of an offer
    #: (seconds), which bound how long a launch waits in a partition's queue (:meth:`pending_for`)
    deadline_at: float | None = None
    run_seconds: Callable[[Offer, int], float] | None = None

    @classmethod
    def for_task(cls, spec, opts) -> "SlurmCloud":
        """As a cloud's (:meth:`Cloud.for_task`: nodes install the launcher's build, shipped through
        the run's storage), plus the task's deadline and run-time estimate for :meth:`pending_for`."""
        import time

        from spotwise.pricing.estimate import JobModel, compute_hours, flops_per_token_from_taskspec, params_from_taskspec

        cloud = super().for_task(spec, opts)
        assert isinstance(cloud, SlurmCloud)
        if spec.deadline_hours is not None:
            cloud.deadline_at = time.time() + spec.deadline_hours * 3600
            params, tokens = params_from_taskspec(spec)
            job = JobModel(model_params=params, tokens=tokens, flops_per_token=flops_per_token_from_taskspec(spec),
                           activation_checkpointing=spec.training.activation_checkpointing)
            cloud.run_seconds = lambda offer, nodes: compute_hours(job, offer, nodes)[0] * 3600
        return cloud

    def pending_for(self, offer: Offer, nodes: int) -> float:
        """Seconds a launch of ``offer`` waits for its job to leave the queue: from the deadline when
        the task has one (:func:`~spotwise.provisioner.clouds.slurm.launch.pending_allowance`), else
        :attr:`pending_s`."""
        import time

        from spotwise.provisioner.clouds.slurm.launch import pending_allowance

        if self.deadline_at is None or self.run_seconds is None:
            return self.pending_s
        try:
            run_s = self.run_seconds(offer, nodes)
        except Exception:  # noqa: BLE001 - no estimate for this GPU: the default wait
            run_s = None
        return pending_allowance(default_s=self.pending_s, deadline_left_s=self.deadline_at - time.time(), run_s=run_s)

    # -- the clusters ----------------------------------------------------------------------------
    def clusters(self) -> list:
        if self._clusters is None:
            from spotwise.config import slurm_clusters

            self._clusters = slurm_clusters()
        return self._clusters

    def cluster(self, name: str):
        for c in self.clusters():
            if c.name == name:
                return c
        raise InputError(Problem("region", name, "a Slurm cluster of the config file's slurm.clusters: "
                                 + (", ".join(c.name for c in self.clusters()) or "(none configured)")),
                         source="slurm")

    def runner(self, name: str) -> SlurmRunner:
        c = self.cluster(name)
        return SlurmRunner(ssh=c.ssh, slurm_conf=c.slurm_conf)

    def partition(self, region: str, zone: str) -> SlurmPartition:
        """The partition behind an offer, as discovered (asks the cluster if not yet asked)."""
        if region not in self._found:
            self._discover(region)
        return self._found[region].partitions[zone]

    def _discover(self, name: str) -> ClusterOffers:
        from spotwise.config import config_path

        index = next(i for i, c in enumerate(self.clusters()) if c.name == name)
        info = discover(self.runner(name))
        found = cluster_offers(index, self.clusters()[index], info, config_path=config_path())
        self._found[name] = found
        return found

    def offers(self) -> list[Offer]:
        """Every configured cluster's offers; one that cannot be asked is skipped and named in
        :attr:`skipped_regions` (a misconfigured partition is an InputError, not a skip)."""
        out: list[Offer] = []
        for c in self.clusters():
            try:
                found = self._discover(c.name)
            except SlurmUnreachable as e:
                self.skipped_regions[c.name] = f"slurm/{c.name} skipped: {e}"
                continue
            except SlurmCommandError as e:
                self.skipped_regions[c.name] = f"slurm/{c.name} skipped: {e}"
                continue
            self.skipped_regions.pop(c.name, None)
            self.notes += found.notes
            out += found.offers
        return out

    def skipped_error(self) -> InputError:
        """The error of a plan whose only Slurm sites could not be asked: one problem each, naming
        the cluster's entry in the config file."""
        idx = {c.name: i for i, c in enumerate(self.clusters())}
        return InputError([Problem(f"slurm.clusters.{idx.get(name, '?')}", name, f"a reachable cluster ({why})")
                           for name, why in self.skipped_regions.items()], source="slurm")

    def queue(self, offer: Offer, nodes: int) -> Queue | None:
        """Jobs pending in the offer's partition and Slurm's start estimate for ``nodes`` nodes of
        it (``sbatch --test-only``: nothing is submitted). None when the cluster cannot be asked."""
        runner = self.runner(offer.region)
        try:
            pending = runner.run("squeue", "-h", "-p", offer.zone, "-t", "PENDING", "-o", "%i").split()
            test = self._test_only(runner, offer, nodes)
        except (SlurmUnreachable, SlurmCommandError):
            return None
        return Queue(pending=len(pending), start=test)

    @staticmethod
    def _test_only(runner: SlurmRunner, offer: Offer, nodes: int) -> dt.datetime | None:
        import subprocess

        argv = runner.argv(["sbatch", "--test-only", "-p", offer.zone, f"--nodes={nodes}",
                            f"--gres={offer.instance_type}", "--exclusive", "--wrap", "true"])
        # --test-only answers on stderr with exit 0 ("Job N to start at ...")
        proc = subprocess.run(argv, capture_output=True, text=True, env=runner.env(), timeout=runner.timeout_s)
        return parse_test_only(proc.stderr) if proc.returncode == 0 else None

    def head_offer(self, region: str, zone: str) -> Offer:
        """The Ray head: a job of its own (one node, one CPU, no GPU) in a configured partition
        that is not preempted (``zone`` itself when it is not; docs/slurm.md says why). The team's
        prices are per GPU-hour, so a head without GPUs costs nothing."""
        head_zone = zone
        try:
            if self.partition(region, zone).preemptible:
                parts = self._found[region].partitions
                head_zone = next((p for p, part in parts.items() if not part.preemptible), zone)
        except (SlurmUnreachable, SlurmCommandError, KeyError):
            pass          # the plan prices it all the same; the launch asks again
        return Offer(cloud="slurm", instance_type=HEAD_TYPE, accelerator="cpu", accelerator_count=0,
                     region=region, zone=head_zone, market=Market.ON_DEMAND, usd_per_hour=0.0,
                     source="a Ray head without GPUs: the team's prices are per GPU-hour",
                     as_of=dt.date.today().isoformat())

    def notice_window_for(self, offer: Offer) -> float | None:
        """A preemptible partition's GraceTime: the seconds between SIGTERM and the kill."""
        part = self.partition(offer.region, offer.zone)
        return part.grace_s if part.preemptible else None

    # -- launching, listing, ending ----------------------------------------------------------
    #: how long a launch of a task without a deadline waits for its job to leave the queue before
    #: it gives the offer up (the plan's next offer, perhaps a cloud, is tried); with a deadline it is
    #: what the deadline leaves (:meth:`pending_for`); SPOTWISE_SLURM_PENDING_S overrides both
    pending_s: float = 300.0

    def launch(self, request: LaunchRequest) -> list[Node]:
        """One ``sbatch`` job for the request's nodes (the head: 1 node, no GPU, in the partition
        :meth:`head_offer` chose); returns its nodes once Slurm runs it. A job that stays pending
        past :meth:`pending_for`, or pends for a reason that never clears, is cancelled and the offer
        given up (:class:`CapacityError`): nothing is left queued. Every node installs the build
        shipped through the run's storage (:attr:`node_build`, set by :meth:`for_task`)."""
        from spotwise.provisioner.clouds.slurm.launch import launch_job

        return launch_job(self, request)

    def terminate(self, nodes: list[Node]) -> None:
        """``scancel`` the jobs of ``nodes`` (a job is the unit Slurm allocates: ending one node of
        a multi-node job ends the job); a head's ssh port forwards end with it."""
        by_cluster: dict[str, set[str]] = {}
        for n in nodes:
            if n.role == "head" and n.cluster_id:
                self.close_tunnel(n.cluster_id)      # its head is going: so do the forwards to it
            by_cluster.setdefault(n.region, set()).add(str(n.extra.get("slurm_job") or n.instance_id.split("/")[0]))
            n.state = "terminated"
        for region, jobs in by_cluster.items():
            cancel(self.runner(region), sorted(jobs))

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        """Every running node of our jobs (found by the tags in their comment), one per host of a
        job's allocation; a pending job has no nodes yet. ``regions=None``: every configured
        cluster, one that cannot be asked named in :attr:`skipped_regions`."""
        from spotwise.provisioner.clouds.slurm.launch import nodes_of

        out: list[Node] = []
        names = regions if regions is not None else [c.name for c in self.clusters()]
        for name in names:
            try:
                jobs = list_jobs(self.runner(name), cluster_id)
            except SlurmUnreachable as e:
                if regions is not None:
                    raise
                self.skipped_regions[name] = str(e)
                continue
            for job in jobs:
                if job.state == "RUNNING":      # COMPLETING: being ended (preempted, cancelled): gone
                    out += nodes_of(self, name, job)
        return out

    def leftovers(self, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
        """Our jobs still queued (pending: no nodes to list yet) of those clusters (``down``) or of
        every other cluster (``gc``); cancelled unless ``dry_run``."""
        out = []
        for c in self.clusters():
            try:
                runner = self.runner(c.name)
                jobs = [j for j in list_jobs(runner) if j.state not in ("RUNNING", "COMPLETING")
                        and (j.cluster_id in cluster_ids) == match]
            except SlurmUnreachable as e:
                self.skipped_regions[c.name] = str(e)
                continue
            if jobs and not dry_run:
                cancel(runner, [j.job_id for j in jobs])
            out += [f"slurm/{c.name}: queued job {j.job_id} ({j.name}, {j.state}) of cluster {j.cluster_id}"
                    for j in jobs]
        return out

    def was_preempted(self, node: Node) -> bool:
        """Preempted (the job's state says so) or lost (NODE_FAIL, anything else):
        :func:`~spotwise.provisioner.clouds.slurm.launch.preempted`."""
        from spotwise.provisioner.clouds.slurm.launch import ended_state, preempted

        return preempted(ended_state(self.runner(node.region), str(node.extra.get("slurm_job"))))

    def endpoint(self, cluster_id: str, head: Node) -> HeadEndpoint:
        """The head's dashboard and control endpoint at its ``NodeAddr``; for a cluster reached
        over ``ssh``, through this cluster's port forwards via the login host (:meth:`_tunnel`):
        ``http://127.0.0.1:LOCAL``, the control endpoint still listening on the head's address."""
        extra = head.extra
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": extra["auth_token"], "RAY_USAGE_STATS_ENABLED": "0"}
        dash, ctrl = int(extra["dashboard_port"]), int(extra["control_port"])
        urls = (f"http://{head.address}:{dash}", f"http://{head.address}:{ctrl}")
        listen = None
        ssh = self.cluster(head.region).ssh
        if ssh:
            tunnel = self._tunnel(cluster_id, ssh, [(str(head.address), dash), (str(head.address), ctrl)])
            urls, listen = (tunnel.url(dash), tunnel.url(ctrl)), f"{head.address}:{ctrl}"
        return HeadEndpoint(dashboard_url=urls[0], control_url=urls[1], env=env, control_listen=listen,
                            headers={"Authorization": f"Bearer {extra['auth_token']}"})

    def _tunnel(self, cluster_id: str, ssh: str, remotes: list[tuple[str, int]]):
        """This cluster's :class:`~spotwise.provisioner.ssh_tunnel.SshTunnel` to ``remotes`` (one
        per spotwise cluster: started on first use, started anew for another head)."""
        from spotwise.provisioner.ssh_tunnel import SshTunnel
        from spotwise.utils.ssh import parse_destination

        tunnel = self._tunnels.get(cluster_id)
        if tunnel is not None and (tunnel.closed or tunnel.remotes != remotes):
            tunnel.close()
            tunnel = None
        if tunnel is None:
            tunnel = SshTunnel(parse_destination(ssh), remotes, name=cluster_id).start()
            self._tunnels[cluster_id] = tunnel
        return tunnel

    def close_tunnel(self, cluster_id: str) -> list[str]:
        """End the cluster's ssh port forwards, if it has some (what was ended, in words)."""
        tunnel = self._tunnels.pop(cluster_id, None)
        if tunnel is None:
            return []
        pid = tunnel.pid
        tunnel.close()
        return [f"ssh tunnel to {tunnel.dest} (pid {pid})"]

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        """The cluster's ssh port forwards, if any (its jobs were ended by :meth:`terminate`)."""
        return self.close_tunnel(cluster_id)
