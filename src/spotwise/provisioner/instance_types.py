"""Which instance types each cloud sells, with which GPUs, where — checked before any launch.

A bad offer (unknown instance type for the cloud, a GPU type/count that the type does not carry,
a region that does not sell it) must fail with an :class:`~spotwise.errors.InputError` naming the
field, what was given and what is allowed, *before* an API call creates anything. The table is
package data (``data/instance_types.csv``, provenance in ``data/README.md``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Offer


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceType:
    cloud: str
    name: str
    accelerator: str
    accelerator_count: int
    vcpus: float
    memory_gib: float
    regions: frozenset[str]


@lru_cache(maxsize=1)
def table() -> dict[tuple[str, str], InstanceType]:
    """``{(cloud, instance_type): InstanceType}`` from the shipped CSV."""
    text = resources.files("spotwise.provisioner").joinpath("data/instance_types.csv").read_text()
    out: dict[tuple[str, str], InstanceType] = {}
    for r in csv.DictReader(text.splitlines()):
        out[(r["cloud"], r["instance_type"])] = InstanceType(
            cloud=r["cloud"], name=r["instance_type"], accelerator=r["accelerator"],
            accelerator_count=int(r["accelerator_count"]), vcpus=float(r["vcpus"]),
            memory_gib=float(r["memory_gib"]), regions=frozenset(r["regions"].split(";")))
    return out


def lookup(cloud: str, instance_type: str) -> InstanceType | None:
    return table().get((cloud, instance_type))


def types_for(cloud: str) -> list[str]:
    return sorted(name for (c, name) in table() if c == cloud)


def validate_offer(offer: Offer) -> InstanceType:
    """Return the offer's :class:`InstanceType`, or raise InputError listing every problem."""
    it = lookup(offer.cloud, offer.instance_type)
    if it is None:
        raise InputError(Problem("instance_type", offer.instance_type,
                                 f"a GPU instance type sold on {offer.cloud}: "
                                 + ", ".join(types_for(offer.cloud))), source=f"offer {offer.key}")
    problems = []
    if offer.region not in it.regions:
        problems.append(Problem("region", offer.region,
                                f"a region that sells {it.name} ({it.accelerator}×{it.accelerator_count}): "
                                + ", ".join(sorted(it.regions))))
    if offer.accelerator and offer.accelerator.lower() != it.accelerator.lower():
        problems.append(Problem("accelerator", offer.accelerator, f"{it.accelerator} (what {it.name} carries)"))
    if offer.accelerator_count and offer.accelerator_count != it.accelerator_count:
        problems.append(Problem("accelerator_count", offer.accelerator_count,
                                f"{it.accelerator_count} (what {it.name} carries)"))
    if problems:
        raise InputError(problems, source=f"offer {offer.key}")
    return it
