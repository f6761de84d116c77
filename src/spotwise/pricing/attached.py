"""What a cloud bills for each node besides the instance: its boot disk and its public IPv4 address,
at their published prices, each with its source and date (package data ``data/attached.csv``).

A GPU node is more than its instance-hour: every cloud bills the disk it boots from by the GB-month
(AWS EBS gp3, GCP persistent disk, Azure managed disk by size tier) and, where the node has one, its
public IPv4 address by the hour (AWS since 2024-02-01 on every address; GCP on external addresses).
The ledger bills each of them per second next to its node, at the price in force when the node
launched (:meth:`~spotwise.engine.state.ledger.Ledger.open`), so the budget cap, the lease's deadline and
the cost report include them; the planner adds them to every offer's expected cost.

What each cloud's provisioner creates per node (:data:`BOOT_DISKS`, :func:`node_charges`):

* **aws**: a gp3 root volume of ``root_volume_gib`` (200 GiB); a public IPv4 when the subnet maps one
  (the instance's ``PublicIpAddress``; the plan assumes one: the default VPC's subnets map one);
* **gcp**: a boot disk of ``boot_disk_gb`` typed per machine series (``pd-balanced``; on the
  Hyperdisk-only series ``hyperdisk-balanced``, priced as pd-balanced until its price is in the
  data: :data:`PRICED_AS`; ``provisioner/clouds/gcp/machines.py``); an
  external IPv4 only with ``SPOTWISE_GCP_EXTERNAL_IP=1`` (the Spot rate on spot nodes);
* **azure**: a Premium_LRS OS disk of ``os_disk_gib``, billed at the smallest P tier that holds it
  (200 GiB: P15); on a size that is not Premium Storage capable (no GPU size of the catalog) a
  StandardSSD_LRS disk, priced as Premium_LRS until its price is in the data (:data:`PRICED_AS`);
  a Standard public IPv4 on the head only, when the launcher reaches it over ssh.

A head reached over ssh (``SPOTWISE_HEAD_PATH=ssh``, the default, on a cloud whose heads are) has a
public IPv4 on every cloud: the plan bills the head's (``engine/plan/planner.py``'s
``head_public_ip``), the ledger each launched node's as its cloud reported it.

Prices are the US list prices (other regions differ by a few percent; the source says so).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from spotwise.errors import InputError, Problem

#: cloud -> (the disk type its provisioner creates, the Cloud attribute holding its size in GiB)
BOOT_DISKS: dict[str, tuple[str, str]] = {"aws": ("gp3", "root_volume_gib"), "gcp": ("pd-balanced", "boot_disk_gb"),
                                          "azure": ("Premium_LRS", "os_disk_gib")}
#: (cloud, disk type) created without a price row yet -> the priced type that stands in for it, said
#: so in the charge's description (never a silent substitute)
PRICED_AS: dict[tuple[str, str], str] = {("gcp", "hyperdisk-balanced"): "pd-balanced",
                                         ("azure", "StandardSSD_LRS"): "Premium_LRS"}


@dataclass(frozen=True, slots=True)
class Charge:
    """One thing a node carries that its cloud bills by time: ``kind`` ``disk`` or ``ipv4``."""

    kind: str
    what: str                # e.g. "gp3 200 GiB", "public IPv4"
    usd_per_hour: float
    source: str
    as_of: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "what": self.what, "usd_per_hour": round(self.usd_per_hour, 6),
                "source": self.source, "as_of": self.as_of}


@dataclass(frozen=True, slots=True)
class _Row:
    cloud: str
    item: str
    kind: str
    unit: str
    usd: float
    max_gib: float | None
    hours_per_month: float | None
    source: str
    as_of: str


@lru_cache(maxsize=1)
def _rows() -> tuple[_Row, ...]:
    text = resources.files("spotwise.pricing").joinpath("data/attached.csv").read_text()
    return tuple(_Row(r["cloud"], r["item"], r["kind"], r["unit"], float(r["usd"]),
                      float(r["max_gib"]) if r["max_gib"] else None,
                      float(r["hours_per_month"]) if r["hours_per_month"] else None, r["source"], r["as_of"])
                 for r in csv.DictReader(text.splitlines()))


def disk(cloud: str, disk_type: str, gib: float) -> Charge:
    """The hourly price of one ``gib`` disk of ``disk_type`` on ``cloud`` (an InputError naming the
    size or the type when there is no published price for it)."""
    if not gib > 0:
        raise InputError(Problem("disk_gib", gib, "a disk size in GiB > 0"), source=f"{cloud} disk price")
    rows = [r for r in _rows() if r.cloud == cloud and r.kind == "disk" and r.item == disk_type]
    if not rows:
        known = sorted({r.item for r in _rows() if r.cloud == cloud and r.kind == "disk"})
        raise InputError(Problem("disk_type", disk_type, f"a {cloud} disk type with a price: {', '.join(known)}"),
                         source=f"{cloud} disk price")
    if rows[0].unit == "gb_month":
        r = rows[0]
        usd_h = r.usd * gib / (r.hours_per_month or 730.0)
        return Charge("disk", f"{disk_type} {gib:g} GiB", usd_h,
                      f"{r.source}: ${r.usd}/GB-month over {r.hours_per_month:g} h", r.as_of)
    tiers = sorted((r for r in rows if r.max_gib is not None and r.max_gib >= gib), key=lambda r: r.max_gib or 0)
    if not tiers:
        raise InputError(Problem("disk_gib", gib, f"at most {max(r.max_gib or 0 for r in rows):g} GiB "
                                 f"(the largest {disk_type} tier with a price)"), source=f"{cloud} disk price")
    r = tiers[0]
    return Charge("disk", f"{disk_type} {gib:g} GiB (billed as the {r.max_gib:g} GiB tier)",
                  r.usd / (r.hours_per_month or 730.0), f"{r.source}: ${r.usd}/month over {r.hours_per_month:g} h",
                  r.as_of)


def public_ipv4(cloud: str, market: str) -> Charge:
    """The hourly price of one public IPv4 address on a node of ``market`` on ``cloud``."""
    items = {"aws": ["public_ipv4"], "gcp": ["external_ipv4_spot" if market == "spot" else "external_ipv4"],
             "azure": ["public_ipv4"]}
    for item in items.get(cloud, []):
        for r in _rows():
            if r.cloud == cloud and r.item == item:
                return Charge("ipv4", "public IPv4", r.usd, r.source, r.as_of)
    raise InputError(Problem("cloud", cloud, "a cloud with a public IPv4 price (aws, gcp, azure)"),
                     source="ipv4 price")


def node_charges(cloud: Any, region: str, market: str, *, public_ip: bool | None = None,
                 disk_type: str | None = None) -> list[Charge]:
    """What one node of ``cloud`` (a :class:`~spotwise.provisioner.base.Cloud`) in ``region`` on
    ``market`` carries, as its provisioner creates it (module docstring). ``public_ip``: whether the
    node has a public IPv4 (a launched node: its cloud said); None: as this cloud is configured (the
    plan). ``disk_type``: the boot disk's type where the cloud chose it per machine, else the
    cloud's one type. A cloud not in :data:`BOOT_DISKS` (the local cloud, a fake) carries nothing billed."""
    name = getattr(cloud, "name", "")
    if name not in BOOT_DISKS:
        return []
    default_type, attr = BOOT_DISKS[name]
    disk_type = disk_type or default_type
    gib = float(getattr(cloud, attr))
    if (name, disk_type) in PRICED_AS:
        stand_in = disk(name, PRICED_AS[(name, disk_type)], gib)
        out = [Charge("disk", f"{disk_type} {gib:g} GiB (priced as {stand_in.what.split()[0]}: no published "
                      f"{disk_type} price in data/attached.csv yet)", stand_in.usd_per_hour, stand_in.source,
                      stand_in.as_of)]
    else:
        out = [disk(name, disk_type, gib)]
    if public_ip is None:
        public_ip = {"aws": True, "gcp": bool(getattr(cloud, "external_ip", False))}.get(name, False)
    if public_ip:
        out.append(public_ipv4(name, market))
    return out

