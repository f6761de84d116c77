"""The ``slurm`` cloud: the Slurm clusters the config file names (``slurm.clusters``), as a site.

Each cluster is a region (its ``name``), each configured partition a zone; its offers
(:mod:`~spotwise.provisioner.slurm_offers`) rank in the same plan as the clouds' because this cloud
prices itself (``priced_by_catalog = False``, like the local cloud): the price is the team's own,
from the config file, and the shapes are read from the cluster
(:mod:`~spotwise.provisioner.slurm_discovery`) through :class:`~spotwise.provisioner.slurm_cli.
SlurmRunner` (here, or over ``ssh`` to a login host).

A cluster that cannot be asked (ssh fails, Slurm's commands are missing, the controller does not
answer) is skipped with one line of why in :attr:`skipped_regions`; the plan says so, and when no
other site is left it is an :class:`~spotwise.errors.InputError` (exit 2), never a traceback.

Before a launch, :meth:`SlurmCloud.queue` tells how many jobs wait ahead in a partition and when
Slurm itself expects such a job to start (``sbatch --test-only``, the scheduler's own estimate for
exactly this request), which the plan shows and weighs against the deadline.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import Cloud, LaunchRequest, Node, ProvisionError, register_cloud
from spotwise.provisioner.slurm_cli import SlurmCommandError, SlurmRunner, SlurmUnreachable
from spotwise.provisioner.slurm_discovery import SlurmPartition, discover
from spotwise.provisioner.slurm_offers import ClusterOffers, cluster_offers, gres_of


#: the head's "instance type": a Ray head process on the allocation's first node
HEAD_TYPE = "ray-head-in-allocation"


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

    def __init__(self, clusters: list | None = None) -> None:
        self._clusters = clusters          # SlurmClusterConfig list; None: the config file's, when asked
        self._found: dict[str, ClusterOffers] = {}
        self.skipped_regions: dict[str, str] = {}
        self.notes: list[str] = []

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
        gpu, count = gres_of(offer.instance_type)
        try:
            pending = runner.run("squeue", "-h", "-p", offer.zone, "-t", "PENDING", "-o", "%i").split()
            test = self._test_only(runner, offer, nodes, gpu, count)
        except (SlurmUnreachable, SlurmCommandError):
            return None
        return Queue(pending=len(pending), start=test)

    @staticmethod
    def _test_only(runner: SlurmRunner, offer: Offer, nodes: int, gpu: str, count: int) -> dt.datetime | None:
        import subprocess

        argv = runner.argv(["sbatch", "--test-only", "-p", offer.zone, f"--nodes={nodes}",
                            f"--gres={offer.instance_type}", "--exclusive", "--wrap", "true"])
        # --test-only answers on stderr with exit 0 ("Job N to start at ...")
        proc = subprocess.run(argv, capture_output=True, text=True, env=runner.env(), timeout=runner.timeout_s)
        return parse_test_only(proc.stderr) if proc.returncode == 0 else None

    def head_offer(self, region: str, zone: str) -> Offer:
        """The Ray head runs inside the job's allocation, on its first node (Ray's own Slurm
        recipe; docs/slurm.md says why): it has no price of its own, the nodes' price covers it."""
        return Offer(cloud="slurm", instance_type=HEAD_TYPE, accelerator="cpu", accelerator_count=0,
                     region=region, zone=zone, market=Market.ON_DEMAND, usd_per_hour=0.0,
                     source="the Ray head runs on the job's first node, billed with it",
                     as_of=dt.date.today().isoformat())

    def notice_window_for(self, offer: Offer) -> float | None:
        """A preemptible partition's GraceTime: the seconds between SIGTERM and the kill."""
        part = self.partition(offer.region, offer.zone)
        return part.grace_s if part.preemptible else None

    # -- launching (issue 36, items 3 and 7: not in this stage) ---------------------------------
    def launch(self, request: LaunchRequest) -> list[Node]:
        raise ProvisionError("launching on a Slurm cluster is not implemented yet (issue 36, item 3)",
                             offer_key=request.offer.key, cloud="slurm", region=request.offer.region)

    def terminate(self, nodes: list[Node]) -> None:
        if nodes:
            raise ProvisionError("ending Slurm jobs is not implemented yet (issue 36, item 7)")

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        return []
