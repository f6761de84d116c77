from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def aws_env(monkeypatch):
    """Fake AWS credentials, one region to scan, no real endpoint."""
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "SPOTWISE_AWS_AMI",
              "SPOTWISE_AWS_SUBNETS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SPOTWISE_AWS_REGIONS", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def mocked_aws(aws_env):
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture
def gcp_fake():
    from fakes.gcp_fake import GcpFake

    fake = GcpFake().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def gcp_cloud(gcp_fake):
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    slept: list[float] = []
    cloud = GcpCloud(project="proj-1", credentials=AnonymousCredentials(), endpoint=gcp_fake.endpoint,
                     sleep=slept.append)
    cloud.slept = slept
    return cloud


class StaticToken:
    """A TokenCredential for tests (what azure-identity would hand the SDK)."""

    def get_token(self, *scopes, **kw):
        from azure.core.credentials import AccessToken

        return AccessToken("fake-token", 4102444800)


@pytest.fixture
def azure_fake():
    from fakes.azure_fake import AzureFake

    fake = AzureFake().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def azure_cloud(azure_fake, monkeypatch):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    monkeypatch.setenv("SPOTWISE_AZURE_SSH_PUBLIC_KEY", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 test")
    slept: list[float] = []
    cloud = AzureCloud(subscription_id="sub-1", resource_group="rg-1", credential=StaticToken(),
                       endpoint=azure_fake.endpoint, sleep=slept.append)
    cloud.slept = slept
    return cloud
