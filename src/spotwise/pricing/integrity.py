"""Integrity checks run on every catalog (the shipped snapshot, each live fetch, the merged view).

Each check returns :class:`Finding`s instead of raising, so ``spotwise catalog info`` can report
them and a fetcher can decide what to do (a fetch whose rows fail is still written, with the
failing rows flagged, so one bad SKU never discards a whole refresh). The checks:

* ``price_not_positive``   — usd_per_hour must be > 0.
* ``spot_ge_on_demand``    — spot must be cheaper than on-demand for the same type and zone
  (region-level on-demand is used where the cloud prices per region).
* ``reserved_ge_on_demand``— a reserved effective rate must be below on-demand in that region.
* ``gpu_fields_inconsistent`` — one instance type must have one (accelerator, count, GPU memory)
  everywhere; GPU memory must match the GPU's spec; GCP ``…-<N>g`` names must have N GPUs.
* ``price_jump``           — a price that moved more than 30 % against the previous catalog.

A finding whose ``key`` already carries the matching flag is ``known`` (the data says so); any
other finding is new and worth a look.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from spotwise.pricing.offer import Market, Offer

JUMP_THRESHOLD = 0.30

#: Nominal per-GPU memory (GiB, vendor "GB" figure), as in gpu_specs.csv.
GPU_MEMORY_GIB = {"A100": 40, "A100-80GB": 80, "H100": 80, "H100-NVL": 94, "H200": 141, "L4": 24,
                  "L40S": 48, "A10G": 24, "A10": 24, "V100": 16, "V100-32GB": 32, "B200": 180}
_GCP_COUNT = re.compile(r"-(\d+)g(?:-nolssd)?$")


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    key: str
    detail: str
    known: bool = False   # the row already carries a flag for this problem

    def to_dict(self) -> dict:
        return {"check": self.check, "key": self.key, "detail": self.detail, "known": self.known}


def check_offers(offers: Sequence[Offer], previous: Iterable[Offer] | None = None) -> list[Finding]:
    """All findings for ``offers`` (and price jumps against ``previous`` when given)."""
    out: list[Finding] = []
    on_demand_zone: dict[tuple, float] = {}
    on_demand_region: dict[tuple, float] = {}
    for o in offers:
        if o.market is Market.ON_DEMAND:
            on_demand_zone[(o.cloud, o.instance_type, o.region, o.zone)] = o.usd_per_hour
            k = (o.cloud, o.instance_type, o.region)
            on_demand_region[k] = min(on_demand_region.get(k, o.usd_per_hour), o.usd_per_hour)

    shapes: dict[tuple, tuple] = {}
    for o in offers:
        if not o.usd_per_hour > 0:
            out.append(Finding("price_not_positive", o.key, f"usd_per_hour={o.usd_per_hour}",
                               "price_not_positive" in o.flags))
        if o.market is Market.SPOT:
            od = on_demand_zone.get((o.cloud, o.instance_type, o.region, o.zone))
            if od is None:
                od = on_demand_region.get((o.cloud, o.instance_type, o.region))
            if od is not None and o.usd_per_hour >= od:
                out.append(Finding("spot_ge_on_demand", o.key, f"spot {o.usd_per_hour} >= on-demand {od}",
                                   "spot_ge_on_demand" in o.flags))
        elif o.market in (Market.RESERVED_1Y, Market.RESERVED_3Y):
            od = on_demand_region.get((o.cloud, o.instance_type, o.region))
            if od is not None and o.usd_per_hour >= od:
                out.append(Finding("reserved_ge_on_demand", o.key, f"{o.market.value} {o.usd_per_hour} >= "
                                   f"on-demand {od}", "reserved_ge_on_demand" in o.flags))
        shape = (o.accelerator, o.accelerator_count, o.gpu_memory_gib)
        first = shapes.setdefault((o.cloud, o.instance_type), shape)
        problems = []
        if first != shape:
            problems.append(f"{shape} differs from {first} elsewhere")
        spec = GPU_MEMORY_GIB.get(o.accelerator)
        if spec is not None and o.gpu_memory_gib is not None and abs(o.gpu_memory_gib - spec) > 0.5:
            problems.append(f"gpu_memory_gib {o.gpu_memory_gib} but {o.accelerator} has {spec}")
        if o.cloud == "gcp":
            m = _GCP_COUNT.search(o.instance_type)
            if m and int(m.group(1)) != o.accelerator_count:
                problems.append(f"name says {m.group(1)} GPUs, row says {o.accelerator_count}")
        if o.accelerator_count < 1:
            problems.append("accelerator_count < 1")
        for p in problems:
            out.append(Finding("gpu_fields_inconsistent", o.key, p, "gpu_fields_inconsistent" in o.flags))
    if previous is not None:
        out.extend(price_jumps(previous, offers))
    return out


def price_jumps(previous: Iterable[Offer], current: Iterable[Offer], threshold: float = JUMP_THRESHOLD) -> list[Finding]:
    """Offers whose price moved by more than ``threshold`` (fraction) against ``previous``."""
    before = {(o.key, o.payment_option): o.usd_per_hour for o in previous}
    out = []
    for o in current:
        old = before.get((o.key, o.payment_option))
        if old and old > 0 and abs(o.usd_per_hour - old) / old > threshold:
            out.append(Finding("price_jump", o.key, f"{old} -> {o.usd_per_hour} "
                               f"({(o.usd_per_hour - old) / old:+.0%})", "price_jump" in o.flags))
    return out


def flag_findings(offers: Sequence[Offer], findings: Iterable[Finding]) -> list[Offer]:
    """Copies of ``offers`` with each new finding's check name added to its row's ``flags``."""
    from dataclasses import replace

    add: dict[str, set[str]] = {}
    for f in findings:
        if not f.known:
            add.setdefault(f.key, set()).add(f.check)
    if not add:
        return list(offers)
    return [replace(o, flags=tuple(sorted(set(o.flags) | add[o.key]))) if o.key in add else o for o in offers]
