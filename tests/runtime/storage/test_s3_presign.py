"""Presigned S3 URLs a real bucket accepts (issue 48, item 1), against the emulated AWS's strict S3
(:mod:`emulator.s3_strict` in front of a real moto server): SigV4, for the bucket's own region,
looked up once per bucket; and the strict layer refusing what S3 refuses, with S3's error codes."""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from emulator.moto_server import CREDS, MotoServer
from spotwise.runtime.storage import base as storage_base
from spotwise.runtime.storage.base import S3Storage

from ..fakes import EnvPatch


@pytest.fixture(scope="module")
def aws():
    """The emulated AWS (moto behind the strict layers) with a bucket in us-east-1 and one in
    us-west-2, holding the same object."""
    with MotoServer(patched=True) as m:
        s3 = m.client("s3")
        s3.create_bucket(Bucket="east-ckpt")
        s3.create_bucket(Bucket="west-ckpt", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        for b in ("east-ckpt", "west-ckpt"):
            s3.put_object(Bucket=b, Key="run/_builds/abc/w.whl", Body=b"wheel bytes")
        yield m


def fetch(url: str) -> tuple[int, bytes]:
    """What a node's ``curl -f`` gets: the status and the body."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def presign(aws, bucket: str, *, region: str, signature_version: str) -> str:
    import boto3
    from botocore.config import Config

    c = boto3.client("s3", endpoint_url=aws.endpoint, region_name=region,
                     config=Config(signature_version=signature_version),
                     **{k.lower(): v for k, v in CREDS.items()})
    return c.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "run/_builds/abc/w.whl"},
                                    ExpiresIn=600)


@pytest.mark.parametrize("launcher_region", ["us-east-1", "us-west-2", "eu-west-1"])
@pytest.mark.parametrize("bucket", ["east-ckpt", "west-ckpt"])
def test_the_products_fetch_url_is_sigv4_for_the_buckets_region_and_a_strict_s3_serves_it(
        aws, bucket, launcher_region, monkeypatch):
    """Failed before the fix: boto3 1.44's default presign was SigV2 (``AWSAccessKeyId=...&
    Signature=...``) whatever the launcher's region, and S3 answered 400 InvalidRequest."""
    monkeypatch.setattr(storage_base, "_BUCKET_REGIONS", {}, raising=False)
    with EnvPatch(aws.env(launcher_region)):
        url = S3Storage(bucket, "run").fetch_url("_builds/abc/w.whl", expires_s=600)
    query = urlsplit(url).query
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in query and "AWSAccessKeyId" not in query
    want = "us-east-1" if bucket == "east-ckpt" else "us-west-2"
    assert f"%2F{want}%2Fs3%2Faws4_request" in query
    assert fetch(url) == (200, b"wheel bytes")


def test_the_buckets_region_is_looked_up_once_per_bucket(aws, monkeypatch):
    monkeypatch.setattr(storage_base, "_BUCKET_REGIONS", {}, raising=False)
    looked: list[str] = []
    real = storage_base._lookup_bucket_region
    monkeypatch.setattr(storage_base, "_lookup_bucket_region",
                        lambda client, bucket: looked.append(bucket) or real(client, bucket))
    with EnvPatch(aws.env("eu-west-1")):
        for _ in range(3):
            S3Storage("west-ckpt", "run").fetch_url("_builds/abc/w.whl", expires_s=600)
    assert looked == ["west-ckpt"]


def test_the_endpoint_on_aws_is_the_regional_virtual_host(monkeypatch):
    """On AWS itself (no endpoint override) the URL names the bucket's regional endpoint, so no
    redirect is needed: ``BUCKET.s3.REGION.amazonaws.com``. The region is given, not looked up
    (nothing here reaches AWS)."""
    monkeypatch.setattr(storage_base, "_BUCKET_REGIONS", {("", "my-ckpt"): "eu-central-1"})
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "x",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/nonexistent"}.items():
        monkeypatch.setenv(name, value)
    url = S3Storage("my-ckpt", "run").fetch_url("_builds/abc/w.whl", expires_s=600)
    parts = urlsplit(url)
    assert parts.scheme == "https" and parts.netloc == "my-ckpt.s3.eu-central-1.amazonaws.com"
    assert parts.path == "/run/_builds/abc/w.whl" and "%2Feu-central-1%2Fs3%2Faws4_request" in parts.query


def test_a_sigv2_url_is_refused_as_s3_refuses_it(aws):
    code, body = fetch(presign(aws, "east-ckpt", region="us-east-1", signature_version="s3"))
    assert code == 400 and b"<Code>InvalidRequest</Code>" in body and b"AWS4-HMAC-SHA256" in body


def test_a_sigv4_url_for_another_region_is_refused_naming_the_buckets(aws):
    code, body = fetch(presign(aws, "west-ckpt", region="us-east-1", signature_version="s3v4"))
    assert code == 400 and b"<Code>AuthorizationQueryParametersError</Code>" in body
    assert b"the region 'us-east-1' is wrong; expecting 'us-west-2'" in body and b"<Region>us-west-2</Region>" in body


def test_a_tampered_or_foreign_signature_is_refused(aws):
    good = presign(aws, "west-ckpt", region="us-west-2", signature_version="s3v4")
    assert fetch(good) == (200, b"wheel bytes")
    other_key = good.replace("/run/_builds/abc/w.whl", "/run/_builds/abd/w.whl")
    code, body = fetch(other_key)                      # the signature covers the path
    assert code == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body
    last = good[-1]
    code, body = fetch(good[:-1] + ("0" if last != "0" else "1"))
    assert code == 403 and b"<Code>SignatureDoesNotMatch</Code>" in body
    code, body = fetch(good.replace("X-Amz-Credential=testing", "X-Amz-Credential=AKIDUNKNOWN"))
    assert code == 403 and b"<Code>InvalidAccessKeyId</Code>" in body


def test_an_expired_url_is_refused(aws):
    import boto3
    from botocore.config import Config

    c = boto3.client("s3", endpoint_url=aws.endpoint, region_name="us-west-2",
                     config=Config(signature_version="s3v4"), **{k.lower(): v for k, v in CREDS.items()})
    url = c.generate_presigned_url("get_object", Params={"Bucket": "west-ckpt", "Key": "run/_builds/abc/w.whl"},
                                   ExpiresIn=0)
    code, body = fetch(url)
    assert code == 403 and b"<Code>AccessDenied</Code>" in body and b"Request has expired" in body
