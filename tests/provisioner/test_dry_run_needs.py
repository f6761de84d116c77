"""``launch --dry-run`` is how a user looks before paying, often before any infra exists (issue 48):
it plans without the node identity settings and ends with what a real launch still needs, instead
of refusing with exit 2; a real launch still refuses. A bad value is still bad input (exit 2). The
plan shows each worker's boot disk as it will be created."""

from __future__ import annotations

import json

import pytest

from spotwise.cli import main

TASK = "name: needs\nresources:\n  accelerators: {%s: 8}\n  clouds: [%s]\ntraining:\n  steps: 10\n"
CASES = {   # cloud: (accelerator, storage, the identity setting, the field the error names)
    "aws": ("A100", "s3://ckpt/runs", "SPOTWISE_AWS_INSTANCE_PROFILE"),
    "gcp": ("H100", "gs://ckpt/runs", "SPOTWISE_GCP_SERVICE_ACCOUNT"),
    "azure": ("A100", "az://acct/ckpt/runs", "SPOTWISE_AZURE_NODE_IDENTITY"),
}


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """A laptop before any infra: no node identity of any cloud."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    for name in ("SPOTWISE_AWS_INSTANCE_PROFILE", "SPOTWISE_GCP_SERVICE_ACCOUNT", "SPOTWISE_GCP_NODE_SCOPES",
                 "SPOTWISE_AZURE_NODE_IDENTITY"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.parametrize("cloud", sorted(CASES))
def test_a_dry_run_without_node_identity_plans_and_lists_what_a_launch_still_needs(bare, cloud, capsys):
    """Failed before the fix: the dry run exited 2 naming the missing setting."""
    gpu, storage, setting = CASES[cloud]
    task = bare / f"{cloud}.yaml"
    task.write_text(TASK % (gpu, cloud))
    assert main(["launch", str(task), "--storage", storage, "--dry-run", "--format", "json"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["chosen"]["cloud"] == cloud
    assert [n["field"] for n in doc["launch_needs"]] == [setting] and doc["launch_needs"][0]["allowed"]
    assert main(["launch", str(task), "--storage", storage, "--dry-run"]) in (0, None)
    text = capsys.readouterr().out.splitlines()
    i = text.index("a real launch still needs:")
    assert any(setting in line for line in text[i + 1:])


def test_a_real_launch_without_node_identity_is_still_refused_before_anything_starts(bare, capsys):
    gpu, storage, setting = CASES["aws"]
    task = bare / "aws.yaml"
    task.write_text(TASK % (gpu, "aws"))
    assert main(["launch", str(task), "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert setting in err and "Traceback" not in err


def test_a_bad_identity_value_is_still_bad_input_in_a_dry_run(bare, monkeypatch, capsys):
    task = bare / "azure.yaml"
    task.write_text(TASK % ("A100", "azure"))
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", "spotwise-node")       # a name, not a resource id
    assert main(["launch", str(task), "--storage", "az://acct/ckpt/runs", "--dry-run"]) == 2
    assert "userAssignedIdentities" in capsys.readouterr().err


def test_the_plan_shows_each_workers_boot_disk_as_it_will_be_created(bare, capsys):
    """GCP's H100 offers (A3) get pd-balanced, not GCE's default pd-standard the plan showed before."""
    task = bare / "gcp.yaml"
    task.write_text(TASK % ("H100", "gcp"))
    assert main(["launch", str(task), "--storage", "gs://ckpt/runs", "--dry-run", "--format", "json"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    disks = {p["instance_type"]: p["carried_per_worker"][0]["what"] for p in [doc["chosen"], *doc["fallbacks"]]}
    assert disks and all(t.startswith("a3-") for t in disks)
    assert all(w.startswith("pd-balanced 200 GiB") for t, w in disks.items() if not t.startswith("a3-ultragpu"))
