"""The shared part of every cloud: the registry, the verbs' defaults, the common tags, the head
offer, error classification helpers, and the SDKs as extras (a missing one names its extra)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spotwise.errors import InputError
from spotwise.extras import MissingExtra
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner import reconcile
from spotwise.provisioner.base import (
    TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE, AuthError, CapacityError, Cloud, ErrorCodes, LaunchRequest,
    Node, ProvisionError, QuotaError, cloud_class, cluster_tags, get_cloud, head_offer, known_clouds,
    most_severe)
from spotwise.provisioner.boot.script import HEAD_KEY


def _offer(cloud: str = "aws", market: Market = Market.SPOT, **kw) -> Offer:
    base = dict(cloud=cloud, instance_type="g5.xlarge", accelerator="A10G", accelerator_count=1,
                region="us-east-1", zone="us-east-1a", market=market, usd_per_hour=0.5,
                source="test", as_of="2026-11-01")
    return Offer(**{**base, **kw})


class Bare(Cloud):
    """A cloud implementing only the abstract methods: the rest are the interface's defaults."""

    name = "bare"

    def launch(self, request):
        return []

    def terminate(self, nodes):
        pass

    def list_nodes(self, cluster_id=None, *, regions=None):
        return []


# -- registry ------------------------------------------------------------------------------------
def test_every_cloud_module_registers_itself():
    assert known_clouds() == ["aws", "azure", "gcp", "local", "slurm"]
    for name in known_clouds():
        assert cloud_class(name).name == name
    assert type(get_cloud("local")).__name__ == "LocalCloud"


def test_unknown_cloud_names_the_field_and_the_allowed_values():
    with pytest.raises(InputError) as ei:
        get_cloud("moon")
    [p] = ei.value.problems
    assert (p.field, p.given) == ("cloud", "moon") and p.allowed == "aws, azure, gcp, local, slurm"


def test_listing_the_clouds_imports_no_sdk():
    code = ("import sys; from spotwise.provisioner.base import known_clouds; known_clouds(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 'botocore', 'azure', 'google'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the SDKs are extras ---------------------------------------------------------------------------
def test_missing_boto3_names_the_aws_extra(monkeypatch):
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingExtra) as ei:
        AwsCloud()
    assert "the AWS cloud" in str(ei.value) and "pip install 'spotwise[aws]'" in str(ei.value)
    assert ei.value.exit_code == 3


def test_missing_compute_sdk_names_the_gcp_extra(monkeypatch):
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setitem(sys.modules, "google.cloud.compute_v1", None)
    cloud = GcpCloud(project="p", credentials=object())
    with pytest.raises(MissingExtra, match=r"pip install 'spotwise\[gcp\]'"):
        cloud.list_nodes()


def test_missing_azure_sdk_names_the_azure_extra(monkeypatch):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    monkeypatch.setitem(sys.modules, "azure.mgmt.compute", None)
    cloud = AzureCloud(subscription_id="sub", credential=object())
    with pytest.raises(MissingExtra, match=r"pip install 'spotwise\[azure\]'"):
        cloud.list_nodes()


def test_a_cloud_without_its_sdk_is_skipped_by_gc_not_fatal(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    sweep = reconcile.gc(clouds=["aws"], everything=True, dry_run=True)
    assert "spotwise[aws]" in sweep.skipped["aws"] and sweep.ended == []


# -- the interface's defaults ----------------------------------------------------------------------
def test_optional_verbs_have_defaults():
    cloud = Bare()
    assert cloud.supports_alternatives is False
    assert cloud.leftovers({"c"}, match=True, dry_run=False) == []
    assert cloud.check_credentials() is None
    assert cloud.classify(QuotaError("q")) is QuotaError
    assert cloud.classify(RuntimeError("x")) is ProvisionError


def test_down_calls_leftovers_on_every_cloud_without_probing(home):
    seen = []

    class WithLeftovers(Bare):
        def leftovers(self, cluster_ids, *, match, dry_run):
            seen.append((cluster_ids, match, dry_run))
            return ["bare thing"]

    sweep = reconcile.down("c-1", clouds=["bare"], cloud_factory=lambda _: WithLeftovers())
    assert sweep.extra_deleted == ["bare thing"] and seen == [({"c-1"}, True, False)]
    sweep = reconcile.gc(clouds=["bare"], live={"c-2"}, dry_run=True, cloud_factory=lambda _: WithLeftovers())
    assert seen[-1] == ({"c-2"}, False, True)


def test_shared_validation_lists_every_problem_before_the_credentials():
    checked = []

    class Checked(Bare):
        def check_credentials(self):
            checked.append(True)

    req = LaunchRequest(cluster_id="c", job_id="j", offer=_offer("aws"), count=0)
    with pytest.raises(InputError) as ei:
        Checked()._validate(req)
    assert [p.field for p in ei.value.problems] == ["offer.cloud", "count"]
    assert ei.value.source == "bare launch" and checked == []


# -- tags, errors, head ----------------------------------------------------------------------------
def test_cluster_tags_common_keys_then_extra_then_labels():
    req = LaunchRequest(cluster_id="c-1", job_id="j-1", offer=_offer(), role="worker",
                        head_address="10.0.0.1:6379", labels={"team": "ml", "x": "label wins"})
    tags = cluster_tags(req, {"x": "extra", "price": "1"})
    assert tags == {TAG_CLUSTER: "c-1", TAG_JOB: "j-1", TAG_MARKET: "spot", TAG_ROLE: "worker",
                    "x": "label wins", "price": "1", HEAD_KEY: "10.0.0.1:6379", "team": "ml"}
    assert HEAD_KEY not in cluster_tags(req, head_address=False)


def test_every_cloud_tags_with_the_common_keys():
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    req = LaunchRequest(cluster_id="C-1", job_id="j-1", offer=_offer(), role="head")
    for cloud in (AwsCloud(session=object()), GcpCloud(project="p", credentials=object()),
                  AzureCloud(subscription_id="s")):
        tags = cloud.cluster_tags(req)
        assert {TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE} <= set(tags), cloud.name
    assert GcpCloud(project="p", credentials=object()).cluster_tags(req)[TAG_CLUSTER] == "c-1"  # GCP: lowercase


def test_error_codes_and_severity():
    codes = ErrorCodes(auth=frozenset({"A"}), quota=frozenset({"Q"}), capacity=frozenset({"C"}))
    assert [codes.kind(c) for c in ("A", "Q", "C", "other", None)] == [
        AuthError, QuotaError, CapacityError, ProvisionError, ProvisionError]
    assert most_severe([CapacityError, QuotaError]) is QuotaError
    assert most_severe([CapacityError, AuthError, QuotaError]) is AuthError
    assert most_severe([ProvisionError]) is ProvisionError


def test_aws_classify_by_code():
    from botocore.exceptions import ClientError, NoCredentialsError

    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    cloud = AwsCloud(session=object())

    def err(code):
        return ClientError({"Error": {"Code": code, "Message": "m"}}, "CreateFleet")

    assert cloud.classify(err("InsufficientInstanceCapacity")) is CapacityError
    assert cloud.classify(err("VcpuLimitExceeded")) is QuotaError
    assert cloud.classify(err("UnauthorizedOperation")) is AuthError
    assert cloud.classify(err("InvalidParameterValue")) is ProvisionError
    assert cloud.classify(NoCredentialsError()) is AuthError


def test_head_offer_falls_back_to_a_region_with_a_price_and_says_so():
    o = head_offer("aws", "m6i.large", "us-east-1", "us-east-1a", fallback_region="us-east-1",
                   env_var="SPOTWISE_AWS_HEAD_TYPE")
    assert (o.cloud, o.market, o.accelerator_count, o.zone) == ("aws", Market.ON_DEMAND, 0, "us-east-1a")
    far = head_offer("aws", "m6i.large", "nowhere-1", "nowhere-1a", fallback_region="us-east-1",
                     env_var="SPOTWISE_AWS_HEAD_TYPE")
    assert far.usd_per_hour == o.usd_per_hour and "us-east-1 price assumed for nowhere-1" in far.source
    with pytest.raises(InputError) as ei:
        head_offer("aws", "t9.huge", "us-east-1", "", fallback_region="us-east-1", env_var="SPOTWISE_AWS_HEAD_TYPE")
    assert ei.value.problems[0].field == "SPOTWISE_AWS_HEAD_TYPE" and "m6i.large" in ei.value.problems[0].allowed


def test_node_default_describe_marks_missing_nodes_terminated():
    n = Node(cloud="bare", instance_id="i-1", instance_type="t", region="r", zone="z", market="spot",
             usd_per_hour=0.1, cluster_id="c", job_id="j")
    assert Bare().describe(n).state == "terminated"


def test_env_ports_and_lists(monkeypatch):
    from spotwise.provisioner.base import env_list, env_ports

    monkeypatch.setenv("SPOTWISE_RAY_PORT", "7000")
    monkeypatch.delenv("SPOTWISE_RAY_DASHBOARD_PORT", raising=False)
    monkeypatch.delenv("SPOTWISE_CONTROL_PORT", raising=False)
    assert env_ports("gcp") == (7000, 8265, 8266)
    monkeypatch.setenv("SPOTWISE_CONTROL_PORT", "70000")
    with pytest.raises(InputError) as ei:
        env_ports("azure")
    assert ei.value.source == "azure" and ei.value.problems[0].field == "SPOTWISE_CONTROL_PORT"
    monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", " a, ,b ")       # a registered setting (spotwise.config)
    monkeypatch.delenv("SPOTWISE_AWS_SECURITY_GROUPS", raising=False)
    assert env_list("SPOTWISE_AWS_SUBNETS") == ["a", "b"] and env_list("SPOTWISE_AWS_SECURITY_GROUPS") == []


def test_env_cidrs_normalises_checks_and_defaults(monkeypatch):
    from spotwise.provisioner.base import env_cidrs

    monkeypatch.delenv("SPOTWISE_GCP_CLIENT_CIDRS", raising=False)
    assert env_cidrs("SPOTWISE_GCP_CLIENT_CIDRS", "aws") == []
    assert env_cidrs("SPOTWISE_GCP_CLIENT_CIDRS", "azure", ("10.42.0.0/16",)) == ["10.42.0.0/16"]
    monkeypatch.setenv("SPOTWISE_GCP_CLIENT_CIDRS", " 10.0.0.1/8 , 192.168.1.0/24")
    assert env_cidrs("SPOTWISE_GCP_CLIENT_CIDRS", "gcp") == ["10.0.0.0/8", "192.168.1.0/24"]
    monkeypatch.setenv("SPOTWISE_GCP_CLIENT_CIDRS", "10.0.0.0/8,not-a-cidr")
    with pytest.raises(InputError) as e:
        env_cidrs("SPOTWISE_GCP_CLIENT_CIDRS", "aws")
    assert "SPOTWISE_GCP_CLIENT_CIDRS" in str(e.value) and "not-a-cidr" in str(e.value)
