"""Checkpoint transfer prices: where a store lives, what crossing costs, and that the plan pays it."""

from __future__ import annotations

import pytest

from spotwise.pricing.egress import Site, checkpoint_gb, run_transfer_cost, storage_site, transfer_rate
from spotwise.engine.plan.planner import make_plan
from spotwise.taskspec import parse_taskspec


@pytest.mark.parametrize("uri, env, want", [
    ("file:///tmp/x", {}, Site("local")),
    ("s3://b/p", {"AWS_REGION": "us-west-2"}, Site("aws", "us-west-2")),
    ("s3://b/p", {"SPOTWISE_STORAGE_REGION": "eu-west-1", "AWS_REGION": "us-west-2"}, Site("aws", "eu-west-1")),
    ("s3://b/p", {}, Site("aws", None)),
    ("s3://b/p", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, Site("local")),
    ("s3://b/p", {"AWS_ENDPOINT_URL": "http://10.1.2.3:9000"}, Site("local")),
    ("s3://b/p", {"AWS_ENDPOINT_URL_S3": "https://storage.googleapis.com"}, Site("gcp", None)),
    ("s3://b/p", {"AWS_ENDPOINT_URL": "https://minio.example.com"}, Site("unknown")),
    ("gs://b/p", {"SPOTWISE_STORAGE_REGION": "us-central1"}, Site("gcp", "us-central1")),
])
def test_storage_site(uri, env, want):
    assert storage_site(uri, env) == want


def test_rates_follow_the_cloud_the_bytes_leave():
    aws_e1, aws_w2, gcp = Site("aws", "us-east-1"), Site("aws", "us-west-2"), Site("gcp", "us-central1")
    assert transfer_rate(aws_e1, aws_e1).usd_per_gb == 0.0
    assert transfer_rate(aws_e1, aws_w2).usd_per_gb == pytest.approx(0.02)
    assert transfer_rate(Site("aws", None), aws_w2).scope == "inter_region"    # unknown region: not free
    assert transfer_rate(gcp, aws_e1).usd_per_gb == pytest.approx(0.12)        # GCP's internet egress
    assert transfer_rate(aws_e1, gcp).usd_per_gb == pytest.approx(0.09)        # AWS's
    assert transfer_rate(Site("local"), gcp).usd_per_gb == 0.0
    for scope in ("inter_region", "internet"):
        r = transfer_rate(aws_e1, aws_w2 if scope == "inter_region" else gcp)
        assert r.source.startswith("https://") and r.as_of


def test_run_transfer_cost_counts_writes_and_resume_reads():
    gb = checkpoint_gb(1e9)
    assert gb == pytest.approx(12.0)
    t = run_transfer_cost(storage=Site("aws", "us-east-1"), cluster=Site("gcp", "us-central1"),
                          checkpoint_gb=gb, writes=10, reads=2)
    assert t.usd == pytest.approx(10 * 12 * 0.12 + 2 * 12 * 0.09)
    assert "10 writes" in t.note and "$0.12/GB" in t.note
    assert run_transfer_cost(storage=Site("local"), cluster=Site("gcp", "x"), checkpoint_gb=gb, writes=10,
                             reads=2).usd == 0.0


@pytest.fixture
def big_on_s3(monkeypatch):
    """A 6.4B-parameter task whose checkpoints go to S3 in us-east-1 (no endpoint: real AWS)."""
    monkeypatch.setenv("SPOTWISE_STORAGE_REGION", "us-east-1")
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    spec = parse_taskspec({"name": "big", "resources": {"accelerators": "A100:8", "nodes": 2, "market": "spot"},
                           "training": {"steps": 2000, "batch_size": 16, "model": {"d_model": 4096, "n_layers": 32, "n_heads": 32},
                                        "checkpoint": {"storage": "s3://ckpt/run", "interval_steps": 100}}})
    return spec


def test_the_plan_charges_offers_away_from_the_store(big_on_s3):
    spec = big_on_s3
    plan = make_plan(spec, ["aws"])
    by_site = {}
    for p in plan.ranked:
        by_site.setdefault((p.offer.cloud, p.offer.region), p)
    home = by_site[("aws", "us-east-1")]
    away_region = next(p for (c, r), p in by_site.items() if c == "aws" and r != "us-east-1")
    assert home.transfer_usd == 0.0
    # 20 checkpoints of a 6.4B-parameter model cross regions at AWS's inter-region rate, at least
    assert away_region.transfer_usd >= 20 * checkpoint_gb(12 * 32 * 4096 ** 2) * 0.02
    assert any("checkpoints cross" in n for n in away_region.notes)
    assert away_region.to_dict()["transfer_usd"] == pytest.approx(away_region.transfer_usd, abs=1e-6)
    # the transfer is part of the expected cost the plan ranks by
    assert away_region.expected_cost_usd > away_region.transfer_usd > 0
    # another cloud pays its own internet egress on every checkpoint it writes to the AWS store
    cross = make_plan(spec, ["aws", "gcp"])
    away_cloud = next(p for p in cross.ranked if p.offer.cloud == "gcp")
    assert away_cloud.transfer_usd >= 20 * checkpoint_gb(12 * 32 * 4096 ** 2) * 0.12 > away_region.transfer_usd


def test_a_resume_on_another_cloud_also_pays_for_reading_the_last_checkpoint(big_on_s3):
    """``spotwise resume`` may land on another cloud than the one the job ran on and the store
    lives on: the plan charges the read of the last committed checkpoint (leaving the store's
    cloud) on top of the run's writes and expected resumes; on the store's own region it is free."""
    spec = big_on_s3
    fresh, again = make_plan(spec, ["aws", "gcp"]), make_plan(spec, ["aws", "gcp"], resuming=True)

    def by_key(plan):
        return {p.offer.key: p for p in plan.ranked}

    from spotwise.pricing.estimate import params_from_taskspec

    gb = checkpoint_gb(params_from_taskspec(spec)[0])          # the model's own count, embeddings included
    aws_out = transfer_rate(Site("aws", "us-east-1"), Site("gcp", "us-central1")).usd_per_gb
    f, a = by_key(fresh), by_key(again)
    gcp = next(k for k in f if k.startswith("gcp/"))
    assert a[gcp].transfer_usd - f[gcp].transfer_usd == pytest.approx(gb * aws_out)
    assert a[gcp].expected_cost_usd - f[gcp].expected_cost_usd == pytest.approx(gb * aws_out)
    home = next(k for k in f if k.startswith("aws/us-east-1/"))
    assert a[home].transfer_usd == f[home].transfer_usd == 0.0
