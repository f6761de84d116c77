"""Kill tests on the local cloud: the runner of a job dies, and the money cap and cleanup still hold.

* SIGKILL of ``spotwise launch`` mid-run: every node ends itself (its dead man's switch) within the
  documented bound — the last node lease the runner pushed (at most the lease's term after the
  kill; 30 s here through ``SPOTWISE_NODE_LEASE_S``, 60 s by default) plus ``SELF_END_S`` — with
  no help from anyone; then ``spotwise gc`` marks the job ``lost``,
  closes its bills within the cap and leaves nothing behind; and ``spotwise resume JOB --budget 1``
  continues the lost run as the same job from its last committed checkpoint to the end, with the
  weights of the uninterrupted reference run.
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

pytestmark = pytest.mark.slow

SLACK_S = 120.0     # a loaded 2-core machine: generous, and only an upper bound


def _task(tmp_path: Path, *, steps: int = 3000) -> Path:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["training"]["steps"] = steps
    spec["local"]["preempt_at"] = []
    task = tmp_path / "long.yaml"
    task.write_text(yaml.safe_dump(spec))
    return task


NODE_LEASE_S = 30.0  # an operator's shorter term (SPOTWISE_NODE_LEASE_S; 6 renewals): the bound below


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


def _wait_for(cond, timeout: float, what: str, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _job(home: Path) -> dict:
    """The one job row of this home, read with the CLI's own database settings."""
    from sqlalchemy import create_engine, text

    eng = create_engine(f"sqlite:///{home / 'spotwise.db'}")
    try:
        with eng.connect() as c:
            rows = [dict(r._mapping) for r in c.execute(text("SELECT * FROM jobs"))]
            assert len(rows) == 1, rows
            job = rows[0]
            job["spend"] = float(c.execute(text("SELECT coalesce(sum(usd), 0) FROM ledger WHERE job_id = :j"),
                                           {"j": job["id"]}).scalar())
            job["open_nodes"] = int(c.execute(text("SELECT count(*) FROM nodes WHERE job_id = :j AND "
                                                   "terminated_at IS NULL"), {"j": job["id"]}).scalar())
            job["ledger_end"] = c.execute(text("SELECT max(\"end\") FROM ledger WHERE job_id = :j"),
                                          {"j": job["id"]}).scalar()
            return job
    finally:
        eng.dispose()


def _gc(home: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "gc", "--cloud", "local", "--format", "json"],
                       env=_env(home), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.timeout(2400)         # boot + training + the switch's bound + the resume, on a loaded machine
def test_sigkilled_runner_nodes_end_themselves_and_gc_marks_the_job_lost(tmp_path, reference):
    from spotwise.provisioner.local import marked_pids
    from spotwise.engine.lease import SELF_END_S

    cap = 0.10                      # ~175 s of this cluster (head $0.10/h + 2 spot workers $0.9731/h)
    # the reference's steps: the resumed run must end with its weights
    p = _launch(tmp_path, _task(tmp_path, steps=reference["steps_total"]), "--budget", str(cap))
    try:
        _wait_for(lambda: list((tmp_path / "ckpt").glob("*/checkpoints/*/COMMITTED")) or p.poll() is not None,
                  600, "the first committed checkpoint")
        assert p.poll() is None, f"the run ended before it could be killed: {p.communicate()[1][-3000:]}"
        _wait_for(lambda: _job(tmp_path)["node_deadline"], 60, "a node lease pushed to the head")
        os.killpg(p.pid, signal.SIGKILL)         # the runner and nothing else: nodes run in sessions of their own
        killed_at = time.time()
        p.wait()
        before = _job(tmp_path)
        assert before["status"] == "running"     # nobody has told the database yet
        assert marked_pids(home_prefix=str(tmp_path)), "the nodes should still be running right after the kill"
        # the nodes end themselves: by the last lease pushed (<= kill + NODE_LEASE_S) + SELF_END_S
        bound = NODE_LEASE_S + SELF_END_S
        _wait_for(lambda: not marked_pids(home_prefix=str(tmp_path)), bound + SLACK_S,
                  f"every node to end itself (bound {bound:.0f} s after the kill + slack)")
        gone_after = time.time() - killed_at
        logs = "".join(f.read_text() for f in (tmp_path / "local" / "logs").glob("*.watch.log"))
        assert "dead man's switch: ending this node" in logs
        assert _job(tmp_path)["status"] == "running", "the nodes ended themselves; the row is gc's to fix"

        sweep = _gc(tmp_path)
        after = _job(tmp_path)
        assert [j["job_id"] for j in sweep["jobs"]] == [after["id"]]
        assert after["status"] == "lost", after["message"]
        assert after["open_nodes"] == 0
        assert after["spend"] <= cap, (after["spend"], cap)
        # gone nodes are billed no later than their lease let them run
        assert after["ledger_end"] <= after["node_deadline"] + SELF_END_S + 1
        assert not Path(f"/tmp/sw-{after['cluster_id'][-12:]}").exists()
        assert _gc(tmp_path)["jobs"] == []                    # once only
        print(f"nodes gone {gone_after:.0f} s after SIGKILL; spend ${after['spend']:.4f} of ${cap}")

        # the lost run continues as the same job (same run name and storage) with $1 more
        r = subprocess.run([sys.executable, "-m", "spotwise.cli", "resume", after["id"], "--budget", "1",
                            "--format", "json"], env=_env(tmp_path), capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0 and r.stdout.strip(), f"rc={r.returncode}\n{r.stderr[-4000:]}"
        rep = json.loads(r.stdout)
        [leg] = rep["resumed"]
        assert leg["from_status"] == "lost" and leg["from_step"] >= 20, leg
        assert leg["budget_usd"] == pytest.approx(after["spend"] + 1.0) and rep["budget_usd"] == leg["budget_usd"]
        assert rep["status"] == "succeeded", rep["message"]
        assert rep["steps_completed"] == rep["steps_total"] == reference["steps_total"]
        assert rep["model_sha256"] == reference["model_sha256"]            # exact: the uninterrupted weights
        assert rep["resume_points"][0]["from_step"] == leg["from_step"]    # the runtime restored that checkpoint
        done = _job(tmp_path)
        assert done["id"] == after["id"] and done["status"] == "succeeded" and done["open_nodes"] == 0
        assert done["spend"] == pytest.approx(rep["cost_usd"], abs=1e-5)   # one ledger: both legs, once each
        assert after["spend"] < done["spend"] <= leg["budget_usd"]
        assert marked_pids(home_prefix=str(tmp_path)) == []
        print(f"resumed from step {leg['from_step']}: ${done['spend']:.4f} in all, weights equal to the reference")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        _gc(tmp_path)


@pytest.mark.timeout(900)
def test_sigterm_during_start_up_leaves_no_process(tmp_path):
    from spotwise.provisioner.local import marked_pids

    p = _launch(tmp_path, _task(tmp_path))
    try:
        # the moment the first node process exists (the head is still booting)
        _wait_for(lambda: marked_pids(home_prefix=str(tmp_path)) or p.poll() is not None, 300, "a node process")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=300)
        assert p.returncode != 0
        assert marked_pids(home_prefix=str(tmp_path)) == [], err[-3000:]
        rep = json.loads(out)
        assert rep["status"] == "cancelled" and "SIGTERM" in rep["message"], rep["message"]
        job = _job(tmp_path)
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
    without nodes in tests/engine/test_runner_signals.py. The budget stop takes the Ctrl-C's way (the
    runner asks training to stop at a checkpoint); its trigger and report are held without nodes in
    tests/engine/test_orchestrator_run.py and test_purse.py. (This was two runs before: one Ctrl-C
    in test_launch.py, and Ctrl-C again and again from the job's submission here.)"""
    import boto3

    from spotwise.provisioner.local import marked_pids

    task = _llama_on_s3_task(tmp_path)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)

    def committed() -> list[str]:
        return [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt", Prefix="runs/").get("Contents", [])
                if o["Key"].endswith("/COMMITTED")]

    p = subprocess.Popen([*DEFAULT_SIGINT, sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                          "--storage", "s3://ckpt/runs"], env=_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = _wait_for(lambda: committed() or p.poll() is not None, 600, "the first committed checkpoint")
        assert p.poll() is None, p.communicate()[1][-3000:]
        p.send_signal(signal.SIGINT)                      # once: stop at a checkpoint
        _wait_for(lambda: len(committed()) > len(first) or p.poll() is not None, 300, "the stop checkpoint")
        # teardown has begun once a node is ended (nothing else ends one in this run)
        _wait_for(lambda: _ended_nodes(tmp_path) or p.poll() is not None, 300, "teardown")
        while p.poll() is None:           # again and again: each arrives during teardown and must be deferred
            p.send_signal(signal.SIGINT)
            time.sleep(0.3)
        out, err = p.communicate(timeout=60)
        assert p.returncode != 0
        assert marked_pids(home_prefix=str(tmp_path)) == [], err[-3000:]
        job = _job(tmp_path)     # (the printed report may be cut short by a Ctrl-C after teardown; the row is not)
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
