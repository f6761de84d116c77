"""AWS provisioner against moto (in-process), through the real boto3 client.

moto fills a fleet from its first override only and has no allocation strategies, so the tests
assert the REQUEST spotwise sends (recorded with botocore event hooks) as well as what comes
back. Capacity/quota/auth/throttling errors are injected with ``before-call`` /
``after-call`` hooks, the way EC2 reports them (fleet ``Errors`` list or a raised error code).
"""

from __future__ import annotations

import base64
import functools
import copy
from types import SimpleNamespace

import boto3
import pytest

from helpers import offer
from spotwise.errors import InputError
from spotwise.provisioner.base import SiteError
from spotwise.provisioner.clouds.aws.cloud import AwsCloud
from spotwise.provisioner.base import (TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE, AuthError,
                                       CapacityError, LaunchRequest, QuotaError)

REGION = "us-east-1"


@functools.cache
def _image() -> str:
    return boto3.client("ec2", region_name=REGION).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


def _cloud(**kw) -> tuple[AwsCloud, list[float]]:
    slept: list[float] = []
    return AwsCloud(image_id=_image(), sleep=slept.append, **kw), slept


def _record(cloud: AwsCloud, op: str) -> list[dict]:
    """Record the API-level parameters of every ``op`` call the cloud's client makes."""
    calls: list[dict] = []

    def hook(params, **_):
        calls.append(copy.deepcopy(params))

    cloud.client(REGION).meta.events.register(f"provide-client-params.ec2.{op}", hook)
    return calls


def _inject(cloud: AwsCloud, op: str, responses: list[tuple[int, dict]]) -> None:
    """Answer the next calls of ``op`` with canned (status, body) responses, then pass through."""
    queue = list(responses)

    def hook(**_):
        if queue:
            status, body = queue.pop(0)
            return SimpleNamespace(status_code=status, headers={}), body
        return None

    cloud.client(REGION).meta.events.register(f"before-call.ec2.{op}", hook)


def _running(cluster_id: str | None = None) -> list[dict]:
    ec2 = boto3.client("ec2", region_name=REGION)
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    if cluster_id:
        filters.append({"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]})
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def _templates() -> list[dict]:
    return boto3.client("ec2", region_name=REGION).describe_launch_templates()["LaunchTemplates"]


def _req(*offers_, count=2, role="head", **kw) -> LaunchRequest:
    return LaunchRequest(cluster_id="c-aws1", job_id="job-1", offer=offers_[0], alternatives=tuple(offers_[1:]),
                         count=count, role=role, **kw)


def test_spot_fleet_request_and_result(mocked_aws):
    cloud, _ = _cloud()
    fleets, templates = _record(cloud, "CreateFleet"), _record(cloud, "CreateLaunchTemplate")
    a = offer("aws", "p4d.24xlarge", REGION, "use1-az6", usd=12.5)   # AZ id, as in the catalog
    b = offer("aws", "p5.48xlarge", REGION, "us-east-1b", usd=30.0)  # AZ name
    nodes = cloud.launch(_req(a, b, count=2))

    # what we asked for
    (req,) = fleets
    assert req["Type"] == "instant"
    assert req["SpotOptions"]["AllocationStrategy"] == "price-capacity-optimized"
    assert req["TargetCapacitySpecification"] == {"TotalTargetCapacity": 2, "DefaultTargetCapacityType": "spot"}
    ov = req["LaunchTemplateConfigs"][0]["Overrides"]
    assert [(o["InstanceType"], o["Priority"]) for o in ov] == [("p4d.24xlarge", 0.0), ("p5.48xlarge", 1.0)]
    subnets = boto3.client("ec2", region_name=REGION).describe_subnets(SubnetIds=[o["SubnetId"] for o in ov])["Subnets"]
    assert sorted(s["AvailabilityZone"] for s in subnets) == ["us-east-1a", "us-east-1b"]
    fleet_tags = {t["Key"]: t["Value"] for t in req["TagSpecifications"][0]["Tags"]}
    assert fleet_tags[TAG_CLUSTER] == "c-aws1" and fleet_tags[TAG_JOB] == "job-1"
    (lt,) = templates
    data = lt["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert {t["Key"] for t in lt["TagSpecifications"][0]["Tags"]} >= {TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE}
    assert {ts["ResourceType"] for ts in data["TagSpecifications"]} == {"instance", "volume"}
    script = base64.b64decode(data["UserData"]).decode()
    assert "ray.scripts.scripts start --head" in script and "spotwise.runtime.node.watch --cloud aws" in script
    assert req["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"]["LaunchTemplateId"] == \
        lt.get("LaunchTemplateId", req["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"]["LaunchTemplateId"])

    # what came back
    assert len(nodes) == 2
    assert all(n.cluster_id == "c-aws1" and n.market == "spot" and n.address for n in nodes)
    # spot nodes are billed at the zone's spot price EC2 quotes at launch (moto's is a dummy), with its source
    assert all(n.extra["price_source"].startswith("aws DescribeSpotPriceHistory") for n in nodes)
    assert all(n.usd_per_hour == 0.00001 for n in nodes)
    running = _running("c-aws1")
    assert len(running) == 2
    tags = {t["Key"]: t["Value"] for t in running[0]["Tags"]}
    assert tags[TAG_JOB] == "job-1" and tags[TAG_ROLE] == "head" and tags[TAG_MARKET] == "spot"
    assert _templates() == []  # the instant fleet's template is cleaned up at once
    assert sorted(n.instance_id for n in cloud.list_nodes("c-aws1")) == sorted(n.instance_id for n in nodes)

    cloud.terminate(nodes)
    cloud.terminate(nodes)  # idempotent
    assert _running() == []


def test_on_demand_and_strategy_options(mocked_aws):
    cloud, _ = _cloud(on_demand_strategy="prioritized")
    fleets = _record(cloud, "CreateFleet")
    a = offer("aws", "p4d.24xlarge", REGION, market="on-demand")
    b = offer("aws", "p5.48xlarge", REGION, market="on-demand")
    nodes = cloud.launch(_req(a, b, count=1))
    assert fleets[0]["OnDemandOptions"] == {"AllocationStrategy": "prioritized"}
    assert fleets[0]["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand"
    assert "SpotOptions" not in fleets[0]
    # no zone in the offer: every default subnet of the region is an override
    assert len(fleets[0]["LaunchTemplateConfigs"][0]["Overrides"]) == 2 * 6
    assert nodes[0].market == "on-demand"
    cloud.terminate(nodes)

    cheap, _ = _cloud(spot_strategy="lowest-price")
    fleets2 = _record(cheap, "CreateFleet")
    nodes = cheap.launch(_req(offer("aws", "p4d.24xlarge", REGION, "us-east-1a"), count=1, max_price=20.0))
    assert fleets2[0]["SpotOptions"] == {"AllocationStrategy": "lowest-price"}
    assert fleets2[0]["LaunchTemplateConfigs"][0]["Overrides"][0]["MaxPrice"] == "20.0000"
    cheap.terminate(nodes)
    assert _running() == []


def _fleet_errors(code: str, n: int = 1) -> dict:
    return {"FleetId": "fleet-x", "Instances": [], "Errors": [
        {"ErrorCode": code, "ErrorMessage": "whatever text AWS sends", "Lifecycle": "spot",
         "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "p4d.24xlarge"}}}] * n}


@pytest.mark.parametrize("code,exc", [("InsufficientInstanceCapacity", CapacityError),
                                      ("UnfulfillableCapacity", CapacityError),
                                      ("MaxSpotInstanceCountExceeded", QuotaError),
                                      ("VcpuLimitExceeded", QuotaError)])
def test_fleet_errors_map_by_code(mocked_aws, code, exc):
    cloud, _ = _cloud()
    _inject(cloud, "CreateFleet", [(200, _fleet_errors(code, 2))])
    with pytest.raises(exc) as ei:
        cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION)))
    assert ei.value.code == code and ei.value.cloud == "aws"
    assert _running() == [] and _templates() == []


@pytest.mark.parametrize("code,exc", [("UnauthorizedOperation", AuthError), ("AuthFailure", AuthError),
                                      ("VcpuLimitExceeded", QuotaError),
                                      ("InsufficientInstanceCapacity", CapacityError)])
def test_raised_client_errors_map_by_code(mocked_aws, code, exc):
    cloud, _ = _cloud()
    _inject(cloud, "CreateFleet", [(400, {"Error": {"Code": code, "Message": "text we never parse"}})])
    with pytest.raises(exc):
        cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION)))
    assert _running() == [] and _templates() == []


def test_partial_fleet_returns_what_came_up(mocked_aws):
    cloud, _ = _cloud()

    def only_one(params, **_):  # EC2 placed one instance and reports the rest as errors
        params["TargetCapacitySpecification"]["TotalTargetCapacity"] = 1

    def add_errors(parsed, **_):
        parsed.setdefault("Errors", []).append({"ErrorCode": "InsufficientInstanceCapacity",
                                                "ErrorMessage": "x", "Lifecycle": "spot"})

    ev = cloud.client(REGION).meta.events
    ev.register("provide-client-params.ec2.CreateFleet", only_one)
    ev.register("after-call.ec2.CreateFleet", add_errors)
    nodes = cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION), count=3))
    assert len(nodes) == 1 and nodes[0].extra["fleet_errors"] == ["InsufficientInstanceCapacity"]
    cloud.terminate(nodes)
    assert _running() == []


def test_throttling_is_retried_with_backoff(mocked_aws):
    cloud, slept = _cloud()
    throttle = (503, {"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}})
    _inject(cloud, "CreateFleet", [throttle, throttle])
    nodes = cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION), count=1))
    assert len(nodes) == 1 and len(slept) == 2
    cloud.terminate(nodes)

    stubborn, _ = _cloud(attempts=3)
    _inject(stubborn, "CreateFleet", [throttle] * 3)
    with pytest.raises(Exception) as ei:
        stubborn.launch(_req(offer("aws", "p4d.24xlarge", REGION), count=1))
    assert ei.value.code == "RequestLimitExceeded"
    assert _running() == [] and _templates() == []


def test_bad_input_fails_before_any_call(mocked_aws):
    cloud, _ = _cloud()
    calls = _record(cloud, "CreateLaunchTemplate")
    with pytest.raises(InputError) as ei:
        cloud.launch(_req(offer("aws", "p9.huge", REGION)))
    assert "instance_type" in str(ei.value) and "p5.48xlarge" in str(ei.value)
    with pytest.raises(InputError) as ei:  # p4de is sold in two regions only
        cloud.launch(_req(offer("aws", "p4de.24xlarge", "sa-east-1")))
    assert "region" in str(ei.value) and "sa-east-1" in str(ei.value)
    with pytest.raises(InputError):
        cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION), offer("aws", "p4d.24xlarge", "us-west-2")))
    with pytest.raises(SiteError) as es:    # a zone with no subnet: that site is skipped, not the walk ended
        cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION, zone="us-east-1z")))
    assert es.value.problem.field == "offer.zone" and "us-east-1z" in str(es.value)
    assert calls == [] and _running() == []


def test_missing_credentials_is_auth_error(aws_env, monkeypatch, tmp_path):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    cloud = AwsCloud(image_id="ami-12345678")
    with pytest.raises(AuthError) as ei:
        cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION)))
    assert "credentials" in str(ei.value)


def test_missing_image_is_a_clear_error(mocked_aws):
    cloud = AwsCloud()
    with pytest.raises(SiteError) as ei:     # no image in this region: the failover skips it, naming the setting
        cloud.launch(_req(offer("aws", "p4d.24xlarge", REGION)))
    assert ei.value.problem.field == "SPOTWISE_AWS_AMI" and REGION in str(ei.value)
    assert _running() == [] and _templates() == []


def test_a_cluster_gets_one_security_group_per_region_it_reaches(mocked_aws):
    """A run that moves between regions prepares each region it reaches; a node launched in a
    region carries that region's group (a group id never crosses regions), and cleanup deletes all."""
    cloud, _ = _cloud(regions=[REGION, "us-west-2"])
    for region in (REGION, "us-west-2"):
        cloud.prepare_cluster("c-aws1", "job-1", region)
    cloud.prepare_cluster("c-aws1", "job-1", REGION)          # once per region
    groups = {r: g for r, g, _ in cloud.list_security_groups("c-aws1")}
    assert set(groups) == {REGION, "us-west-2"} and len(set(groups.values())) == 2
    calls: list[dict] = []

    def hook(params, **_):
        calls.append(copy.deepcopy(params))

    for region in (REGION, "us-west-2"):
        cloud.client(region).meta.events.register("provide-client-params.ec2.CreateLaunchTemplate", hook)
        o = offer("aws", "p4d.24xlarge", region, None, usd=10.0)
        cloud.launch(_req(o, count=1))
    # a head's groups ride on its interface (it asks for a public address: the ssh head path)
    assert [c["LaunchTemplateData"].get("SecurityGroupIds") or c["LaunchTemplateData"]["NetworkInterfaces"][0]["Groups"]
            for c in calls] == [[groups[REGION]], [groups["us-west-2"]]]
    # the node's dead man's switch shuts it down from inside: that must terminate it (end the bill)
    assert all(c["LaunchTemplateData"]["InstanceInitiatedShutdownBehavior"] == "terminate" for c in calls)
    cloud.terminate(cloud.list_nodes("c-aws1"))
    cloud.cleanup_cluster("c-aws1")
    assert cloud.list_security_groups("c-aws1") == []


def _publish_public_parameter(name: str, value: str, region: str = REGION) -> None:
    """What Amazon does for its public parameters (moto ships only some): a name under /aws/service."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters[name].append(Parameter(
        account_id=DEFAULT_ACCOUNT_ID, name=name, value=value, parameter_type="String", description=None,
        allowed_pattern=None, keyid=None, last_modified_date=1.0, version=1, data_type="aws:ec2:image"))


def test_the_image_is_the_deep_learning_ami_amazon_publishes_in_ssm(mocked_aws, monkeypatch):
    """No SPOTWISE_AWS_AMI: the image is what Amazon's SSM parameter for the DLAMI names in the
    launch's region (never an AMI found by a name pattern, which anyone can publish); a region
    without the parameter is a site error naming the setting that fixes it."""
    from spotwise.provisioner.clouds.aws.cloud import DLAMI_PARAMETER

    monkeypatch.delenv("SPOTWISE_AWS_AMI", raising=False)
    cloud = AwsCloud(sleep=lambda s: None)
    with pytest.raises(SiteError, match="SPOTWISE_AWS_AMI.*no /aws/service/deeplearning"):
        cloud._image(REGION)
    _publish_public_parameter(DLAMI_PARAMETER, _image())
    assert cloud._image(REGION) == _image()
    [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                        offer=offer("aws", "p4d.24xlarge", REGION, "us-east-1a", usd=9.0)))
    inst = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[node.instance_id])
    assert inst["Reservations"][0]["Instances"][0]["ImageId"] == _image()


def _image_with_root(device: str) -> str:
    images = boto3.client("ec2", region_name=REGION).describe_images(Owners=["amazon"])["Images"]
    return next(i["ImageId"] for i in images if i.get("RootDeviceName") == device)


@pytest.mark.parametrize("device", ["/dev/xvda", "/dev/sda1"])
def test_the_root_volume_is_mapped_at_the_images_own_root_device(mocked_aws, device):
    """EC2 sizes the root volume only through a mapping at the image's RootDeviceName; a mapping at
    any other name is attached as a second, empty volume (billed, never used) while the root keeps
    the image's size (EC2 user guide, "Block device mappings": "the root device volume ... the
    device name of the root volume is specified in the AMI"). Failed before the fix on an image
    whose root is /dev/xvda: the template mapped /dev/sda1."""
    image = _image_with_root(device)
    cloud = AwsCloud(image_id=image, sleep=lambda s: None)
    templates = _record(cloud, "CreateLaunchTemplate")
    [node] = cloud.launch(LaunchRequest(cluster_id="c-root", job_id="j1", role="worker",
                                        offer=offer("aws", "p4d.24xlarge", REGION, "us-east-1a", usd=9.0)))
    (lt,) = templates
    (mapping,) = lt["LaunchTemplateData"]["BlockDeviceMappings"]
    assert mapping["DeviceName"] == device
    assert mapping["Ebs"]["VolumeSize"] == cloud.root_volume_gib and mapping["Ebs"]["DeleteOnTermination"]
    cloud.terminate([node])


def test_an_image_the_region_does_not_have_is_a_site_error_naming_the_setting(mocked_aws):
    cloud = AwsCloud(image_id="ami-0000000000000dead", sleep=lambda s: None)
    with pytest.raises(SiteError) as ei:
        cloud.launch(LaunchRequest(cluster_id="c-noimg", job_id="j1", role="worker",
                                   offer=offer("aws", "p4d.24xlarge", REGION, "us-east-1a", usd=9.0)))
    assert ei.value.problem.field == "SPOTWISE_AWS_AMI" and "ami-0000000000000dead" in str(ei.value)
    assert _running("c-noimg") == []


def test_a_head_over_ssh_gets_a_public_address_port_22_from_the_launcher_only_and_the_clusters_key(
        mocked_aws, monkeypatch, tmp_path):
    """The default head path (ssh): the head's interface asks for a public address, its security
    group opens port 22 to the launcher's address only, its user data authorizes the cluster's key;
    a worker gets neither; the cluster's end deletes the key. A launcher inside the VPC
    (``SPOTWISE_HEAD_PATH=private``) gets none of it."""
    from spotwise.provisioner import head_path as hp

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "198.51.100.4")
    cloud, _ = _cloud()
    templates = _record(cloud, "CreateLaunchTemplate")
    cloud.prepare_cluster("c-aws1", "job-1", REGION)
    gid = cloud._groups[("c-aws1", REGION)]
    ssh_rules = [r for r in cloud.security_group_rules("c-aws1", REGION) if r.get("FromPort") == 22]
    assert [(r["ToPort"], [c["CidrIp"] for c in r["IpRanges"]]) for r in ssh_rules] == [(22, ["198.51.100.4/32"])]
    o = offer("aws", "m6i.large", REGION, None, usd=0.1, market="on-demand")
    (head,) = cloud.launch(_req(o, count=1, role="head"))
    (worker,) = cloud.launch(_req(o, count=1, role="worker", head_address=f"{head.address}:6379"))
    head_lt, worker_lt = (t["LaunchTemplateData"] for t in templates)
    assert head_lt["NetworkInterfaces"] == [{"DeviceIndex": 0, "AssociatePublicIpAddress": True, "Groups": [gid]}]
    assert "SecurityGroupIds" not in head_lt
    assert hp.authorized_key_line("c-aws1") in base64.b64decode(head_lt["UserData"]).decode()
    assert worker_lt["SecurityGroupIds"] == [gid] and "NetworkInterfaces" not in worker_lt
    assert "AUTH_KEYS" not in base64.b64decode(worker_lt["UserData"]).decode()
    # (moto gives a fleet's instance no public address for its template's interface, so what EC2
    # answers is not checked here: Node.extra["public_address"] is read from PublicIpAddress)
    assert hp.key_path("c-aws1").exists()
    cloud.terminate([head, worker])
    cloud.cleanup_cluster("c-aws1")
    assert not hp.key_path("c-aws1").exists()

    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    cloud, _ = _cloud()
    templates = _record(cloud, "CreateLaunchTemplate")
    cloud.prepare_cluster("c-aws2", "job-2", REGION)
    assert not [r for r in cloud.security_group_rules("c-aws2", REGION) if r.get("FromPort") == 22]
    (head,) = cloud.launch(LaunchRequest(cluster_id="c-aws2", job_id="job-2", offer=o, role="head"))
    (lt,) = (t["LaunchTemplateData"] for t in templates)
    assert "NetworkInterfaces" not in lt and "AUTH_KEYS" not in base64.b64decode(lt["UserData"]).decode()
    assert not hp.key_path("c-aws2").exists()
    cloud.terminate([head])
    cloud.cleanup_cluster("c-aws2")


def test_a_head_over_ssh_launches_into_the_public_head_subnets(mocked_aws, monkeypatch, tmp_path):
    """With node subnets configured (infra/aws's, behind NAT), a head reached over ssh goes into
    ``SPOTWISE_AWS_HEAD_SUBNETS`` (public), a worker into the node subnets."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    nodes_sub = ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.200.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    heads_sub = ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.240.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", nodes_sub["SubnetId"])
    monkeypatch.setenv("SPOTWISE_AWS_HEAD_SUBNETS", heads_sub["SubnetId"])
    cloud, _ = _cloud()
    fleets = _record(cloud, "CreateFleet")
    o = offer("aws", "m6i.large", REGION, "us-east-1a", usd=0.1, market="on-demand")
    (head,) = cloud.launch(_req(o, count=1, role="head"))
    cloud.launch(_req(o, count=1, role="worker", head_address=f"{head.address}:6379"))
    assert [f["LaunchTemplateConfigs"][0]["Overrides"][0]["SubnetId"] for f in fleets] == \
        [heads_sub["SubnetId"], nodes_sub["SubnetId"]]
    cloud.terminate(cloud.list_nodes("c-aws1"))


def test_a_runs_launches_read_the_regions_subnets_once(mocked_aws):
    """Every launch of a run (the head, the workers, each replacement) and the security group's VPC
    lookup launch into the same subnets: DescribeSubnets once per region per cloud object, not once
    per launch (issue 51: a short run's reads, launch included, within 12 a minute). Failed before:
    three launches read them three times."""
    cloud, _ = _cloud()
    reads = _record(cloud, "DescribeSubnets")
    a = offer("aws", "p4d.24xlarge", REGION, "us-east-1a", usd=12.5)
    for role in ("head", "worker", "worker"):
        assert cloud.launch(_req(a, count=1, role=role))
    assert len(reads) == 1, reads
