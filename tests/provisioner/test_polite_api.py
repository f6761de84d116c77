"""What a real account tolerates (issue 30), against emulators as strict as the clouds: EC2 (moto with
:mod:`emulator.ec2_strict`: eventual consistency after a create, ``AuthFailure`` from disabled opt-in
regions, every ``Describe*`` counted) and the GCP / Azure wire fakes (list calls counted, 429 with
``Retry-After`` past their rate limits).

The run-level figure — list/describe calls per minute per cloud over several minutes of a run with
no region configured — drives the orchestrator's node part (:meth:`Fleet.poll`, what every tick
calls) on a simulated clock at the monitor's 4 ticks a second, against the real clouds' code."""

from __future__ import annotations

import time

import pytest
from emulator import ec2_strict
from helpers import offer
from moto import mock_aws

from spotwise.engine.run.fleet import Fleet
from spotwise.engine.run.journal import Journal, JobRow
from spotwise.engine.state.ledger import Ledger
from spotwise.engine.run.market_watch import MarketWatch
from spotwise.engine.state.spot_log import SpotLog
from spotwise.provisioner import reconcile
from spotwise.provisioner.clouds.aws.cloud import AwsCloud
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.failover import Failover
from spotwise.taskspec import parse_taskspec

MINUTES = 5
TICK_S = 0.25
CEILING_PER_MIN = 12


@pytest.fixture
def strict_aws(aws_env, monkeypatch):
    """In-process moto as strict as a real account, **no region configured** (a new user)."""
    monkeypatch.delenv("SPOTWISE_AWS_REGIONS", raising=False)
    monkeypatch.setenv("SW_EMU_EC2_STRICT", "1")
    ec2_strict.install()
    ec2_strict.reset()
    with mock_aws():
        yield
    ec2_strict.reset()


def _aws() -> AwsCloud:
    import boto3

    ami = boto3.client("ec2", region_name="us-east-1").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2_strict.reset()
    return AwsCloud(image_id=ami, sleep=lambda s: None)


def _fleet(name: str, cloud, offers, job: str) -> Fleet:
    JobRow(job_id=job, spec=parse_taskspec({"name": "p", "training": {"steps": 1}}), clouds=[name],
           cluster_id=f"c-{name}", budget_usd=None).record("running")
    return Fleet(cluster_id=f"c-{name}", job_id=job, workers=2, offers=offers, default_site=f"{name}/x",
                 cloud=lambda n: cloud, failover=lambda clouds: Failover(cloud_factory=clouds), bills=Ledger(job),
                 journal=Journal(job), watch=MarketWatch(offers={o.key: o for o in offers}, log=SpotLog(job, 5.0)),
                 join_timeout_s=600.0)


def _run(fleet: Fleet, minutes: float) -> list:
    """``minutes`` of a run's ticks on a simulated clock; the nodes the fleet took for lost."""
    lost: list = []
    t0 = time.time()
    for i in range(int(minutes * 60 / TICK_S)):
        fleet.poll(t0 + i * TICK_S, lost.append)
    return lost


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
def test_a_run_reads_each_cloud_at_most_12_times_a_minute_with_no_region_configured(
        database, strict_aws, gcp_fake, gcp_cloud, azure_fake, azure_cloud):
    runs = {
        "aws": (_aws(), [offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=12.5)]),
        "gcp": (gcp_cloud, [offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a", usd=3.0)]),
        "azure": (azure_cloud, [offer("azure", "Standard_NC24ads_A100_v4", "eastus", usd=1.5)]),
    }
    reads = {"aws": lambda: len(ec2_strict.calls("Describe")),
             "gcp": lambda: sum(r["method"] == "GET" for r in gcp_fake.requests),
             "azure": lambda: sum(r["method"] == "GET" for r in azure_fake.requests)}
    per_min = {}
    for name, (cloud, offers) in runs.items():
        fleet = _fleet(name, cloud, offers, f"job-{name}")
        fleet.provision()                                        # launch reads count too
        assert len(fleet.nodes) == 3
        lost = _run(fleet, MINUTES)
        fleet.teardown()
        per_min[name] = reads[name]() / MINUTES
        assert lost == []                                        # nothing taken for lost along the way
    print("list/describe calls per minute over", MINUTES, "minutes:", per_min)
    assert all(v <= CEILING_PER_MIN for v in per_min.values()), per_min
    # the run read only its own region: never an opt-in region it cannot use
    assert {region for _, _, region in ec2_strict.calls()} == {"us-east-1"}
    assert gcp_fake.throttled == 0 and azure_fake.throttled == 0


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
def test_before_issue_30_a_one_second_poll_read_each_cloud_60_times_a_minute(database, strict_aws):
    """The old cadence, measured the same way (the figure the docs quote)."""
    cloud = _aws()
    fleet = _fleet("aws", cloud, [offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a")], "job-old")
    fleet.node_poll("aws").period_s = 1.0
    fleet.provision()
    before = len(ec2_strict.calls("Describe"))
    _run(fleet, 1)
    assert len(ec2_strict.calls("Describe")) - before == 60
    fleet.teardown()


# -- eventual consistency ------------------------------------------------------------------------------
def test_not_found_right_after_a_create_is_retried_and_orphans_nothing(strict_aws):
    import boto3

    cloud = _aws()
    slept: list[float] = []
    cloud._sleep = slept.append
    cloud.prepare_cluster("c-ec", "job-ec", "us-east-1")         # ingress after the group: NotFound once
    nodes = cloud.launch(LaunchRequest(cluster_id="c-ec", job_id="job-ec", count=2,
                                       offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=12.5)))
    assert len(nodes) == 2 and all(n.usd_per_hour > 0 for n in nodes)
    assert len(slept) == 1 + 1 + 2 and max(slept) <= 8                # ingress, describe, one tag per node
    ec2 = boto3.client("ec2", region_name="us-east-1")
    tags = {i["InstanceId"]: {t["Key"] for t in i["Tags"]}
            for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert set(tags) == {n.instance_id for n in nodes} and all("spotwise-usd-per-hour" in t for t in tags.values())
    rules = cloud.security_group_rules("c-ec", "us-east-1")
    assert {p.get("FromPort") for p in rules} >= {cloud.dashboard_port, cloud.control_port}


def test_instances_ec2_never_describes_are_ended_before_the_launch_fails(strict_aws, monkeypatch):
    """Past the bounded wait the launch fails, but what CreateFleet started is not left billing."""
    import boto3

    from spotwise.provisioner.clouds.aws import network as aws_network
    from spotwise.provisioner.base import ProvisionError

    cloud = _aws()
    monkeypatch.setattr(aws_network, "CONSISTENCY_WAIT_S", 0.0)    # no patience: the first NotFound is final
    with pytest.raises(ProvisionError) as e:
        cloud.launch(LaunchRequest(cluster_id="c-x", job_id="job-x", count=1,
                                   offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a")))
    assert e.value.code == "InvalidInstanceID.NotFound"
    ec2 = boto3.client("ec2", region_name="us-east-1")
    states = [i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert states and all(s in ("shutting-down", "terminated") for s in states)


# -- opt-in regions --------------------------------------------------------------------------------------
def test_gc_and_down_skip_opt_in_regions_the_account_has_not_enabled(strict_aws):
    cloud = _aws()
    nodes = cloud.launch(LaunchRequest(cluster_id="c-opt", job_id="job-opt", count=1, role="head",
                                       offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a")))
    regions = cloud.scan_regions()
    assert "us-east-1" in regions and not {"ap-southeast-3", "me-central-1"} & set(regions)
    assert cloud.skipped_regions == {r: "not enabled for this account (opt-in region)"
                                     for r in ("ap-southeast-3", "me-central-1")}
    sweep = reconcile.gc(clouds=["aws"], everything=True, dry_run=True, cloud_factory=lambda n: cloud)
    assert [n.instance_id for n in sweep.ended] == [nodes[0].instance_id]
    assert set(sweep.skipped) == {"aws/ap-southeast-3", "aws/me-central-1"}     # said, not silently empty
    sweep = reconcile.down("c-opt", clouds=["aws"], cloud_factory=lambda n: cloud)
    assert [n.instance_id for n in sweep.ended] == [nodes[0].instance_id] and "aws" not in sweep.skipped


def test_a_region_that_fails_is_skipped_and_named_but_an_account_that_fails_everywhere_is_an_error(
        strict_aws, monkeypatch):
    from spotwise.provisioner.base import AuthError

    monkeypatch.setenv("SPOTWISE_AWS_REGIONS", "us-east-1,me-central-1")    # configured, one not enabled
    cloud = _aws()
    assert cloud.list_nodes() == [] and set(cloud.skipped_regions) == {"me-central-1"}
    assert "AuthFailure" in cloud.skipped_regions["me-central-1"]
    with pytest.raises(AuthError):                                             # a run's own region: raised
        cloud.list_nodes("c1", regions=["me-central-1"])
    monkeypatch.setenv("SPOTWISE_AWS_REGIONS", "me-central-1")
    with pytest.raises(AuthError):
        _aws().list_nodes()
    monkeypatch.setenv("SW_EMU_OPT_IN_ENABLED", "me-central-1")              # the account enabled it
    assert _aws().list_nodes() == []


# -- 429 Retry-After ---------------------------------------------------------------------------------------
class Clock:
    """The fake's clock, advanced by the cloud's (injected) sleep: waiting costs no wall time."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


@pytest.mark.parametrize("which", ["gcp", "azure"])
def test_listing_faster_than_the_limit_gets_429_and_the_retry_waits_what_retry_after_says(
        which, gcp_fake, gcp_cloud, azure_fake, azure_cloud):
    fake, cloud = (gcp_fake, gcp_cloud) if which == "gcp" else (azure_fake, azure_cloud)
    clock = Clock()
    fake.clock, fake.list_limit_per_min = clock, 2
    cloud._sleep = clock.sleep
    for _ in range(2):
        assert cloud.list_nodes("c1") == []
    clock.t += 20                                                # the window frees 40 s from now
    assert cloud.list_nodes("c1") == []                          # throttled once, then answered
    assert fake.throttled >= 1
    assert clock.slept and clock.slept[0] >= 40                  # waited what the 429 asked, not a jittered 0.5 s
    assert len(fake.list_calls()) == 3 + fake.throttled


def test_the_listing_lag_a_run_allows_ec2_outlasts_the_consistency_wait_of_a_launch():
    """A run's grace for an unlisted new EC2 node is at least what a launch waits for EC2 to see it."""
    from spotwise.provisioner.clouds.aws.network import CONSISTENCY_WAIT_S

    assert AwsCloud.listing_lag_s >= CONSISTENCY_WAIT_S


# -- regions whose network is not configured ----------------------------------------------------------------
def test_a_region_without_configured_subnets_is_skipped_with_its_reason_and_the_launch_lands_on_the_next(
        strict_aws, monkeypatch):
    """SPOTWISE_AWS_SUBNETS names us-east-1's subnets only; the plan's cheapest site is us-west-2."""
    import boto3

    east = [s["SubnetId"] for s in boto3.client("ec2", region_name="us-east-1").describe_subnets()["Subnets"]]
    monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", ",".join(east))
    cloud = _aws()
    west = offer("aws", "p4d.24xlarge", "us-west-2", "us-west-2a", usd=9.0)
    east_offer = offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=12.5)
    attempts: list = []
    cluster = Failover(cloud_factory=lambda n: cloud).provision(
        [west, east_offer], cluster_id="c-net", job_id="job-net", nodes=1, dedicated_head=True,
        attempts=attempts, prepare=lambda c, r: cloud.prepare_cluster("c-net", "job-net", r))
    assert {n.region for n in cluster.nodes} == {"us-east-1"}
    [skip] = [a for a in attempts if a.offer_key == west.key]
    assert skip.outcome == "unusable" and "SPOTWISE_AWS_SUBNETS" in skip.message and "us-west-2" in skip.message
    cloud.terminate(cluster.nodes)
