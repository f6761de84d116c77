"""``spotwise prices`` through the real CLI entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spotwise.cli import main

REQUIRED = {"cloud", "instance_type", "accelerator", "accelerator_count", "region", "zone", "market",
            "usd_per_hour", "usd_per_gpu_hour", "source", "as_of"}


def _json(capsys, *args) -> list[dict]:
    assert main(["prices", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_rows_cheapest_first(capsys):
    rows = _json(capsys, "--gpu", "H100", "--count", "8")
    assert rows and all(REQUIRED <= set(r) for r in rows)
    assert [r["usd_per_hour"] for r in rows] == sorted(r["usd_per_hour"] for r in rows)
    assert all(r["accelerator"] == "H100" and r["accelerator_count"] == 8 for r in rows)
    r = rows[0]
    assert r["usd_per_gpu_hour"] == pytest.approx(r["usd_per_hour"] / 8, rel=1e-5)


def test_filters_and_limit(capsys):
    rows = _json(capsys, "--gpu", "a100-80gb", "--cloud", "aws,gcp", "--market", "on-demand",
                 "--max-price", "50", "--limit", "3")
    assert 1 <= len(rows) <= 3
    assert all(r["cloud"] in ("aws", "gcp") and r["market"] == "on-demand" and r["usd_per_hour"] <= 50
               for r in rows)
    rows = _json(capsys, "--gpu", "L4:1", "--region", "us-central1")
    assert rows and all(r["region"] == "us-central1" and r["accelerator_count"] == 1 for r in rows)
    rows = _json(capsys, "--gpu", "H100", "--sort", "per-gpu")
    assert [r["usd_per_gpu_hour"] for r in rows] == sorted(r["usd_per_gpu_hour"] for r in rows)


def test_table_output(capsys):
    assert main(["prices", "--gpu", "H100:8", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "cheapest first" in out and "H100:8" in out


@pytest.mark.parametrize("args, flag, allowed", [
    (["--gpu", "H900"], "--gpu", "H100"),
    (["--gpu", "H100", "--cloud", "oracle"], "--cloud", "aws, azure, gcp"),
    (["--gpu", "H100", "--max-price", "-1"], "--max-price", ">= 0"),
    (["--gpu", "H100", "--market", "cheap"], "--market", "reserved-1y"),
    (["--gpu", "H100", "--count", "0"], "--count", "1..16"),
    (["--gpu", "H100", "--region", "mars-1"], "--region", "us-"),
    (["--gpu", "H100", "--format", "xml"], "--format", "table, json"),
])
def test_bad_values_exit_2_with_clear_message(capsys, args, flag, allowed):
    assert main(["prices", *args]) == 2
    err = capsys.readouterr().err
    assert flag in err and allowed in err and "allowed" in err
    assert "Traceback" not in err


def test_cold_subprocess_run(_isolated_home):
    env = dict(os.environ, SPOTWISE_HOME=str(_isolated_home))
    p = subprocess.run([sys.executable, "-m", "spotwise.cli", "prices", "--gpu", "H100", "--format", "json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and REQUIRED <= set(rows[0])
    p = subprocess.run([sys.executable, "-m", "spotwise.cli", "prices", "--gpu", "nope"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "--gpu" in p.stderr and "Traceback" not in p.stderr
