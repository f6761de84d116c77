"""What a run pays to move its checkpoints: the data-transfer price between where checkpoints are
stored and where the cluster runs, per GB, with its source.

A run writes every checkpoint from the cluster's site to the checkpoint store and reads one back on
every resume (a preemption, a move to another region or cloud). Within one region of one cloud
that is free; between regions of one cloud it is billed at the inter-region rate of the cloud the
bytes leave; between clouds at the internet rate of the cloud the bytes leave. Ingress is free
everywhere. The planner charges each offer for that traffic, so an offer on another cloud than the
checkpoint store ranks by what it really costs (:func:`transfer_usd_per_gb`).

Where the checkpoint store lives is read from its URI (:func:`storage_site`): ``s3://`` is AWS (its
region from ``SPOTWISE_STORAGE_REGION``, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else unknown),
unless ``AWS_ENDPOINT_URL[_S3]`` points elsewhere: GCS's S3-compatible endpoint is GCP, a loopback
or private endpoint (a test's moto server, an in-VPC MinIO) is treated as local (no charge, said in
the plan's notes), any other host is unknown. ``gs://`` is GCP, ``az://`` is Azure, ``file://`` is local.
"""

from __future__ import annotations

import csv
import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from urllib.parse import urlparse

from spotwise.config import environ

BYTES_PER_PARAM = 12.0   # fp32 weights (4 B) + Adam's two moments (8 B): what a training checkpoint holds


@dataclass(frozen=True, slots=True)
class Site:
    cloud: str               # aws | gcp | azure | local | unknown
    region: str | None = None


@dataclass(frozen=True, slots=True)
class Rate:
    usd_per_gb: float
    source: str
    as_of: str
    scope: str               # same_region | inter_region | internet | none


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str], Rate]:
    text = resources.files("spotwise.pricing").joinpath("data/egress.csv").read_text()
    return {(r["cloud"], r["scope"]): Rate(float(r["usd_per_gb"]), r["source"], r["as_of"], r["scope"])
            for r in csv.DictReader(text.splitlines())}


def _private_host(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private


def storage_site(uri: str, env: dict[str, str] | None = None) -> Site:
    """Where the checkpoint store of ``uri`` lives (see the module docstring)."""
    env = environ() if env is None else env
    scheme = urlparse(uri).scheme
    if scheme == "file":
        return Site("local")
    if scheme == "gs":
        return Site("gcp", env.get("SPOTWISE_STORAGE_REGION"))
    if scheme == "az":
        return Site("azure", env.get("SPOTWISE_STORAGE_REGION"))
    if scheme == "s3":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        region = env.get("SPOTWISE_STORAGE_REGION") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if endpoint:
            host = urlparse(endpoint).hostname or ""
            if _private_host(host):
                return Site("local")
            if host.endswith("storage.googleapis.com"):
                return Site("gcp", env.get("SPOTWISE_STORAGE_REGION"))
            if not host.endswith("amazonaws.com"):
                return Site("unknown")
        return Site("aws", region)
    return Site("unknown")


def transfer_rate(src: Site, dst: Site) -> Rate:
    """Price per GB of bytes leaving ``src`` for ``dst`` (billed by the cloud they leave)."""
    if "local" in (src.cloud, dst.cloud) or src.cloud == "unknown":
        return Rate(0.0, "no transfer charge: the store is local or private to the cluster's network", "", "none")
    if src.cloud == "slurm":
        # bytes leaving a team's own Slurm cluster cross the team's own network: no cloud bills them
        # (bytes coming back from a cloud's store are billed by that cloud, below)
        return Rate(0.0, "no transfer charge: bytes leave the team's own Slurm cluster", "", "none")
    if src.cloud == dst.cloud:
        same = src.region is not None and src.region == dst.region
        return _table()[(src.cloud, "same_region" if same else "inter_region")]
    return _table()[(src.cloud, "internet")]


def copy_rate(src_uri: str, dst_uri: str) -> Rate:
    """The price per GB (with its source and date) of copying from store ``src_uri`` to ``dst_uri``."""
    if src_uri == dst_uri:
        return Rate(0.0, "no transfer: the same store", "", "none")
    return transfer_rate(storage_site(src_uri), storage_site(dst_uri))


def copy_usd(src_uri: str, dst_uri: str, gb: float) -> float:
    """What copying ``gb`` from checkpoint store ``src_uri`` to store ``dst_uri`` costs (a run with
    a store per cloud that moves between clouds: :mod:`spotwise.engine.run.run_stores`); 0 for one store."""
    return copy_rate(src_uri, dst_uri).usd_per_gb * gb


def checkpoint_gb(params: float) -> float:
    """Size of one training checkpoint of a model with ``params`` parameters, in GB (10^9 B)."""
    return params * BYTES_PER_PARAM / 1e9


@dataclass(frozen=True, slots=True)
class TransferCost:
    usd: float
    note: str


def run_transfer_cost(*, storage: Site, cluster: Site, checkpoint_gb: float, writes: float,
                      reads: float) -> TransferCost:
    """Expected transfer cost of a run: ``writes`` checkpoints leaving the cluster for the store and
    ``reads`` (resumes) leaving the store for the cluster."""
    out, back = transfer_rate(cluster, storage), transfer_rate(storage, cluster)
    usd = writes * checkpoint_gb * out.usd_per_gb + reads * checkpoint_gb * back.usd_per_gb
    if usd <= 0:
        return TransferCost(0.0, "")
    where = f"{storage.cloud}/{storage.region or '?'}"
    note = (f"checkpoints cross to the store on {where}: {writes:.3g} writes x {checkpoint_gb:.3g} GB at "
            f"${out.usd_per_gb}/GB ({out.scope}, {out.source}) + {reads:.3g} resume reads at ${back.usd_per_gb}/GB "
            f"= ${usd:,.4f}")
    return TransferCost(usd, note)
