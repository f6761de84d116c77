"""Bad input on the command line: one clear message, exit code 2, never a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "tiny-gpt.yaml")


def run_cli(*args, home):
    env = dict(os.environ, SPOTWISE_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "spotwise.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["launch", "/nope.yaml"], "TASK"),
    (["launch", EXAMPLE, "--preempt-at", "ten"], "--preempt-at"),
    (["launch", EXAMPLE, "--preempt-at", "-3"], "--preempt-at"),
    (["launch", EXAMPLE, "--preempt-at", "5", "--no-preempt"], "--no-preempt"),
    (["launch", EXAMPLE, "--cloud", "moon"], "--cloud"),
    (["launch", EXAMPLE, "--cloud", "aws"], "training.checkpoint.storage"),      # file:// cannot reach a cloud
    (["launch", EXAMPLE, "--cloud", "aws", "--storage", "file:///tmp/x"], "--storage"),
    (["launch", EXAMPLE, "--cloud", "aws", "--storage", "s3://my-bucket/p"], "resources"),  # no AWS offer sells cpu:1
    (["launch", EXAMPLE, "--cloud", "aws", "--storage", "s3://my-bucket/p", "--dry-run"], "resources"),
    (["launch", EXAMPLE, "--storage", "ftp://x/y"], "--storage"),
    (["launch", EXAMPLE, "--storage", "s3://"], "--storage"),
    (["launch", EXAMPLE, "--budget", "-1"], "--budget"),
    (["launch", EXAMPLE, "--notice-seconds", "999"], "--notice-seconds"),
    (["launch", EXAMPLE, "--format", "xml"], "--format"),
    (["launch", EXAMPLE, "--bogus"], "--bogus"),
    (["status", "no-such-job"], "JOB_ID"),
])
def test_bad_input_is_a_clear_error(args, needle, tmp_path):
    r = run_cli(*args, home=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_budget_below_one_billing_minute_launches_nothing(tmp_path):
    r = run_cli("launch", EXAMPLE, "--budget", "0.0001", home=tmp_path)
    assert r.returncode == 1
    assert "billing minute" in r.stderr and "nothing was launched" in r.stderr
    assert not (tmp_path / "local" / "instances").exists() or not list((tmp_path / "local" / "instances").iterdir())


def test_bad_task_file_lists_all_problems(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nresources: {market: cheap, nodes: 0}\ntraining: {steps: 0}\n")
    r = run_cli("launch", str(bad), home=tmp_path)
    assert r.returncode == 2
    for field in ("resources.market", "resources.nodes", "training.steps"):
        assert field in r.stderr
    assert "Traceback" not in r.stderr
