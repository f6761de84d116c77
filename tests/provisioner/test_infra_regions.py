"""``infra/`` gives every region a plan may rank a network, with outbound access for nodes that have
no public address (issue 30, item 4). The region sets are the catalog's
(:func:`spotwise.provisioner.sites.default_regions`); the Terraform files are read as text (no
provider is downloaded at test time)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from spotwise.provisioner.sites import AWS_OPT_IN_REGIONS, default_regions

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"


def _list_default(tf: str, variable: str) -> list[str]:
    """The default of ``variable "<variable>"`` (a list of strings) in a Terraform file's text."""
    m = re.search(r'variable "%s" \{(.*?)\n\}' % re.escape(variable), tf, re.S)
    assert m, f"no variable {variable!r}"
    d = re.search(r"default\s*=\s*\[(.*?)\]", m.group(1), re.S)
    assert d, f"variable {variable!r} has no list default"
    return re.findall(r'"([a-z0-9-]+)"', d.group(1))


@pytest.fixture(scope="module", autouse=True)
def _home(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SPOTWISE_HOME", str(tmp_path_factory.mktemp("home")))
    yield
    mp.undo()


def test_the_default_regions_are_the_catalogs_and_leave_out_aws_opt_in_regions():
    aws = default_regions("aws")
    assert "us-east-1" in aws and not AWS_OPT_IN_REGIONS & set(aws)
    assert "us-central1" in default_regions("gcp") and "eastus" in default_regions("azure")


def test_aws_has_a_private_network_with_nat_in_every_region_a_plan_may_rank():
    tf = (INFRA / "aws" / "regions.tf").read_text()
    providers = dict(re.findall(r'provider "aws" \{\s*alias\s*=\s*"(\w+)"\s*region\s*=\s*"([a-z0-9-]+)"', tf))
    modules = re.findall(r'module "network_(\w+)" \{(.*?)\n\}', tf, re.S)
    built = _list_default(tf, "regions")
    for region in default_regions("aws"):
        alias = region.replace("-", "_")
        assert providers.get(alias) == region, region
        assert region in built, region
        [body] = [b for name, b in modules if name == alias]
        assert f"aws = aws.{alias}" in body and 'source    = "./network"' in body
    cidrs = re.findall(r'cidr\s*=\s*"([0-9./]+)"', tf)
    assert len(cidrs) == len(set(cidrs)) == len(modules)                     # one distinct /16 per region
    net = (INFRA / "aws" / "network" / "main.tf").read_text()
    assert "map_public_ip_on_launch = false" in net and 'resource "aws_nat_gateway"' in net
    assert re.search(r'resource "aws_route_table" "nodes".*?nat_gateway_id\s*=\s*aws_nat_gateway', net, re.S)
    assert 'vpc_endpoint_type = "Gateway"' in net                            # checkpoints bypass the NAT


def test_aws_regions_tf_is_what_the_generator_writes_from_the_catalog():
    """A catalog with a new region makes this fail until ``scripts/gen_infra_regions.py`` is re-run."""
    spec = importlib.util.spec_from_file_location("gen_infra_regions", ROOT / "scripts" / "gen_infra_regions.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (INFRA / "aws" / "regions.tf").read_text() == gen.render(gen.regions([]))


def test_gcp_has_a_subnetwork_and_cloud_nat_in_every_region_a_plan_may_rank():
    tf = (INFRA / "gcp" / "main.tf").read_text()
    assert set(default_regions("gcp")) <= set(_list_default(tf, "regions"))
    for kind in ("google_compute_subnetwork", "google_compute_router", "google_compute_router_nat"):
        assert re.search(r'resource "%s" "spotwise" \{\s*for_each\s*=\s*toset\(var.regions\)' % kind, tf), kind
    assert "private_ip_google_access = true" in tf
    # the controller is told the per-region subnetwork, which the provisioner fills in per node
    assert 'output "subnetwork" { value = "regions/{region}/subnetworks/spotwise-{region}" }' in tf


def test_gcp_nodes_go_into_their_own_regions_subnetwork(monkeypatch):
    from helpers import offer

    from spotwise.provisioner.base import LaunchRequest
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud
    from spotwise.provisioner.sites import unreachable

    cloud = GcpCloud(project="p", subnetwork="regions/{region}/subnetworks/spotwise-{region}", image="img")
    req = LaunchRequest(cluster_id="c", job_id="j", offer=offer("gcp", "a2-highgpu-1g", "europe-west4",
                                                                "europe-west4-a", usd=3.0))
    body = cloud.instance_body(req, "n1")
    assert body.network_interfaces[0].subnetwork == "regions/europe-west4/subnetworks/spotwise-europe-west4"
    assert unreachable(cloud, "europe-west4") is None                     # a template restricts no region


def test_azure_has_a_vnet_with_a_nat_gateway_in_every_region_a_plan_may_rank():
    tf = (INFRA / "azure" / "main.tf").read_text()
    assert set(default_regions("azure")) <= set(_list_default(tf, "locations"))
    for kind, name in (("azurerm_virtual_network", "spotwise"), ("azurerm_subnet", "nodes"),
                       ("azurerm_nat_gateway", "spotwise"), ("azurerm_subnet_nat_gateway_association", "nodes")):
        assert re.search(r'resource "%s" "%s" \{\s*for_each\s*=\s*toset\(var.locations\)' % (kind, name), tf), kind
    assert 'name                = "spotwise-${each.key}"' in tf                # the VNet azure.py looks for
