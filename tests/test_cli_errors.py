"""Bad input on the command line: one clear message, exit code 2, never a traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "tiny-gpt.yaml")


def run_cli(*args, home):
    # AWS nodes' identity is set, so each case meets the error it is about (its own check: test_node_identity)
    env = dict(os.environ, SPOTWISE_HOME=str(home), SPOTWISE_AWS_INSTANCE_PROFILE="spotwise-node")
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
    # --format: one typed choice and one message on every command that prints
    (["version", "--format", "xml"], "allowed: table, json"),
    (["serve", "--format", "xml"], "allowed: table, json"),
    (["prices", "--format", "yaml"], "allowed: table, json"),
    (["estimate", "--gpu", "H100:8", "--hours", "1", "--format", "xml"], "allowed: table, json"),
    (["catalog", "info", "--format", "xml"], "allowed: table, json"),
    (["launch", EXAMPLE, "--bogus"], "--bogus"),
    (["status", "no-such-job"], "JOB_ID"),
    # numbers: every float flag finite and >= 0, every int in range (checked once, in cli.py)
    (["launch", EXAMPLE, "--budget", "nan"], "--budget"),
    (["launch", EXAMPLE, "--budget", "inf"], "--budget"),
    (["launch", EXAMPLE, "--budget", "1e400"], "--budget"),
    (["estimate", "--gpu", "H100:8", "--hours", "inf"], "--hours"),
    (["estimate", "--gpu", "H100:8", "--hours", "-5"], "--hours"),
    (["estimate", "--gpu", "H100:8", "--tokens", "nan", "--model-params", "7e9"], "--tokens"),
    (["estimate", "--gpu", "H100:8", "--hours", "1", "--nodes", "0"], "--nodes"),
    (["prices", "--gpu", "H100:8", "--max-price", "-inf"], "--max-price"),
    (["simulate", "--trace", "builtin", "--policy", "greedy", "--task-hours", "nan", "--deadline-hours", "2",
      "--restart-hours", "0.1"], "--task-hours"),
    (["simulate", "--trace", "builtin", "--policy", "greedy", "--task-hours", "1", "--deadline-hours", "2",
      "--restart-hours", "0.1", "--spot-price", "inf"], "--spot-price"),
    (["schedule", "add", EXAMPLE, "--cron", "0 2 * * *", "--budget-per-month", "inf"], "--budget-per-month"),
    (["schedule", "add", EXAMPLE, "--cron", "0 0 31 2 *"], "never"),
    (["token", "revoke", "1e23"], "token_id"),
    (["token", "revoke", "99999999999999999999999"], "TOKEN_ID"),
    # storage, traces and plots: refused before anything runs
    (["launch", EXAMPLE, "--storage", "file://host/x"], "--storage"),
    (["launch", EXAMPLE, "--storage", "s3://bu cket/x"], "--storage"),
    (["launch", EXAMPLE, "--cloud", "aws", "--storage", "s3://Bad_Bucket/x"], "--storage"),
    (["launch", EXAMPLE, "--trace", "/no/such/trace.json"], "--trace"),
    (["launch", EXAMPLE, "--trace", "/etc"], "--trace"),
    (["estimate", "--gpu", "H100:8", "--hours", "1", "--plot", "/no/such/dir/x.png"], "--plot"),
    (["estimate", "--gpu", "H100:8", "--hours", "1", "--plot", "out.txt"], "--plot"),
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


@pytest.mark.parametrize("content,field", [
    (b"name: caf\xe9\n", "UTF-8"),                              # Latin-1, not UTF-8
    (b"name: x\nbudget_usd: 1e400\n", "budget_usd"),
    (b"name: x\nbudget_usd: .nan\n", "budget_usd"),
    (b"name: x\npolicy: rm -rf /\n", "policy"),
    (b"name: x\ntraining: {checkpoint: {storage: 'file://host/x'}}\n", "training.checkpoint.storage"),
    (b"name: x\nlocal: {trace: /no/such.json}\n", "local.trace"),
])
def test_bad_task_files_are_exit_2(tmp_path, content, field):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    r = run_cli("launch", str(bad), home=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert field in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "crash.log").exists()


def test_json_report_is_valid_json_even_for_odd_numbers(tmp_path):
    """``--format json`` output parses with a strict parser (no NaN/Infinity literals)."""
    import json

    r = run_cli("estimate", "--gpu", "H100:8", "--hours", "1e-300", "--format", "json", home=tmp_path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
