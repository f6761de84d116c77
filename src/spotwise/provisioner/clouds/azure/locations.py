"""Azure: the locations whose nodes have a way out, known without asking ARM.

Only the locations infra/azure sets up (``var.locations``; spotwise reads them from
``SPOTWISE_AZURE_LOCATIONS``, unset: infra/azure's default list) get a VNet whose node subnet has a
NAT gateway. A VNet spotwise would create anywhere else has no outbound access — VNets made after
2025-09-30 have no default outbound access ("Default outbound access in Azure",
learn.microsoft.com/azure/virtual-network/ip-services/default-outbound-access) — so its nodes could
not fetch the build or packages: the plan leaves such a location out, named or not.
"""

from __future__ import annotations

import functools
from typing import Any

from spotwise.config import setting


@functools.cache
def infra_locations() -> frozenset[str]:
    """infra/azure's default ``var.locations``: every Azure region the plan ranks by default
    (``tests/provisioner/test_infra_regions.py`` keeps that list equal to
    :func:`~spotwise.provisioner.sites.default_regions`)."""
    from spotwise.provisioner.sites import default_regions

    return frozenset(default_regions("azure"))


def site_problem(cloud: Any, region: str, named: frozenset[str]) -> str | None:
    """``AzureCloud.site_problem``: why ``region`` has no outbound path for nodes, or None."""
    locations = [x.strip() for x in (setting("SPOTWISE_AZURE_LOCATIONS") or "").split(",") if x.strip()]
    if region in (locations or infra_locations()):
        return None
    return (f"azure/{region} is not in SPOTWISE_AZURE_LOCATIONS (infra/azure's var.locations: "
            f"{', '.join(locations) or 'its default list'}): a VNet there has no NAT gateway, so no "
            "outbound access, and its nodes could not fetch the build; add the region to both")
