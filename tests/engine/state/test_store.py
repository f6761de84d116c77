"""The engine's job queries and row shapes, shared by ``spotwise status`` and the API."""

from __future__ import annotations

import pytest

TASK = {"name": "store-run", "resources": {"nodes": 1, "market": "spot"}, "training": {"steps": 10}}
JOB_KEYS = {"job_id", "name", "status", "cloud", "cluster_id", "budget_usd", "cost_usd", "deadline_hours",
            "steps_completed", "preemptions", "resumes", "created_at", "started_at", "finished_at",
            "final_checkpoint", "model_sha256", "message"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    return tmp_path


def _spend(job_id: str, usd: float) -> None:
    from spotwise.engine.state import db

    with db.session() as s:
        s.add(db.LedgerEntry(job_id=job_id, instance_id="i-1", cloud="local", market="spot", start=0.0, end=10.0,
                             seconds=10, usd_per_hour=usd * 360, usd=usd, price_source="sheet",
                             price_as_of="2026-11-22"))
        s.add(db.Event(job_id=job_id, t=1_700_000_000.0, kind="launched", detail={"instance_id": "i-1"}))
        s.commit()


def test_iso_utc():
    from spotwise.engine.state.records import iso_utc

    assert iso_utc(0) is None and iso_utc(None) is None
    assert iso_utc(1_700_000_000.0) == "2023-11-14T22:13:20Z"


def test_jobs_read_the_same_in_list_and_detail(home):
    from spotwise.engine.work import jobs
    from spotwise.engine.state import store

    spec = jobs.spec_with(TASK, budget_usd=2.0, deadline_hours=3.0)
    job_id = jobs.submit(spec)
    _spend(job_id, 0.25)
    assert store.job_exists(job_id) and not store.job_exists("nope")
    [row] = store.list_jobs(limit=10)
    assert set(row) == JOB_KEYS
    assert row["job_id"] == job_id and row["status"] == "pending" and row["cost_usd"] == 0.25
    assert row["budget_usd"] == 2.0 and row["deadline_hours"] == 3.0 and row["started_at"] is None
    assert row["created_at"].endswith("Z")
    assert store.list_jobs(limit=10, status="running") == []
    one = store.get_job(job_id, with_report=True)
    assert one is not None and set(one) == JOB_KEYS | {"report"} and one["report"] is None
    assert store.get_job(job_id) == row and store.get_job("nope") is None
    [ev] = store.job_events(job_id)
    assert ev == {"id": ev["id"], "t": 1_700_000_000.0, "event": "launched", "instance_id": "i-1"}
    assert store.job_events(job_id, after_id=ev["id"]) == []


def test_submit_reserves_the_cap_with_the_job(home):
    from spotwise.engine.work import budgets, jobs
    from spotwise.errors import InputError

    budgets.create_budget("team", cap_usd=1.0)
    assert budgets.exists("team") and not budgets.exists("other")
    job_id = jobs.submit(jobs.spec_with(TASK, budget_usd=0.6), budget_id="team")
    assert budgets.status("team").reserved_usd == pytest.approx(0.6)
    with pytest.raises(budgets.BudgetExceeded):
        jobs.submit(jobs.spec_with(TASK, budget_usd=0.6), budget_id="team")
    with pytest.raises(InputError, match="budget_usd"):
        jobs.submit(jobs.spec_with(TASK), budget_id="team")
    from spotwise.engine.state import store

    assert [r["job_id"] for r in store.list_jobs(limit=10)] == [job_id]   # the refused launch recorded nothing


def test_log_tail(home):
    from spotwise.engine.work import jobs

    assert jobs.log_tail("j1", 5) == []
    jobs.log_path("j1").parent.mkdir(parents=True)
    jobs.log_path("j1").write_text("".join(f"line {i}\n" for i in range(10)))
    assert jobs.log_tail("j1", 2) == ["line 8", "line 9"]


def test_schedule_exists_and_describe(home):
    from spotwise.engine.work import schedules

    d = schedules.create_schedule(TASK, cron="0 2 * * *", name="nightly")
    assert schedules.exists("nightly") and schedules.exists(d["id"]) and not schedules.exists("daily")
    got = schedules.describe("nightly")
    assert got["id"] == d["id"] and got["runs"] == []


def test_status_command_shows_the_engine_job_dict(home):
    """``spotwise status`` prints the engine's dicts: the same keys as ``GET /api/v1/jobs``."""
    import json
    import os
    import subprocess
    import sys

    from spotwise.engine.work import jobs

    job_id = jobs.submit(jobs.spec_with(TASK))
    _spend(job_id, 0.25)
    env = dict(os.environ, SPOTWISE_HOME=str(home))

    def status(*args):
        out = subprocess.run([sys.executable, "-m", "spotwise.cli", "status", *args, "--format", "json"],
                             capture_output=True, text=True, env=env, timeout=120, check=True).stdout
        return json.loads(out)

    [row] = status()
    assert set(row) == JOB_KEYS and row["cost_usd"] == 0.25
    one = status(job_id)
    assert set(one) == JOB_KEYS | {"events"}
    assert one["events"][0]["t"] == "2023-11-14T22:13:20Z" and one["events"][0]["event"] == "launched"


def test_reports_for_the_dashboard_and_metrics(home):
    import time

    from spotwise.engine.state import db, reports
    from spotwise.engine.work import jobs

    job_id = jobs.submit(jobs.spec_with(TASK, budget_usd=2.0))
    _spend(job_id, 0.25)
    _spend(job_id, 0.5)
    with db.session() as s:
        s.get(db.Job, job_id).status = "running"
        s.add(db.Event(job_id=job_id, t=1000.0, kind="preempted", detail={}))
        s.add(db.Event(job_id=job_id, t=2000.0, kind="checkpoint_saved", detail={}))
        s.commit()
    t = reports.totals(now=2500.0)
    assert t.jobs_by_status == {"running": 1} and t.preemptions == 1
    assert t.spend_by_cloud_market == {("local", "spot"): pytest.approx(0.75)}
    assert t.checkpoint_age_s == {job_id: 500.0}
    [line] = reports.recent_jobs(5)
    assert line.job_id == job_id and line.spend_usd == pytest.approx(0.75) and line.budget_usd == 2.0
    assert line.created_at <= time.time()
    assert [round(v, 6) for _, v in reports.spend_series()] == [0.25, 0.75]
