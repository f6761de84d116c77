"""Estimator: the FLOPs model, spot overhead and deadline risk, honest reserved pricing, the CLI."""

from __future__ import annotations

import json
import math

import pytest

from spotwise.cli import main
from spotwise.errors import InputError
from spotwise.pricing import Market, Offer
from spotwise.pricing.estimate import JobModel, estimate_offer, gpu_peaks

FIELDS = {"cloud", "instance_type", "region", "zone", "market", "nodes", "usd_per_hour", "expected_hours",
          "expected_cost_usd", "p_deadline_miss", "notes"}


def _o(**kw) -> Offer:
    base = dict(cloud="aws", instance_type="p5.48xlarge", accelerator="H100", accelerator_count=8,
                region="us-east-1", zone="use1-az1", market=Market.ON_DEMAND, usd_per_hour=55.04,
                source="test", as_of="2026-01-01")
    base.update(kw)
    return Offer(**base)


def test_hours_from_6PT_over_gpus_peak_mfu():
    job = JobModel(model_params=7e9, tokens=1e11, mfu=0.5)
    e = estimate_offer(_o(), job, nodes=2)
    expected = 6 * 7e9 * 1e11 / (16 * 989.4e12 * 0.5) / 3600
    assert e.compute_hours == pytest.approx(expected)
    assert e.expected_cost_usd == pytest.approx(expected * 2 * 55.04)


def test_v100_uses_fp16_and_says_so():
    assert gpu_peaks()["V100"] == (125.0, "fp16")
    e = estimate_offer(_o(accelerator="V100", instance_type="p3.16xlarge"), JobModel(model_params=1e9, tokens=1e9))
    assert any("fp16" in n for n in e.notes)


def test_spot_costs_extra_hours_and_deadline_risk_grows_as_deadline_tightens():
    job = JobModel(hours=500)
    spot = _o(market=Market.SPOT, usd_per_hour=20.0)
    loose = estimate_offer(spot, job, nodes=4, deadline_hours=1000)
    tight = estimate_offer(spot, job, nodes=4, deadline_hours=505)
    assert loose.expected_hours > 500 and loose.interruptions_expected > 0
    assert loose.checkpoint_interval_hours == pytest.approx(math.sqrt(2 * (2 / 60) / (4 * -math.log(0.75) / 730)))
    assert 0 <= loose.p_deadline_miss < tight.p_deadline_miss <= 1
    assert estimate_offer(spot, job, deadline_hours=400).p_deadline_miss == 1.0
    assert any("egress" in n for n in loose.notes)
    # more nodes -> more interruptions -> more expected hours
    assert estimate_offer(spot, job, nodes=8).expected_hours > estimate_offer(spot, job, nodes=1).expected_hours


def test_reserved_is_the_whole_term_with_break_even():
    e = estimate_offer(_o(market=Market.RESERVED_1Y, zone="", usd_per_hour=30.0, payment_option="all-upfront"),
                       JobModel(hours=100), on_demand_ref=55.04)
    assert e.expected_cost_usd == pytest.approx(30.0 * 8760)
    assert any("break-even utilisation 55%" in n for n in e.notes)


def test_bad_job_inputs():
    with pytest.raises(InputError):
        JobModel()
    with pytest.raises(InputError, match="--mfu"):
        JobModel(hours=1, mfu=1.5)


def test_cli_json_and_plot(capsys, tmp_path):
    png = tmp_path / "cost.png"
    assert main(["estimate", "--gpu", "H100:8", "--nodes", "2", "--model-params", "7e9", "--tokens", "2e11",
                 "--deadline-hours", "400", "--budget", "20000", "--format", "json", "--plot", str(png)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(FIELDS <= set(r) for r in rows)
    assert {r["market"] for r in rows} >= {"spot", "on-demand", "reserved-1y", "reserved-3y"}
    costs = [r["expected_cost_usd"] for r in rows]
    assert costs == sorted(costs)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_task_file(capsys, tmp_path):
    task = tmp_path / "t.yaml"
    task.write_text("name: t\nresources:\n  accelerators: {A100-80GB: 8}\n  nodes: 1\ndeadline_hours: 10\n")
    assert main(["estimate", str(task), "--hours", "5", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["accelerator"] == "A100-80GB" and r["p_deadline_miss"] is not None for r in rows)


@pytest.mark.parametrize("args, flag", [
    (["--gpu", "H100"], "--gpu"),
    (["--gpu", "H100:8"], "--hours"),
    (["--gpu", "H100:8", "--hours", "-3"], "--hours"),
    (["--gpu", "H100:8", "--hours", "3", "--mfu", "2"], "--mfu"),
    (["--gpu", "H100:8", "--hours", "3", "--budget", "-1"], "--budget"),
    (["--gpu", "H100:8", "--hours", "3", "--market", "cheap"], "--market"),
])
def test_cli_bad_values_exit_2(capsys, args, flag):
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
