"""How often a run reads EC2 at its launch and its teardown (issue 51, item 6: the bench's
``list_calls_per_min`` ≤ 12 for the whole run, launch included), against moto as strict as a real
account (:mod:`emulator.ec2_strict`: every ``Describe*`` counted, a just-created instance not found
once by id). The layout is infra/aws's, as the emulated AWS builds it: private node subnets behind a
NAT gateway, public head subnets, the head reached over ssh."""

from __future__ import annotations

from collections import Counter

import boto3
import pytest
from emulator import ec2_strict
from helpers import offer
from moto import mock_aws

from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.clouds.aws.cloud import AwsCloud
from spotwise.provisioner.sites import unreachable

REGION = "us-east-1"


@pytest.fixture
def infra(aws_env, monkeypatch, tmp_path):
    """Strict moto with infra/aws's network: ``(node subnet ids, head subnet ids)``."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.setenv("SW_EMU_EC2_STRICT", "1")
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "ssh")
    monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "127.0.0.1/32")
    ec2_strict.install()
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.70.0.0/16")["Vpc"]["VpcId"]
        zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
        public = ec2.create_subnet(VpcId=vpc, CidrBlock="10.70.200.0/24", AvailabilityZone=zones[0])["Subnet"]["SubnetId"]
        igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
        ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
        nat = ec2.create_nat_gateway(SubnetId=public, AllocationId=ec2.allocate_address(Domain="vpc")["AllocationId"])
        private_rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=private_rtb, DestinationCidrBlock="0.0.0.0/0",
                         NatGatewayId=nat["NatGateway"]["NatGatewayId"])
        public_rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=public_rtb, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
        nodes, heads = [], []
        for i, z in enumerate(zones):
            s = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.70.{i + 1}.0/24", AvailabilityZone=z)["Subnet"]["SubnetId"]
            ec2.associate_route_table(RouteTableId=private_rtb, SubnetId=s)
            h = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.70.{240 + i}.0/24", AvailabilityZone=z)["Subnet"]["SubnetId"]
            ec2.associate_route_table(RouteTableId=public_rtb, SubnetId=h)
            nodes.append(s)
            heads.append(h)
        monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", ",".join(nodes))
        monkeypatch.setenv("SPOTWISE_AWS_HEAD_SUBNETS", ",".join(heads))
        ec2_strict.reset()
        yield nodes, heads
    ec2_strict.reset()


def _reads() -> Counter:
    return Counter(action for _, action, _ in ec2_strict.calls("Describe"))


def _up(cloud: AwsCloud, cluster: str = "c-r") -> list:
    """What a run does before training: the plan's checks, the cluster's group, the head, two workers."""
    assert unreachable(cloud, REGION) is None
    cloud.prepare_cluster(cluster, "job-r", REGION)
    head_offer = offer("aws", "m6i.large", REGION, market="on-demand", usd=0.1)
    (head,) = cloud.launch(LaunchRequest(cluster_id=cluster, job_id="job-r", offer=head_offer, count=1, role="head"))
    workers = cloud.launch(LaunchRequest(cluster_id=cluster, job_id="job-r", count=2, role="worker",
                                         offer=offer("aws", "p4d.24xlarge", REGION, usd=12.5),
                                         head_address=f"{head.address}:6379"))
    return [head, *workers]


def _ami() -> str:
    ec2_strict.reset()
    ami = boto3.client("ec2", region_name=REGION).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2_strict.reset()
    return ami


def test_a_launch_reads_the_subnets_once_for_the_plans_check_the_head_and_the_workers(infra):
    """The plan's NAT check (subnets, route tables), the group's VPC, the head's public subnets and
    the workers' private ones: one DescribeSubnets in all (it was one for the nodes' subnets and one
    for the heads'). The rest of a launch: the image's root device, each fleet's instances (EC2 does
    not find them the first time), the workers' spot price."""
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    _up(cloud)
    reads = _reads()
    assert reads["DescribeSubnets"] == 1, reads
    assert reads == Counter({"DescribeSubnets": 1, "DescribeRouteTables": 1, "DescribeVpcs": 1, "DescribeImages": 1,
                             "DescribeInstances": 4, "DescribeSpotPriceHistory": 1}), reads


def test_a_head_subnet_missing_from_a_region_fails_only_the_heads_launch(infra, monkeypatch):
    """Read together, the nodes' and the heads' subnets still fail apart: no head subnet in a region
    is the head's site error, naming its setting, and the workers' subnets are still found."""
    from spotwise.provisioner.base import SiteError

    nodes, _ = infra
    monkeypatch.setenv("SPOTWISE_AWS_HEAD_SUBNETS", "subnet-0000000000000000")
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    assert cloud.outbound_problem(REGION) is None
    assert {s["SubnetId"] for s in cloud._subnets(REGION)} == set(nodes)
    with pytest.raises(SiteError) as e:
        cloud._subnets(REGION, head=True)
    assert "SPOTWISE_AWS_HEAD_SUBNETS" in str(e.value)
