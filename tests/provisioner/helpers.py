"""Shared helpers for provisioner tests (plain functions, imported by the test modules)."""

from __future__ import annotations

from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner import instance_types


def offer(cloud: str, instance_type: str, region: str, zone: str = "", market: str = "spot",
          usd: float = 10.0) -> Offer:
    it = instance_types.lookup(cloud, instance_type)
    return Offer(cloud=cloud, instance_type=instance_type,
                 accelerator=it.accelerator if it else "A100",
                 accelerator_count=it.accelerator_count if it else 8,
                 region=region, zone=zone, market=Market.parse(market), usd_per_hour=usd,
                 source="test", as_of="2025-01-01")
