"""The plan ranks only sites a run can reach (issue 30, item 2): what is knowable up front leaves a
site out of the plan (an AWS opt-in region nobody named, a GCP region other than the configured
subnetwork's), with why; what is known only at launch (no subnet, no subnetwork there) skips the
site with its reason in the attempts and never fails the run (:mod:`spotwise.provisioner.sites`)."""

from __future__ import annotations

import pytest
from helpers import offer

from spotwise.engine.plan.planner import make_plan
from spotwise.errors import InputError
from spotwise.provisioner.base import SiteError
from spotwise.provisioner.failover import Failover, ProvisioningFailed
from spotwise.taskspec import parse_taskspec


def _spec(clouds: list[str], regions: list[str] | None = None, gpu: str = "A10G", count: int = 1):
    return parse_taskspec({"name": "p", "resources": {"accelerators": {gpu: count}, "clouds": clouds,
                                                      "regions": regions or []}, "training": {"steps": 100}})


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    for var in ("SPOTWISE_AWS_REGIONS", "SPOTWISE_GCP_SUBNETWORK", "SPOTWISE_AWS_SUBNETS", "SPOTWISE_AWS_HEAD_SUBNETS",
                "SPOTWISE_HEAD_PATH", "SPOTWISE_GCP_PROJECT", "SPOTWISE_GCP_ENDPOINT", "SPOTWISE_GCP_ANONYMOUS",
                "SPOTWISE_GCP_EXTERNAL_IP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")     # no credentials here: nothing to ask


def test_aws_opt_in_regions_are_not_ranked_unless_the_user_named_them(monkeypatch):
    plan = make_plan(_spec(["aws"]), ["aws"], storage="s3://b/p")
    regions = {o.region for o in plan.offers}
    assert {"ap-southeast-3", "me-central-1"}.isdisjoint(regions) and "us-east-1" in regions
    assert set(plan.not_ranked) == {"aws/ap-southeast-3", "aws/me-central-1"}
    assert "opt-in" in plan.not_ranked["aws/me-central-1"] and "SPOTWISE_AWS_REGIONS" in plan.not_ranked["aws/me-central-1"]
    assert plan.to_dict()["sites_not_ranked"] == plan.not_ranked
    lines = plan.lines(title="plan")
    assert any("not ranked" in line and "aws/me-central-1" in " ".join(lines) for line in lines)
    assert max(len(line) for line in lines) <= 80
    # named in the task, or in SPOTWISE_AWS_REGIONS: the account has it, the plan ranks it
    assert {o.region for o in make_plan(_spec(["aws"], ["me-central-1"]), ["aws"], storage="s3://b/p").offers} \
        == {"me-central-1"}
    monkeypatch.setenv("SPOTWISE_AWS_REGIONS", "us-east-1,ap-southeast-3")
    plan = make_plan(_spec(["aws"]), ["aws"], storage="s3://b/p")
    assert "ap-southeast-3" in {o.region for o in plan.offers} and set(plan.not_ranked) == {"aws/me-central-1"}


def test_a_configured_gcp_subnetwork_keeps_the_plan_in_its_region(monkeypatch):
    monkeypatch.setenv("SPOTWISE_GCP_SUBNETWORK", "projects/p/regions/us-central1/subnetworks/spotwise")
    plan = make_plan(_spec(["gcp"], gpu="A100", count=8), ["gcp"], storage="s3://b/p")
    assert {o.region for o in plan.offers} == {"us-central1"}
    assert plan.not_ranked and all("SPOTWISE_GCP_SUBNETWORK is in us-central1" in why
                                   for why in plan.not_ranked.values())


def test_a_plan_with_no_usable_site_is_refused_naming_the_field(monkeypatch):
    monkeypatch.setenv("SPOTWISE_GCP_SUBNETWORK", "regions/us-central1/subnetworks/spotwise")
    with pytest.raises(InputError) as e:
        make_plan(_spec(["gcp"], ["europe-west4"], gpu="A100", count=8), ["gcp"], storage="s3://b/p")
    assert "resources.regions" in str(e.value) and "SPOTWISE_GCP_SUBNETWORK" in str(e.value)


def test_a_gcp_region_whose_network_has_no_subnetwork_is_skipped_with_its_reason(gcp_fake, gcp_cloud):
    """Known only by asking: the network's subnetworks in the region. A SiteError, which the
    failover turns into an ``unusable`` attempt, not an InputError that would end the run."""
    gcp_cloud.subnetwork = "regions/us-central1/subnetworks/spotwise"     # the fake's is called "default"
    with pytest.raises(SiteError) as e:
        gcp_cloud.prepare_cluster("c-1", "job-1", "europe-west4")
    assert "SPOTWISE_GCP_SUBNETWORK" in str(e.value) and "europe-west4" in str(e.value)
    attempts: list = []
    with pytest.raises(ProvisioningFailed):
        Failover(cloud_factory=lambda n: gcp_cloud).provision(
            [offer("gcp", "a2-highgpu-1g", "europe-west4", "europe-west4-a", usd=3.0)], cluster_id="c-1",
            job_id="job-1", nodes=1, dedicated_head=True, attempts=attempts,
            prepare=lambda c, r: gcp_cloud.prepare_cluster("c-1", "job-1", r))
    assert [a.outcome for a in attempts] == ["unusable"] and "europe-west4" in attempts[0].message


def test_azure_regions_outside_the_infras_locations_are_not_ranked(monkeypatch):
    """infra/azure gives only the regions of its ``var.locations`` a VNet with a NAT gateway; a VNet
    spotwise would create elsewhere has no outbound access (Azure's VNets made after 2025-09-30 have
    no default outbound), so its nodes could not fetch the build: such a site is left out of the
    plan with why (issue 48, item 5), and ``SPOTWISE_AZURE_LOCATIONS`` says which the infra has."""
    spec = _spec(["azure"], gpu="A100-80GB", count=1)
    everywhere = {o.region for o in make_plan(spec, ["azure"], storage="s3://b/p").offers}
    assert "eastus" in everywhere and len(everywhere) > 1          # the infra's default list: all of them
    monkeypatch.setenv("SPOTWISE_AZURE_LOCATIONS", "eastus")
    plan = make_plan(spec, ["azure"], storage="s3://b/p")
    assert {o.region for o in plan.offers} == {"eastus"}
    assert set(plan.not_ranked) == {f"azure/{r}" for r in everywhere - {"eastus"}}
    why = next(iter(plan.not_ranked.values()))
    assert "SPOTWISE_AZURE_LOCATIONS" in why and "var.locations" in why and "outbound" in why


def test_a_region_whose_head_the_launcher_could_not_reach_is_not_in_the_plan_and_the_plan_says_why(monkeypatch):
    """``SPOTWISE_HEAD_PATH=private:REGION``: a launcher inside that region's network reaches no
    other region's head (issue 48 item 3): those sites are left out, each with the reason, in the
    plan's text (what ``launch --dry-run`` prints) and its JSON; the default (ssh) leaves none out."""
    spec = _spec(["aws"], ["us-east-1", "us-west-2"])
    assert {o.region for o in make_plan(spec, ["aws"], storage="s3://b/p").offers} == {"us-east-1", "us-west-2"}
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private:us-east-1")
    plan = make_plan(spec, ["aws"], storage="s3://b/p")
    assert {o.region for o in plan.offers} == {"us-east-1"}
    assert list(plan.not_ranked) == ["aws/us-west-2"] and "SPOTWISE_HEAD_PATH" in plan.not_ranked["aws/us-west-2"]
    text = " ".join(plan.lines(title="plan"))
    assert "aws/us-west-2: SPOTWISE_HEAD_PATH=private:us-east-1 says this launcher reaches" in text
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private:eu-north-1")
    with pytest.raises(InputError) as e:
        make_plan(spec, ["aws"], storage="s3://b/p")
    assert "SPOTWISE_HEAD_PATH" in str(e.value)


def test_aws_node_subnets_behind_nat_without_head_subnets_leave_aws_out_on_the_ssh_path(monkeypatch):
    """infra/aws's node subnets route through a NAT gateway, where a head's public address never
    answers: on the ssh head path such a configuration without ``SPOTWISE_AWS_HEAD_SUBNETS`` leaves
    AWS out of the plan, saying which setting is missing (the default VPC's subnets are public)."""
    monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", "subnet-a,subnet-b")
    spec = _spec(["aws"], ["us-east-1"])
    with pytest.raises(InputError) as e:
        make_plan(spec, ["aws"], storage="s3://b/p")
    assert "SPOTWISE_AWS_HEAD_SUBNETS" in str(e.value)
    monkeypatch.setenv("SPOTWISE_AWS_HEAD_SUBNETS", "subnet-h")
    assert {o.region for o in make_plan(spec, ["aws"], storage="s3://b/p").offers} == {"us-east-1"}
    monkeypatch.delenv("SPOTWISE_AWS_HEAD_SUBNETS")
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    assert {o.region for o in make_plan(spec, ["aws"], storage="s3://b/p").offers} == {"us-east-1"}


# -- node subnets without an outbound path (issue 48, item 5: AWS and GCP) -----------------------------------
def _aws_vpc(region: str, *, nat: bool) -> str:
    """A VPC in ``region`` laid out as infra/aws lays it out: a private node subnet (no public
    addresses), and with ``nat`` a public subnet holding a NAT gateway that the node subnet's own
    route table sends 0.0.0.0/0 to. The node subnet's id."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.60.0.0/16")["Vpc"]["VpcId"]
    zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
    node = ec2.create_subnet(VpcId=vpc, CidrBlock="10.60.1.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    if nat:
        public = ec2.create_subnet(VpcId=vpc, CidrBlock="10.60.0.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
        ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
        eip = ec2.allocate_address(Domain="vpc")["AllocationId"]
        natgw = ec2.create_nat_gateway(SubnetId=public, AllocationId=eip)["NatGateway"]["NatGatewayId"]
        rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=natgw)
        ec2.associate_route_table(RouteTableId=rtb, SubnetId=node)
    return node


def test_an_aws_region_whose_node_subnets_have_no_nat_is_not_ranked(mocked_aws, monkeypatch):
    """Workers have no public address, yet each fetches the shipped wheel and PyPI packages at boot:
    a configured node subnet whose route table (its own, else the VPC's main one) has no
    0.0.0.0/0 route to a NAT gateway (or to an internet gateway with public addresses) cannot boot
    one. infra/aws routes its node subnets through a NAT gateway; such a region is left out of the
    plan with why, read once per region per plan (DescribeSubnets, DescribeRouteTables)."""
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    east, west = _aws_vpc("us-east-1", nat=False), _aws_vpc("us-west-2", nat=True)
    monkeypatch.setenv("SPOTWISE_AWS_REGIONS", "us-east-1,us-west-2")
    monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", f"{east},{west}")
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    calls: list[tuple[str, str]] = []
    real = AwsCloud._call

    def counted(self, region, op, **kw):
        calls.append((region, op))
        return real(self, region, op, **kw)

    monkeypatch.setattr(AwsCloud, "_call", counted)
    plan = make_plan(_spec(["aws"], ["us-east-1", "us-west-2"]), ["aws"], storage="s3://b/p")
    assert {o.region for o in plan.offers} == {"us-west-2"}
    why = plan.not_ranked["aws/us-east-1"]
    assert east in why and "NAT" in why and "outbound" in why
    text = " ".join(plan.lines(title="plan"))
    assert "aws/us-east-1" in text and "NAT" in text
    assert sorted(calls) == sorted([(r, op) for r in ("us-east-1", "us-west-2")
                                    for op in ("describe_subnets", "describe_route_tables")])


def test_a_gcp_region_without_cloud_nat_is_not_ranked(gcp_fake, monkeypatch):
    """GCP workers have no external address: without a Cloud NAT on a router of the network in the
    node's region they reach Cloud Storage (Private Google Access) but not PyPI. infra/gcp gives each
    of its regions a router with NAT; a region without one is left out of the plan with why, from
    one ``routers.aggregatedList`` per plan."""
    monkeypatch.setenv("SPOTWISE_GCP_ENDPOINT", gcp_fake.endpoint)
    monkeypatch.setenv("SPOTWISE_GCP_PROJECT", "proj-1")
    monkeypatch.setenv("SPOTWISE_GCP_ANONYMOUS", "1")
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    gcp_fake.add_router("proj-1", "us-central1", nat=True)
    gcp_fake.add_router("proj-1", "europe-west4", nat=False)          # a router without NAT is no way out
    plan = make_plan(_spec(["gcp"], ["us-central1", "europe-west4"], gpu="A100", count=8), ["gcp"],
                     storage="s3://b/p")
    assert {o.region for o in plan.offers} == {"us-central1"}
    why = plan.not_ranked["gcp/europe-west4"]
    assert "Cloud NAT" in why and "outbound" in why and "SPOTWISE_GCP_EXTERNAL_IP" in why
    assert "gcp/europe-west4" in " ".join(plan.lines(title="plan"))
    assert [r["path"] for r in gcp_fake.requests] == ["/compute/v1/projects/proj-1/aggregated/routers"]


def test_each_cloud_says_its_own_sites_rules_and_sites_asks_them_without_naming_a_cloud(monkeypatch):
    """The rules live with their clouds (``Cloud.site_problem``, ``Cloud.opt_in_regions``), registered
    with the class: ``sites.unreachable`` asks whatever cloud it is given, and a cloud without rules
    (the base's default) has none; :mod:`spotwise.provisioner.sites` holds no branch on a cloud's name."""
    import ast
    import inspect

    from spotwise.provisioner import sites
    from spotwise.provisioner.base import cloud_class, known_clouds

    class Ruled:
        name = "any"

        def site_problem(self, region, named):
            return f"{region}: not here" if region != "home" else None

    assert sites.unreachable(Ruled(), "away") == "away: not here"
    assert sites.unreachable(Ruled(), "home") is None
    ruled = {name for name in known_clouds() if cloud_class(name).site_problem is not
             cloud_class("local").site_problem}
    assert ruled == {"aws", "azure", "gcp"}
    assert cloud_class("aws").opt_in_regions and not cloud_class("gcp").opt_in_regions
    names = set(known_clouds())
    compared = [n.value for n in ast.walk(ast.parse(inspect.getsource(sites)))
                if isinstance(n, ast.Compare) for n in [*n.comparators, n.left] if isinstance(n, ast.Constant)]
    assert not names & set(compared), compared
