"""The AWS IAM policy in infra/ covers every AWS API action the code calls, and nothing more.

Calls are found by parsing the code (``ast``): attribute names and string literals that are
boto3 operation names of the service each module talks to. Actions AWS requires *implicitly*
(CreateFleet launches through RunInstances, etc.) are listed here with the reason.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import boto3
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "spotwise"
POLICY = ROOT / "infra" / "aws" / "iam-policy.json"

# module -> AWS services its boto3 clients talk to
MODULES = {
    "provisioner/clouds/aws/cloud.py": ("ec2", "ssm"),      # ssm: the Deep Learning AMI's published parameter
    "provisioner/clouds/aws/network.py": ("ec2",),   # the cluster's security group and interfaces
    "pricing/live/aws.py": ("ec2", "pricing"),
    "runtime/storage/base.py": ("s3",),
}
# boto3 S3 transfer helpers -> the S3 operations they use (multipart above the threshold)
S3_TRANSFER = {"upload_file": ("PutObject", "CreateMultipartUpload", "UploadPart",
                               "CompleteMultipartUpload", "AbortMultipartUpload"),
               "download_file": ("GetObject", "HeadObject")}
# S3 API operation -> IAM action (S3 names several operations after one permission)
S3_IAM = {"PutObject": "s3:PutObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
          "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload",
          "GetObject": "s3:GetObject", "HeadObject": "s3:GetObject", "ListObjectsV2": "s3:ListBucket",
          "DeleteObjects": "s3:DeleteObject", "DeleteObject": "s3:DeleteObject",
          "ListParts": "s3:ListMultipartUploadParts", "ListMultipartUploads": "s3:ListBucketMultipartUploads",
          "HeadBucket": "s3:ListBucket", "GetBucketLocation": "s3:GetBucketLocation"}   # the bucket's region
IMPLIED = {
    "ec2:RunInstances": "CreateFleet launches instances through RunInstances on the caller's behalf",
    "iam:PassRole": "attaching the node instance profile (SPOTWISE_AWS_INSTANCE_PROFILE)",
    "iam:CreateServiceLinkedRole": "the first spot fleet in an account creates AWSServiceRoleForEC2Spot/Fleet",
    "s3:ListMultipartUploadParts": "boto3's transfer manager may list parts when resuming a multipart upload",
    "s3:ListBucketMultipartUploads": "listing unfinished uploads so they can be aborted",
}


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return out


def code_actions() -> set[str]:
    actions = set()
    for rel, services in MODULES.items():
        path = SRC / rel
        if not path.exists():
            pytest.skip(f"{rel} not written yet")
        names = _names(path)
        for svc in services:
            client = boto3.client(svc, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
            mapping = client.meta.method_to_api_mapping
            ops = {mapping[n] for n in names if n in mapping}
            if svc == "s3":
                ops |= {op for helper, extra in S3_TRANSFER.items() if helper in names for op in extra}
                actions |= {S3_IAM[op] for op in ops}
            else:
                actions |= {f"{svc}:{op}" for op in ops}
    return actions


def policy_actions() -> set[str]:
    doc = json.loads(POLICY.read_text())
    out = set()
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow"
        acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        assert not any("*" in a for a in acts), "no wildcard actions"
        out |= set(acts)
    return out


def test_policy_covers_exactly_what_the_code_calls():
    code, policy = code_actions(), policy_actions()
    # the provisioner's own calls, spelled out so a refactor cannot silently drop them
    assert {"ec2:CreateFleet", "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "ec2:DescribeInstances",
            "ec2:TerminateInstances", "ec2:DescribeSubnets", "ssm:GetParameter", "ec2:CreateTags",
            "ec2:DescribeLaunchTemplates"} <= code
    assert {"pricing:GetProducts", "ec2:DescribeSpotPriceHistory", "ec2:DescribeInstanceTypes"} <= code
    assert {"s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:DeleteObject"} <= code
    missing = code - policy
    assert not missing, f"policy lacks actions the code calls: {sorted(missing)}"
    extra = policy - code - set(IMPLIED)
    assert not extra, f"policy grants actions nothing calls: {sorted(extra)}"


def test_s3_statements_are_scoped_to_the_bucket():
    doc = json.loads(POLICY.read_text())
    for st in doc["Statement"]:
        acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if any(a.startswith("s3:") for a in acts):
            assert st["Resource"].startswith("arn:aws:s3:::${bucket}")
