"""Failover: pure-logic rules with a recording in-memory cloud, then a real walk AWS -> GCP -> Azure
through moto and the local GCP/Azure fakes."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import pytest

from helpers import offer
from spotwise.errors import InputError
from spotwise.provisioner.base import (AuthError, CapacityError, Cloud, LaunchRequest, Node, QuotaError)
from spotwise.provisioner.failover import Failover, ProvisioningFailed, UnavailableCache


class ScriptedCloud(Cloud):
    """A Cloud whose launch outcomes are scripted per offer key; records every request."""

    def __init__(self, name: str, script: dict[str, list]) -> None:
        self.name = name
        self.script = script
        self.requests: list[LaunchRequest] = []
        self.live: dict[str, Node] = {}
        self._n = 0

    def launch(self, request: LaunchRequest) -> list[Node]:
        self.requests.append(request)
        outcome = (self.script.get(request.offer.key) or ["ok"]).pop(0) if self.script.get(request.offer.key) else "ok"
        if isinstance(outcome, Exception):
            raise outcome
        n = request.count if outcome == "ok" else min(int(outcome), request.count)
        out = []
        for _ in range(n):
            self._n += 1
            node = Node(cloud=self.name, instance_id=f"{self.name}-{self._n}", instance_type=request.offer.instance_type,
                        region=request.offer.region, zone=request.offer.zone, market=request.offer.market.value,
                        usd_per_hour=request.offer.usd_per_hour, cluster_id=request.cluster_id,
                        job_id=request.job_id, role=request.role, address=f"10.0.0.{self._n}")
            self.live[node.instance_id] = node
            out.append(node)
        return out

    def terminate(self, nodes):
        for n in nodes:
            self.live.pop(n.instance_id, None)

    def list_nodes(self, cluster_id=None, *, regions=None):
        return [n for n in self.live.values() if cluster_id in (None, n.cluster_id)]


def _fo(clouds: dict[str, ScriptedCloud], now: list[float]) -> Failover:
    return Failover(cloud_factory=lambda name: clouds[name],
                    cache=UnavailableCache(ttl_s=180, clock=lambda: now[0]))


A1 = offer("aws", "p4d.24xlarge", "us-east-1", "use1-az1", usd=10)
A2 = offer("aws", "p4d.24xlarge", "us-east-1", "use1-az2", usd=11)
A3 = offer("aws", "p4d.24xlarge", "us-west-2", "usw2-az1", usd=12)
G1 = offer("gcp", "a2-highgpu-8g", "us-central1", "us-central1-a", usd=13)


def test_capacity_marks_offer_for_ttl_and_moves_on():
    now = [0.0]
    aws = ScriptedCloud("aws", {A1.key: [CapacityError("no capacity", code="InsufficientInstanceCapacity")]})
    fo = _fo({"aws": aws}, now)
    c = fo.provision([A1, A2], cluster_id="c1", job_id="j1", nodes=2)
    assert [n.role for n in c.nodes] == ["head", "worker"]
    assert {n.zone for n in c.nodes} == {"use1-az2"}
    assert c.nodes[1].instance_id and aws.requests[-1].head_address == f"{c.nodes[0].address}:6379"
    assert [a.outcome for a in c.attempts] == ["capacity", "launched", "launched"]
    # within the TTL the failed offer is not asked again ...
    now[0] = 179
    c2 = fo.provision([A1, A2], cluster_id="c2", job_id="j2", nodes=1)
    assert c2.attempts[0].outcome == "cached" and c2.nodes[0].zone == "use1-az2"
    # ... after it, it is
    now[0] = 181
    c3 = fo.provision([A1, A2], cluster_id="c3", job_id="j3", nodes=1)
    assert c3.nodes[0].zone == "use1-az1"


def test_quota_skips_region_and_auth_skips_cloud():
    now = [0.0]
    aws = ScriptedCloud("aws", {A1.key: [QuotaError("vCPU limit", code="VcpuLimitExceeded")]})
    gcp = ScriptedCloud("gcp", {G1.key: [AuthError("no credentials")]})
    fo = _fo({"aws": aws, "gcp": gcp}, now)
    c = fo.provision([A1, A2, G1, A3], cluster_id="c", job_id="j", nodes=1)
    assert c.nodes[0].region == "us-west-2"
    assert [a.outcome for a in c.attempts] == ["quota", "skipped", "auth", "launched"]
    assert "us-east-1 skipped" in c.attempts[1].message
    assert [r.offer.key for r in aws.requests] == [A1.key, A3.key]


def test_partial_is_topped_up_within_the_site():
    now = [0.0]
    aws = ScriptedCloud("aws", {A1.key: ["ok", "1"]})  # head ok, then only 1 of 3 workers
    fo = _fo({"aws": aws}, now)
    c = fo.provision([A1, A2], cluster_id="c", job_id="j", nodes=4)
    assert len(c.nodes) == 4 and [a.outcome for a in c.attempts] == ["launched", "partial", "launched"]
    assert aws.requests[-1].count == 2 and aws.requests[-1].offer.key == A2.key


def test_partial_site_is_released_before_the_next_site():
    now = [0.0]
    aws = ScriptedCloud("aws", {A1.key: ["ok", CapacityError("x")]})
    gcp = ScriptedCloud("gcp", {})
    fo = _fo({"aws": aws, "gcp": gcp}, now)
    c = fo.provision([A1, G1], cluster_id="c", job_id="j", nodes=2)
    assert {n.cloud for n in c.nodes} == {"gcp"}
    assert aws.live == {}  # the lone head was not left up
    assert "released" in [a.outcome for a in c.attempts]


def test_nothing_fits_releases_everything_and_explains():
    now = [0.0]
    aws = ScriptedCloud("aws", {A1.key: ["ok", CapacityError("x", code="InsufficientInstanceCapacity")]})
    fo = _fo({"aws": aws}, now)
    with pytest.raises(ProvisioningFailed) as ei:
        fo.provision([A1], cluster_id="c", job_id="j", nodes=3)
    assert aws.live == {}
    assert "could not get 3 node(s)" in str(ei.value) and A1.key in str(ei.value)


def test_bad_offer_fails_before_launching():
    aws = ScriptedCloud("aws", {})
    with pytest.raises(InputError):
        _fo({"aws": aws}, [0.0]).provision([A1, offer("aws", "p99.nope", "us-east-1")], cluster_id="c",
                                           job_id="j", nodes=1)
    assert aws.requests == []


# -- the real thing: AWS (moto) -> GCP (fake) -> Azure (fake) ------------------------------------

def test_walk_aws_then_gcp_then_azure(mocked_aws, gcp_cloud, gcp_fake, azure_cloud, azure_fake):
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    image = boto3.client("ec2", region_name="us-east-1").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    aws = AwsCloud(image_id=image, sleep=lambda s: None)
    no_capacity = {"FleetId": "fleet-x", "Instances": [], "Errors": [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "...", "Lifecycle": "spot"}]}
    aws.client("us-east-1").meta.events.register(
        "before-call.ec2.CreateFleet", lambda **_: (SimpleNamespace(status_code=200, headers={}), no_capacity))
    # GCP: the head comes up, the worker hits a stockout -> the lone head must be released
    gcp_fake.queue_error("insert", "capacity")  # first offer's head fails
    orig = gcp_fake._route
    inserts = {"n": 0}

    def gcp_route(method, path, query, body):
        if method == "POST" and path.endswith("/instances"):
            inserts["n"] += 1
            if inserts["n"] == 3:  # second offer: head ok (2), worker (3) stockout
                gcp_fake.queue_error("insert", "capacity")
        return orig(method, path, query, body)

    gcp_fake._route = gcp_route
    clouds = {"aws": aws, "gcp": gcp_cloud, "azure": azure_cloud}
    plan = [offer("aws", "p4d.24xlarge", "us-east-1", "use1-az6", usd=5.1),
            offer("aws", "p4d.24xlarge", "us-east-1", "use1-az1", usd=6.8),
            offer("gcp", "a2-highgpu-8g", "us-central1", "us-central1-a", usd=8.0),
            offer("gcp", "a2-highgpu-8g", "us-central1", "us-central1-b", usd=8.1),
            offer("azure", "Standard_ND96asr_v4", "eastus", usd=9.0)]
    fo = Failover(cloud_factory=clouds.__getitem__)
    cluster = fo.provision(plan, cluster_id="walk-1", job_id="walk-1", nodes=2)

    assert {n.cloud for n in cluster.nodes} == {"azure"} and len(cluster.nodes) == 2
    outcomes = [(a.offer_key.split("/")[0], a.outcome) for a in cluster.attempts]
    assert outcomes == [("aws", "capacity"), ("aws", "cached"), ("gcp", "capacity"), ("gcp", "launched"),
                        ("gcp", "capacity"), ("gcp", "released"), ("azure", "launched"), ("azure", "launched")]
    assert plan[0].key in fo.cache.unavailable_keys() and plan[1].key in fo.cache.unavailable_keys()
    # nothing left anywhere but the azure cluster; then end it
    assert aws.list_nodes() == [] and gcp_fake.running() == []
    azure_cloud.terminate(cluster.nodes)
    assert azure_fake.vms() == [] and azure_fake.nics() == []


def test_prepare_runs_only_for_sites_actually_tried_and_a_failing_prepare_skips_the_site():
    """A plan over several clouds creates per-site resources (security group, firewall rule) only
    where the walk goes; a site whose preparation fails is skipped like a failed launch."""
    now = [0.0]
    aws = ScriptedCloud("aws", {A1.key: [CapacityError("no capacity", code="InsufficientInstanceCapacity")],
                                A2.key: [CapacityError("no capacity", code="InsufficientInstanceCapacity")]})
    gcp = ScriptedCloud("gcp", {})
    prepared: list[tuple[str, str]] = []

    def prepare(cloud: str, region: str) -> None:
        prepared.append((cloud, region))
        if region == "us-west-2":
            raise QuotaError("security groups per VPC", code="SecurityGroupLimitExceeded")

    fo = _fo({"aws": aws, "gcp": gcp}, now)
    c = fo.provision([A1, A2, A3, G1], cluster_id="c", job_id="j", nodes=1, prepare=prepare)
    assert c.nodes[0].cloud == "gcp"
    assert prepared == [("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1")]
    assert [a.outcome for a in c.attempts] == ["capacity", "capacity", "error", "launched"]
    assert "preparing aws/us-west-2" in c.attempts[2].message
    assert not aws.live, "nodes of the abandoned sites were released"
