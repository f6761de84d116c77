"""A Slurm cluster's offers: each configured partition × GPU shape as an :class:`Offer`.

The shape comes from the cluster (:mod:`~spotwise.provisioner.clouds.slurm.discovery`), the price from the
config file (the team's own ``price_per_gpu_hour``, :mod:`spotwise.config`); nothing else is typed
by the user. One offer is:

* cloud ``slurm``, region = the cluster's ``name``, zone = the partition;
* instance type ``gpu:TYPE:N`` (Slurm's own gres spelling: what ``sbatch --gres`` is given), for
  nodes that carry N GPUs of TYPE (``gpu:h100:8``), accelerator the canonical name of TYPE
  (:func:`spotwise.pricing.accelerators.canonical`);
* market ``spot`` where the partition's jobs are preempted away (``PreemptMode`` REQUEUE or
  CANCEL; its ``GraceTime`` is the notice window), else ``on-demand``;
* ``usd_per_hour`` = the configured price per GPU-hour × N (a "node-hour", as a cloud prices an
  instance-hour); source ``config PATH: slurm.clusters.I.partitions.P.price_per_gpu_hour`` and
  as_of the config file's date.

A partition the config names and the cluster lacks is an :class:`InputError` naming
``slurm.clusters.I.partitions.NAME`` (a misspelt partition must not quietly drop an offer). A
partition the cluster has and the config does not name has no price, so no offer: the team
chooses what spotwise may use by naming it.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.clouds.slurm.discovery import ClusterInfo, SlurmPartition

CLOUD = "slurm"


def instance_type(gpu_type: str, count: int) -> str:
    """``gpu:h100:8`` (``gpu:8`` for untyped gres): the offer's type and ``sbatch --gres`` value."""
    return f"gpu:{gpu_type}:{count}" if gpu_type else f"gpu:{count}"


def gres_of(instance: str) -> tuple[str, int]:
    """``(type, count)`` of an instance type made by :func:`instance_type`."""
    bits = instance.split(":")
    return ("", int(bits[1])) if len(bits) == 2 else (bits[1], int(bits[2]))


@dataclass(slots=True)
class ClusterOffers:
    """What one cluster offers, with the partitions behind them and why anything was left out."""

    offers: list[Offer] = field(default_factory=list)
    partitions: dict[str, SlurmPartition] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def config_source(path: Path) -> tuple[str, str]:
    """``(source, as_of)`` of prices read from the config file at ``path``: its path and the date
    it was last written (UTC), since that is when the team set those prices."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = 0.0
    return f"config {path}", dt.datetime.fromtimestamp(mtime, dt.timezone.utc).date().isoformat()


def cluster_offers(index: int, cluster, info: ClusterInfo, *, config_path: Path) -> ClusterOffers:
    """The offers of ``cluster`` (a :class:`spotwise.config.SlurmClusterConfig`, the
    ``index``-th of ``slurm.clusters``) as the cluster ``info`` describes it."""
    from spotwise.pricing.accelerators import canonical

    missing = [p for p in cluster.partitions if p not in info.partitions]
    if missing:
        raise InputError([Problem(f"slurm.clusters.{index}.partitions.{p}", p,
                                  f"a partition of Slurm cluster {cluster.name!r}: "
                                  + ", ".join(sorted(info.partitions))) for p in missing],
                         source=str(config_path))
    source, as_of = config_source(config_path)
    out = ClusterOffers()
    for pname, pconf in cluster.partitions.items():
        part = info.partitions[pname]
        out.partitions[pname] = part
        if not part.up:
            out.notes.append(f"slurm/{cluster.name}/{pname}: partition is {part.state}")
            continue
        shapes = part.gpu_shapes()
        if not shapes:
            out.notes.append(f"slurm/{cluster.name}/{pname}: no usable node with GPU gres")
        for (gpu, count), _nodes in sorted(shapes.items()):
            try:
                accel = canonical(gpu.replace("_", "-"))
            except InputError:
                out.notes.append(f"slurm/{cluster.name}/{pname}: GPU type {gpu or '(untyped)'!r} is not one "
                                 "spotwise knows the speed of; not offered")
                continue
            nodes = [n for n in part.nodes if n.usable and n.gpus.get(gpu) == count]
            out.offers.append(Offer(
                cloud=CLOUD, instance_type=instance_type(gpu, count), accelerator=accel,
                accelerator_count=count, region=cluster.name, zone=pname,
                market=Market.SPOT if part.preemptible else Market.ON_DEMAND,
                usd_per_hour=round(pconf.price_per_gpu_hour * count, 6),
                vcpus=float(min(n.cpus for n in nodes)),
                memory_gib=round(min(n.memory_mb for n in nodes) / 1024, 3),
                source=f"{source}: slurm.clusters.{index}.partitions.{pname}.price_per_gpu_hour",
                as_of=as_of))
    return out
