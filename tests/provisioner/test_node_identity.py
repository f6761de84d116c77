"""Nodes reach the run's storage with their own identity, never with keys: on AWS the instance
profile's role, whose credentials boto3 on the node reads from IMDS. A launch whose AWS nodes would
have none is refused before anything starts (exit 2, naming the setting)."""

from __future__ import annotations

import json

from spotwise.cli import main
from spotwise.provisioner.clouds.local.metadata import MetadataServer

TASK = "name: ident\nresources:\n  accelerators: {A100: 8}\n  clouds: [aws]\ntraining:\n  steps: 10\n"


def test_boto3_on_a_node_finds_its_instance_profile_credentials_in_imds_and_none_without_one():
    from botocore.credentials import InstanceMetadataProvider
    from botocore.utils import InstanceMetadataFetcher

    with MetadataServer() as imds:
        imds.set_instance("i-1", local_ipv4="127.0.0.5", role="spotwise-node",
                          credentials={"AccessKeyId": "AKIA1", "SecretAccessKey": "s", "Token": "t"})
        imds.set_instance("i-2", local_ipv4="127.0.0.6")
        got = {}
        for iid in ("i-1", "i-2"):
            fetcher = InstanceMetadataFetcher(timeout=2, num_attempts=1, base_url=imds.base_url(iid))
            got[iid] = InstanceMetadataProvider(iam_role_fetcher=fetcher).load()
    assert got["i-1"] is not None and got["i-1"].get_frozen_credentials().access_key == "AKIA1"
    assert got["i-2"] is None                      # no profile: no keys, so no storage


def test_an_aws_launch_without_a_node_identity_for_its_storage_is_refused_before_launching(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPOTWISE_AWS_INSTANCE_PROFILE", raising=False)
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    assert main(["launch", str(task), "--storage", "s3://ckpt/runs"]) == 2
    err = capsys.readouterr().err
    assert "SPOTWISE_AWS_INSTANCE_PROFILE" in err and "Traceback" not in err
    # the dry run plans all the same and says what the launch still needs (issue 48)
    assert main(["launch", str(task), "--storage", "s3://ckpt/runs", "--dry-run", "--format", "json"]) in (0, None)
    assert [n["field"] for n in json.loads(capsys.readouterr().out)["launch_needs"]] == ["SPOTWISE_AWS_INSTANCE_PROFILE"]
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")
    assert main(["launch", str(task), "--storage", "s3://ckpt/runs", "--dry-run", "--format", "json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["chosen"]["cloud"] == "aws"
