"""Kill tests on the local cloud: the runner of a job dies, and the money cap and cleanup still hold.

* (SIGKILL of ``spotwise launch`` mid-run, ``gc`` and ``spotwise resume`` of the lost job: on the
  emulated GCP, test_launch_gcp.py's first leg; an AWS node's own end, the real watcher through the
  guest's ``shutdown``: tests/test_emulator_guest_shutdown.py.)
* SIGTERM during start-up (what ``timeout 60 spotwise launch`` sends): the run is torn down, the job
  is ``cancelled``, no node, ``ray start`` or watcher process is left.
* Ctrl-C once: training stops at a checkpoint on S3; then pressed again and again until the process
  exits: teardown is not cut short.

No timing is asserted tightly: each wait is the documented bound plus generous slack, by polling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from e2e.conftest import EXAMPLE
from e2e.helpers import job_row, wait_for

pytestmark = pytest.mark.slow


def _task(tmp_path: Path, *, steps: int = 3000) -> Path:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["training"]["steps"] = steps
    spec["local"]["preempt_at"] = []
    task = tmp_path / "long.yaml"
    task.write_text(yaml.safe_dump(spec))
    return task


NODE_LEASE_S = 30.0  # an operator's shorter term (SPOTWISE_NODE_LEASE_S; 6 renewals)


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPOTWISE_DATABASE_URL"}
    return dict(env, SPOTWISE_HOME=str(home), SPOTWISE_NODE_LEASE_S=str(NODE_LEASE_S))


#: a test run started in the background of a non-interactive shell inherits SIGINT ignored, and
#: Python then installs no Ctrl-C handler: coreutils' env gives the launch the terminal's default
#: back before it execs (not a ``preexec_fn``: in a worker that has hosted torch and Ray, the fork
#: it needs runs their at-fork handlers, which crashed children with SIGSEGV; see test_ssh_tunnel)
DEFAULT_SIGINT = ("env", "--default-signal=INT")


def _launch(home: Path, task: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*DEFAULT_SIGINT, sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                             "--storage", f"file://{home}/ckpt", *args], env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _gc(home: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "gc", "--cloud", "local", "--format", "json"],
                       env=_env(home), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.timeout(900)
def test_sigterm_during_start_up_leaves_no_process(tmp_path):
    from spotwise.provisioner.clouds.local.cloud import marked_pids

    p = _launch(tmp_path, _task(tmp_path))
    try:
        # the moment the first node process exists (the head is still booting)
        wait_for(lambda: marked_pids(home_prefix=str(tmp_path)) or p.poll() is not None, 300, "a node process")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=300)
        assert p.returncode != 0
        assert marked_pids(home_prefix=str(tmp_path)) == [], err[-3000:]
        rep = json.loads(out)
        assert rep["status"] == "cancelled" and "SIGTERM" in rep["message"], rep["message"]
        job = job_row(tmp_path)
        assert job["status"] == "cancelled" and job["open_nodes"] == 0
        assert not Path(f"/tmp/sw-{job['cluster_id'][-12:]}").exists()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        _gc(tmp_path)


def _ended_nodes(home: Path) -> int:
    from sqlalchemy import create_engine, text

    eng = create_engine(f"sqlite:///{home / 'spotwise.db'}")
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM nodes WHERE terminated_at IS NOT NULL")).scalar())
    finally:
        eng.dispose()


@pytest.fixture
def s3_endpoint(monkeypatch):
    """A real S3 endpoint on loopback: moto's server in a subprocess."""
    from emulator.moto_server import MotoServer

    with MotoServer() as moto:
        for k, v in moto.env().items():
            monkeypatch.setenv(k, v)
        moto.client("s3").create_bucket(Bucket="ckpt")
        yield moto.endpoint


def _llama_on_s3_task(tmp_path: Path) -> Path:
    """The built-in Llama (``debug``) on a token file that ``spotwise data tokenize`` writes straight
    to S3 from standard-library sources (issue 32: ``training.data`` through a real launch, each
    node fetching the file from S3 into its cache), long enough never to finish here."""
    stdlib = Path(json.__file__).parent
    subprocess.run([sys.executable, "-m", "spotwise.cli", "data", "tokenize", *map(str, sorted(stdlib.glob("*.py"))),
                    "s3://ckpt/data/tokens.bin"], env=_env(tmp_path), check=True, capture_output=True, text=True)
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["training"].update(entrypoint="llama", model={"flavor": "debug", "seq_len": 64}, steps=20000,
                            data={"uri": "s3://ckpt/data/tokens.bin"})
    spec["local"]["preempt_at"] = []
    task = tmp_path / "llama.yaml"
    task.write_text(yaml.safe_dump(spec))
    return task


@pytest.mark.timeout(1200)
def test_ctrl_c_stops_at_a_checkpoint_on_s3_and_more_presses_do_not_cut_teardown_short(tmp_path, s3_endpoint):
    """Ctrl-C asks training to stop at a checkpoint and waits for it: the stop checkpoint is
    committed in the run's S3 storage (moto on loopback), resumable. Ctrl-C pressed again and again
    from then until the process exits arrives during teardown, is deferred, and cuts nothing short:
    the job ends ``cancelled`` with no node, ``ray start`` or watcher left.

    What trains is the built-in Llama on a token file in S3 (:func:`_llama_on_s3_task`). A second
    Ctrl-C before the stop checkpoint ends at once without one; that and the deferral are held
    without nodes in tests/engine/run/test_runner_signals.py. The budget stop takes the Ctrl-C's way (the
    runner asks training to stop at a checkpoint); its trigger and report are held without nodes in
    tests/engine/run/test_orchestrator_run.py and test_purse.py. (This was two runs before: one Ctrl-C
    in test_launch.py, and Ctrl-C again and again from the job's submission here.)"""
    import boto3

    from spotwise.provisioner.clouds.local.cloud import marked_pids

    task = _llama_on_s3_task(tmp_path)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)

    def committed() -> list[str]:
        return [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="runs/").get("Contents", [])
                if o["Key"].endswith("/COMMITTED")]

    p = subprocess.Popen([*DEFAULT_SIGINT, sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                          "--storage", "s3://ckpt/runs"], env=_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = wait_for(lambda: committed() or p.poll() is not None, 600, "the first committed checkpoint")
        assert p.poll() is None, p.communicate()[1][-3000:]
        p.send_signal(signal.SIGINT)                      # once: stop at a checkpoint
        wait_for(lambda: len(committed()) > len(first) or p.poll() is not None, 300, "the stop checkpoint")
        # teardown has begun once a node is ended (nothing else ends one in this run)
        wait_for(lambda: _ended_nodes(tmp_path) or p.poll() is not None, 300, "teardown")
        while p.poll() is None:           # again and again: each arrives during teardown and must be deferred
            p.send_signal(signal.SIGINT)
            time.sleep(0.3)
        out, err = p.communicate(timeout=60)
        assert p.returncode != 0
        assert marked_pids(home_prefix=str(tmp_path)) == [], err[-3000:]
        job = job_row(tmp_path)     # (the printed report may be cut short by a Ctrl-C after teardown; the row is not)
        assert job["status"] == "cancelled" and job["open_nodes"] == 0, (job["message"], err[-3000:])
        assert job["message"] == "interrupted by the user", job["message"]     # not "(twice): ... without"
        rep = job["report"] if isinstance(job["report"], dict) else json.loads(job["report"])
        assert rep["checkpoints"] and rep["checkpoints"][-1]["kind"] == "stop", (
            [e["event"] for e in rep["events"]], err[-2000:])
        assert 0 < rep["steps_completed"] < 20000
        assert rep["final_checkpoint"].startswith("s3://ckpt/runs/"), rep["final_checkpoint"]
        assert rep["final_checkpoint"].removeprefix("s3://ckpt/") + "/COMMITTED" in committed()
        assert job["spend"] <= rep["budget_usd"]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        _gc(tmp_path)
