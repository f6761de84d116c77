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
from emulator.aws import VpcLayout
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
        zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]][:2]
        by_zone_nodes, by_zone_heads = VpcLayout.of("10.70").build(ec2, zones)
        nodes, heads = list(by_zone_nodes.values()), list(by_zone_heads.values())
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
    for the heads'), and the VPC's ranges from the route tables' local routes (no DescribeVpcs). The
    rest of a launch: the image's root device, each fleet's instances (EC2 does not find them the
    first time), the workers' spot price."""
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    _up(cloud)
    reads = _reads()
    assert reads["DescribeSubnets"] == 1, reads
    assert reads == Counter({"DescribeSubnets": 1, "DescribeRouteTables": 1, "DescribeImages": 1,
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


@pytest.mark.parametrize("nat_check", [True, False])
def test_the_groups_orchestrator_ports_open_to_each_of_the_vpcs_ranges(infra, monkeypatch, nat_check):
    """The dashboard and control ports open to the VPC: every IPv4 CIDR block it has, read from the
    route tables the plan's NAT check read, else from DescribeVpcs (the default VPC's, no subnets
    configured, no NAT check); ``SPOTWISE_AWS_CLIENT_CIDRS`` instead, with no VPC read at all."""
    ec2 = boto3.client("ec2", region_name=REGION)
    if not nat_check:
        for var in ("SPOTWISE_AWS_SUBNETS", "SPOTWISE_AWS_HEAD_SUBNETS"):
            monkeypatch.delenv(var)
        monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    vpc = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]["VpcId"] \
        if not nat_check else ec2.describe_subnets(SubnetIds=infra[0])["Subnets"][0]["VpcId"]
    primary = ec2.describe_vpcs(VpcIds=[vpc])["Vpcs"][0]["CidrBlock"]
    second = "10.90.0.0/16"
    ec2.associate_vpc_cidr_block(VpcId=vpc, CidrBlock=second)
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    assert unreachable(cloud, REGION) is None
    cloud.prepare_cluster("c-v", "job-v", REGION)
    rules = cloud.security_group_rules("c-v", REGION)
    opened = {r["FromPort"]: {x["CidrIp"] for x in r.get("IpRanges", [])} for r in rules if r.get("FromPort") in
              (cloud.dashboard_port, cloud.control_port)}
    assert opened == {p: {primary, second} for p in (cloud.dashboard_port, cloud.control_port)}
    assert _reads()["DescribeVpcs"] == (0 if nat_check else 1)
    monkeypatch.setenv("SPOTWISE_AWS_CLIENT_CIDRS", "192.0.2.0/24")
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    cloud.prepare_cluster("c-w", "job-w", REGION)
    assert _reads()["DescribeVpcs"] == 0


def test_a_teardown_reads_the_clusters_instances_once_after_ending_them(infra):
    """The fleet's teardown (list the cluster's instances, end them, clean up its network) reads
    DescribeInstances twice — the listing, then one read by the cluster's tag that says both that
    none is live any more and which ended ones may have left interfaces — where it read four times
    (the listing, the group's users by group and by tag, the ended ones); then the interfaces the
    group holds. The group this cloud object created is deleted by its id, not listed again.
    Nothing is left: no instance live, no interface, no group."""
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    _up(cloud)
    gid = cloud._groups[("c-r", REGION)]
    ec2_strict.reset()
    cloud.terminate(cloud.list_nodes("c-r", regions=[REGION]))
    done = cloud.cleanup_cluster("c-r")
    reads = _reads()
    assert reads == Counter({"DescribeInstances": 2, "DescribeNetworkInterfaces": 2}), reads
    ec2 = boto3.client("ec2", region_name=REGION)
    states = [i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert len(states) == 3 and set(states) <= {"shutting-down", "terminated"}
    assert f"aws security group {gid} ({REGION})" in done
    assert not ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [gid]}])["SecurityGroups"]
    assert not ec2.describe_network_interfaces(Filters=[{"Name": "group-id", "Values": [gid]}])["NetworkInterfaces"]


def test_an_instance_of_another_owner_in_the_group_keeps_it_and_its_interfaces(infra):
    """The teardown no longer asks which instances use the group: an instance that is not the
    cluster's (not tagged with it) yet carries its group keeps the group in use, and EC2's refusal
    (``DependencyViolation``) is what the cleanup waits out; that instance's interface is never
    detached or deleted."""
    from spotwise.provisioner.base import ProvisionError

    nodes, _ = infra
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    _up(cloud)
    gid = cloud._groups[("c-r", REGION)]
    ec2 = boto3.client("ec2", region_name=REGION)
    other = ec2.run_instances(ImageId=_ami(), MinCount=1, MaxCount=1, InstanceType="m6i.large",
                              SubnetId=nodes[0], SecurityGroupIds=[gid])["Instances"][0]
    cloud.terminate(cloud.list_nodes("c-r", regions=[REGION]))
    with pytest.raises(ProvisionError):
        cloud._delete_group(REGION, gid, "c-r", timeout_s=0)
    enis = ec2.describe_network_interfaces(Filters=[{"Name": "attachment.instance-id",
                                                     "Values": [other["InstanceId"]]}])["NetworkInterfaces"]
    assert enis and all(e["Attachment"]["Status"] == "attached" for e in enis)
    assert ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [gid]}])["SecurityGroups"]


def test_a_cluster_this_process_did_not_prepare_has_its_groups_found_by_tag(infra):
    """``spotwise down`` in another process: the cluster's group is listed by its tag (and then
    deleted), as before."""
    cloud = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    _up(cloud)
    gid = cloud._groups[("c-r", REGION)]
    cloud.terminate(cloud.list_nodes("c-r", regions=[REGION]))
    other = AwsCloud(image_id=_ami(), sleep=lambda s: None)
    assert f"aws security group {gid} ({REGION})" in other.cleanup_cluster("c-r")
    assert _reads()["DescribeSecurityGroups"] == 1
