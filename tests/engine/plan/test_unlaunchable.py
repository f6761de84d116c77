"""A size no node image of its cloud can run is never offered: Azure's NV A10 v5 sizes need
NVIDIA's GRID driver, which the default image (Ubuntu HPC, datacenter driver) lacks."""

from __future__ import annotations

from spotwise.engine.plan.planner import candidate_offers
from spotwise.pricing.catalog import find_offers
from spotwise.provisioner.clouds.azure.cloud import AzureCloud
from spotwise.taskspec import parse_taskspec


def test_sizes_the_image_cannot_drive_are_not_offered():
    a10 = [o for o in find_offers({"A10": 1}, clouds=["azure"], market=["spot", "on-demand"])]
    assert any("A10_v5" in o.instance_type for o in a10), "the catalog sells NV A10 v5 sizes"
    assert AzureCloud.why_unlaunchable("Standard_NV36ads_A10_v5")
    assert AzureCloud.why_unlaunchable("Standard_NC24ads_A100_v4") is None
    spec = parse_taskspec({"name": "a10", "resources": {"accelerators": {"A10": 1}, "clouds": ["azure"]},
                           "training": {"steps": 10}})
    offered = candidate_offers(spec, ["azure"])
    assert not any("A10_v5" in o.instance_type for o in offered)
