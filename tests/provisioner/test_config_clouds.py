"""Each cloud takes its settings from the config file when the environment does not set them
(issue 36 item 1): the real clients against moto and the local GCP/Azure fakes, no env var set."""

from __future__ import annotations

import json

import pytest

from helpers import offer
from spotwise import config
from spotwise.errors import InputError
from spotwise.provisioner.base import LaunchRequest


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    """Write the config file (a dict) with no SPOTWISE_* setting left in the environment."""
    for s in config.SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("SPOTWISE_CONFIG", str(path))
    return lambda data: path.write_text(json.dumps(data)) and path


def test_aws_from_the_file(mocked_aws, config_file):
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    path = config_file({"aws": {"regions": ["us-west-2"], "instance_profile": "spotwise-node",
                                "head_type": "m6i.xlarge", "spot_strategy": "capacity-optimized",
                                "client_cidrs": ["10.9.0.0/16"]},
                        "nodes": {"ray_port": 7379}})
    cloud = AwsCloud()
    assert cloud.scan_regions() == ["us-west-2"]
    assert cloud.iam_instance_profile == "spotwise-node" and cloud.spot_strategy == "capacity-optimized"
    assert cloud.storage_identity_problem("s3://bucket/run") is None       # the profile came from the file
    assert cloud.head_type == "m6i.xlarge"
    assert cloud.client_cidrs == ["10.9.0.0/16"] and cloud.ray_port == 7379
    assert cloud.list_nodes() == [] and cloud.skipped_regions == {}

    config_file({"aws": {"spot_strategy": "cheapest-please"}})
    with pytest.raises(InputError) as e:
        AwsCloud()
    assert "capacity-optimized" in str(e.value)                              # the cloud's own check still runs
    config_file({"aws": {"head_type": "no-such.type"}})
    with pytest.raises(InputError) as e:
        AwsCloud().head_offer("us-east-1", "us-east-1a")
    assert e.value.problems[0].field == f"{path}: aws.head_type"


def test_gcp_from_the_file(gcp_fake, config_file):
    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    config_file({"gcp": {"project": "file-proj", "endpoint": gcp_fake.endpoint, "anonymous": True,
                         "service_account": "node@file-proj.iam.gserviceaccount.com", "external_ip": True}})
    cloud = GcpCloud(sleep=lambda s: None)
    nodes = cloud.launch(LaunchRequest(cluster_id="c-cfg", job_id="job-cfg", count=1, role="head",
                                       offer=offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a",
                                                   market="on-demand")))
    insert = next(r for r in gcp_fake.requests if r["method"] == "POST" and r["path"].endswith("/instances"))
    assert insert["path"] == "/compute/v1/projects/file-proj/zones/us-central1-a/instances"
    assert insert["body"]["serviceAccounts"][0]["email"] == "node@file-proj.iam.gserviceaccount.com"
    assert insert["body"]["networkInterfaces"][0].get("accessConfigs")          # external_ip: true
    cloud.terminate(nodes)
    assert gcp_fake.running() == []


def test_azure_from_the_file(azure_fake, config_file):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    config_file({"azure": {"subscription_id": "sub-file", "resource_group": "rg-file", "anonymous": True,
                           "endpoint": azure_fake.endpoint, "vnet_cidr": "10.50.0.0/16"}})
    cloud = AzureCloud(sleep=lambda s: None)
    assert (cloud.subscription_id, cloud.resource_group, cloud.vnet_cidr) == ("sub-file", "rg-file", "10.50.0.0/16")
    assert cloud.client_cidrs == ["10.50.0.0/16"]
    assert cloud.list_nodes() == []
    assert any("/subscriptions/sub-file/resourceGroups/rg-file/" in r["path"] for r in azure_fake.requests)
