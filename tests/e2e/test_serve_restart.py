"""Kill `spotwise serve` with SIGKILL while a training job it launched is running on the local
cloud, start it again: the job finishes, its spend is counted once, nothing leaks.

Why this holds: each job runs in a runner process of its own session (see
``spotwise.engine.work.jobs``), which owns the job row and writes the ledger. The server only launches
and watches; a restarted server reconciles, sees the runner alive, and leaves the job alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.helpers import EXAMPLE
from waiting import wait_for
from spotwise.provisioner.clouds.local.cloud import marked_pids
from spotwise.utils.net import free_port as _free_port

pytestmark = pytest.mark.slow


def _start_serve(env: dict, port: int, log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "serve", "--port", str(port), "--tick", "0.5"],
                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        assert p.poll() is None, f"serve exited early:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    p.kill()
    raise AssertionError(f"serve did not come up:\n{log.read_text()[-3000:]}")


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres)])
def server_db(request, tmp_path, monkeypatch):
    """The server's PostgreSQL (a fresh database, see ``pg_database``). The restart is proven once,
    on the database a shared server runs; what it relies on in the database (the runner owns the
    job row and the ledger, reconcile leaves a live owner alone) is held on SQLite and PostgreSQL
    alike by tests/engine and tests/service, which take both."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", request.getfixturevalue("pg_database"))
    return request.param


def _end_leftovers(job_id: str | None) -> None:
    """When an assertion failed mid-run, end the job's runner and cluster so that one failure does
    not leave a training run behind (a passing run has nothing left here)."""
    from spotwise.provisioner.clouds.local.cloud import LocalCloud
    from spotwise.engine.state import db

    pid = None
    if job_id:
        try:
            with db.session() as s:
                j = s.get(db.Job, job_id)
                pid = j.owner_pid if j is not None and j.status in ("pending", "running") else None
        except Exception:  # noqa: BLE001 - best effort cleanup
            pid = None
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)   # the runner leads its own session
        except (ProcessLookupError, PermissionError):
            pass
    cloud = LocalCloud()
    cloud.terminate(cloud.list_nodes())


def test_sigkill_serve_mid_run_then_restart(tmp_path, server_db):
    env = dict(os.environ)      # SPOTWISE_HOME, and SPOTWISE_DATABASE_URL for PostgreSQL (see server_db)
    token = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "token", "create", "--format", "json"],
                                      env=env, capture_output=True, text=True, check=True).stdout)["token"]
    task = yaml.safe_load(EXAMPLE.read_text())
    task["training"]["steps"] = 120
    # API-submitted jobs keep file:// checkpoints under the server's storage root (SPOTWISE_HOME/checkpoints)
    task["training"]["checkpoint"]["storage"] = f"file://{tmp_path}/checkpoints/ckpt"
    task["local"] = {"preempt_at": []}
    port = _free_port()
    base = f"http://127.0.0.1:{port}/api/v1"
    hdr = {"Authorization": f"Bearer {token}"}
    serve_log = tmp_path / "serve.log"
    first = _start_serve(env, port, serve_log)
    second = None
    job_id = None
    try:
        r = httpx.post(f"{base}/jobs", json={"task": task, "budget_usd": 1.0}, headers=hdr, timeout=30)
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]

        def launched_all():
            evs = httpx.get(f"{base}/jobs/{job_id}/events", headers=hdr, timeout=10).json()
            return [e for e in evs if e["event"] == "launched"] if \
                sum(e["event"] == "launched" for e in evs) >= 1 + task["resources"]["nodes"] else None

        wait_for(launched_all, 240, "the job's cluster to come up", poll=1.0)

        def training():         # the run's curves have a trained step: the kill comes mid-training
            points = httpx.get(f"{base}/jobs/{job_id}/curves", headers=hdr, timeout=10).json()["points"]
            return any((p["step"] or 0) > 0 for p in points)

        wait_for(training, 240, "the first training step", poll=1.0)
        job = httpx.get(f"{base}/jobs/{job_id}", headers=hdr, timeout=10).json()
        assert job["status"] == "running", job

        # SIGKILL the server: no cleanup of any kind runs in it.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        from spotwise.engine.state import db

        with db.session() as s:
            runner_pid = s.get(db.Job, job_id).owner_pid
        assert runner_pid and runner_pid != first.pid
        os.kill(runner_pid, 0)  # the job's runner outlived the server

        second = _start_serve(env, port, serve_log)
        final = wait_for(lambda: (j := httpx.get(f"{base}/jobs/{job_id}", headers=hdr, timeout=10).json())
                      ["status"] not in ("pending", "running") and j, 600, "the job to finish", poll=2.0)
        assert final["status"] == "succeeded", final
        assert final["steps_completed"] == task["training"]["steps"]
        assert "owner process" not in (final["message"] or ""), "the restarted server must not reconcile a live job"

        # exactly one job for this launch (no double launch after the restart)
        assert [j["job_id"] for j in httpx.get(f"{base}/jobs", headers=hdr, timeout=10).json()] == [job_id]

        # spend counted once: per node, billed intervals never overlap, and they add up to the total
        from sqlalchemy import select

        with db.session() as s:
            rows = s.scalars(select(db.LedgerEntry).where(db.LedgerEntry.job_id == job_id)
                             .order_by(db.LedgerEntry.instance_id, db.LedgerEntry.start)).all()
            nodes = s.scalars(select(db.NodeRecord).where(db.NodeRecord.job_id == job_id)).all()
            intervals = [(r.instance_id, r.start, r.end, r.usd) for r in rows]
            lifetimes = {n.instance_id: (n.launched_at, n.terminated_at) for n in nodes}
        assert intervals and len(lifetimes) == 1 + task["resources"]["nodes"]
        for (a_id, _, a_end, _), (b_id, b_start, _, _) in zip(intervals, intervals[1:]):
            if a_id == b_id:
                assert b_start >= a_end - 1e-6, f"overlapping bills for {a_id}"
        for iid, start, end, _ in intervals:
            launched, ended = lifetimes[iid]
            assert ended is not None, f"{iid} never recorded as ended"
            assert start >= launched - 1e-6 and end <= ended + 1.0 + 1e-6, f"{iid} billed outside its lifetime"
        total = sum(u for *_, u in intervals)
        assert final["cost_usd"] == pytest.approx(total, abs=1e-5)
        report = httpx.get(f"{base}/cost-report", params={"job_id": job_id}, headers=hdr, timeout=10).json()
        assert report["total_usd"] == pytest.approx(total, abs=1e-5)
    finally:
        for p in (second, first):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
        _end_leftovers(job_id)
    wait_for(lambda: marked_pids(home_prefix=str(tmp_path)) == [], 30, "no node process left", poll=1.0)
