"""The plan a user reads before paying (issue 30, item 4): ``spotwise launch --dry-run`` in an
80-column terminal — no line wider than 80, the chosen offer, the best offer of each allowed cloud
and the best on-demand one, each with why it ranks where it does, sources as short references; the
same in ``--format json``, whole."""

from __future__ import annotations

import json

import pytest

from spotwise.cli import main
from spotwise.engine.plan.planner import make_plan
from spotwise.taskspec import parse_taskspec

# each cloud's own store: GCP nodes reach only gs:// (engine/run/run_stores.py)
STORES = ["--storage", "aws=s3://my-bucket/p", "--storage", "gcp=gs://my-bucket/p", "--storage", "azure=az://myaccount/ckpt/p"]
TASK = """\
name: gpt-a100
resources:
  accelerators: {A100: 8}
  nodes: 2
  clouds: [aws, gcp, azure]
training:
  steps: 1000
  batch_size: 16              # 2 nodes x 8 GPUs: 16 ranks
"""


@pytest.fixture
def task(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")   # AWS nodes' identity for s3://
    monkeypatch.setenv("SPOTWISE_GCP_SERVICE_ACCOUNT", "spotwise-node@p.iam.gserviceaccount.com")   # GCP's for gs://
    monkeypatch.setenv("SPOTWISE_AZURE_NODE_IDENTITY", "/subscriptions/s/resourceGroups/rg/providers/"
                       "Microsoft.ManagedIdentity/userAssignedIdentities/spotwise-node")   # Azure's for az://
    path = tmp_path / "task.yaml"
    path.write_text(TASK)
    return str(path)


def test_dry_run_lines_fit_80_columns_and_show_the_best_of_each_cloud_and_on_demand(task, capsys):
    assert main(["launch", task, *STORES, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and max(len(line) for line in out) <= 80, max(out, key=len)
    text = "\n".join(out)
    for label in ("chosen: #1 ", "best on gcp: #", "best on azure: #", "best on-demand: #"):
        assert label in text
    assert "lowest expected total cost" in text and "vs chosen" in text
    assert "sources:" in text and "[1] " in text                     # the source once, as a reference
    assert "skypilot-org/skypilot-catalog" not in out[2]             # never on an offer's line


def test_dry_run_json_keeps_every_field_whole_and_the_same_highlights(task, capsys):
    assert main(["launch", task, *STORES, "--dry-run", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    labels = [h["label"] for h in doc["highlights"]]
    assert labels[0] == "chosen" and {"best on gcp", "best on azure", "best on-demand"} <= set(labels)
    by = {h["label"]: h for h in doc["highlights"]}
    assert by["chosen"]["offer"]["source"] == doc["chosen"]["source"] and len(doc["chosen"]["source"]) > 40
    assert by["best on gcp"]["offer"]["cloud"] == "gcp" and by["best on azure"]["offer"]["cloud"] == "azure"
    assert by["best on-demand"]["offer"]["market"] == "on-demand"
    ranks = [h["rank"] for h in doc["highlights"]]
    assert ranks[0] == 1 and all(r > 1 for r in ranks[1:])
    assert all(h["why"] for h in doc["highlights"])


def test_a_cloud_with_nothing_that_fits_is_named_not_left_out():
    spec = parse_taskspec({"name": "t", "resources": {"accelerators": {"cpu": 1}, "nodes": 1},
                           "training": {"steps": 10}})
    plan = make_plan(spec, ["local", "aws"])
    by = {h["label"]: h for h in plan.highlights()}
    assert by["best on aws"]["offer"] is None and "sells nothing" in by["best on aws"]["why"]
    assert max(len(line) for line in plan.lines(title="plan for t")) <= 80


def test_an_offer_over_the_budget_says_so():
    spec = parse_taskspec({"name": "t", "resources": {"accelerators": {"A100": 8}, "nodes": 2,
                                                      "clouds": ["aws", "gcp"]},
                           "training": {"steps": 1000, "batch_size": 16}})
    plan = make_plan(spec, ["aws", "gcp"], budget=plan_cost(spec) * 1.0001)
    over = [p for p in plan.ranked if p.over_budget]
    assert over and all(not p.fits for p in over)
    gcp = next(h for h in plan.highlights() if h["label"] == "best on gcp")
    assert gcp["offer"].over_budget and gcp["why"].startswith("ranks after the offers that fit: over the budget")


def plan_cost(spec) -> float:
    return make_plan(spec, ["aws", "gcp"]).chosen.expected_cost_usd
