"""GCP: whether a region's nodes have a way out to PyPI and the build's store.

A node without an external address (every worker; the head too unless the launcher reaches it over
ssh) reaches the internet only through Cloud NAT: "Cloud NAT overview" (cloud.google.com/nat/docs/
overview) — Private Google Access reaches Google APIs such as Cloud Storage, not PyPI. A node
downloads the shipped wheel and its Python packages at boot, so a region whose network has no
router with a NAT covering the node's subnetwork cannot boot one. infra/gcp gives each region of
its ``var.regions`` a router and a NAT over ``ALL_SUBNETWORKS_ALL_IP_RANGES``.

Read with one ``routers.aggregatedList`` per cloud object (every region in one call; Compute
Engine REST reference, "routers.aggregatedList"; a ``RouterNat``'s
``sourceSubnetworkIpRangesToNat`` is ``ALL_SUBNETWORKS_ALL_IP_RANGES``,
``ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES`` or ``LIST_OF_SUBNETWORKS`` with its ``subnetworks``).
"""

from __future__ import annotations

import re
from typing import Any

ALL_RANGES = ("ALL_SUBNETWORKS_ALL_IP_RANGES", "ALL_SUBNETWORKS_ALL_PRIMARY_IP_RANGES")
_SUBNETWORK_REGION = re.compile(r"(?:^|/)regions/([a-z0-9-]+)/subnetworks/")


def _name(url: str) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def nat_regions(cloud: Any) -> dict[str, list[str]]:
    """Region -> the subnetworks a NAT on the cloud's network covers there (``["*"]``: all of them)."""
    cached = cloud.__dict__.get("_nat_regions")
    if cached is not None:
        return cached
    from spotwise.extras import require

    compute_v1 = require("google.cloud.compute_v1", "gcp", "the GCP cloud")
    routers = cloud._client("RoutersClient")
    req = compute_v1.AggregatedListRoutersRequest(project=cloud.project)
    net = _name(cloud.network)
    out: dict[str, list[str]] = {}
    for scope, scoped in cloud._call("routers.aggregatedList", lambda: routers.aggregated_list(request=req)):
        for r in scoped.routers:
            if _name(r.network) != net:
                continue
            for nat in r.nats:
                covered = out.setdefault(_name(scope), [])
                if nat.source_subnetwork_ip_ranges_to_nat in ALL_RANGES:
                    covered.append("*")
                else:
                    covered += [_name(s.name) for s in nat.subnetworks]
    cloud.__dict__["_nat_regions"] = out
    return out


def outbound_problem(cloud: Any, region: str) -> str | None:
    """Why ``cloud``'s (a ``GcpCloud``) nodes in ``region`` could not fetch the build or packages, or
    None. Not asked when every node gets an external address (``SPOTWISE_GCP_EXTERNAL_IP=1``), nor
    without a configured project (``SPOTWISE_GCP_PROJECT``): the launch would resolve it, a plan
    without one does not ask."""
    if cloud.external_ip or not cloud._project:
        return None
    covered = nat_regions(cloud).get(region, [])
    sub = _name((cloud.subnetwork or "").replace("{region}", region))
    if "*" in covered or (covered and (not sub or sub in covered)):
        return None
    return (f"gcp/{region}: network {_name(cloud.network)} has no Cloud NAT in {region}"
            + (f" covering subnetwork {sub}" if covered else "")
            + ", and nodes have no external address: no outbound access, so a node could not fetch the build "
              "or its packages (Private Google Access reaches Cloud Storage, not PyPI): add the region to "
              "infra/gcp's var.regions (a router and NAT), or SPOTWISE_GCP_EXTERNAL_IP=1")


def site_problem(cloud: Any, region: str, named: frozenset[str]) -> str | None:
    """``GcpCloud.site_problem``: a subnetwork is regional ("Subnets", cloud.google.com/vpc/docs/subnets),
    so with ``SPOTWISE_GCP_SUBNETWORK`` naming one (``regions/us-central1/subnetworks/spotwise``) a node
    can only be created in its region; a ``{region}`` in it names one per region. No read."""
    m = _SUBNETWORK_REGION.search(cloud.subnetwork or "")
    if m and m.group(1) != region:
        return (f"gcp/{region}: SPOTWISE_GCP_SUBNETWORK is in {m.group(1)}, and a node can only use a "
                "subnetwork of its own region")
    return None
