"""The scheduler with a moved clock: due runs, no overlap, budgets, catch-up, restarts."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import pytest

from spotwise.errors import InputError
from spotwise.engine.work import budgets, jobs, schedules
from spotwise.engine.state import db
from spotwise.service.scheduler import Scheduler

TASK = {"name": "nightly", "resources": {"nodes": 1, "market": "spot"}, "training": {"steps": 10}}


def ts(s: str) -> float:
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Recorder:
    """A launcher that records job ids instead of starting processes."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def __call__(self, job_id: str) -> None:
        self.started.append(job_id)


def finish(job_id: str, status: str = "succeeded", spend: float = 0.0) -> None:
    """What the runner records when a job ends: its status and its ledger rows."""
    with db.session() as s:
        j = s.get(db.Job, job_id)
        j.status, j.finished_at = status, time.time()
        if spend:
            s.add(db.LedgerEntry(job_id=job_id, instance_id="i-1", cloud="local", market="spot", start=0, end=1,
                                 seconds=1, usd_per_hour=spend * 3600, usd=spend, price_source="t", price_as_of="t"))
        s.commit()


def runs_by_status(name):
    out: dict[str, int] = {}
    for r in schedules.runs(name):
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def test_due_runs_launch_once_with_the_run_budget(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    schedules.create_schedule(TASK, cron="0 2 * * *", budget_per_run=0.5, now=clock.t)
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    assert sched.tick() == []                        # 00:00: nothing due
    clock.t = ts("2026-03-01T02:00:30")
    [a] = sched.tick()
    assert a.status == "launched" and rec.started == [a.job_id]
    assert sched.tick() == []                        # same fire time: never twice
    with db.session() as s:
        job = s.get(db.Job, a.job_id)
        assert job.status == "pending" and job.budget_usd == 0.5 and job.spec["budget_usd"] == 0.5


def test_timezone_and_next_run(database):
    clock = Clock(ts("2026-07-01T00:00:00"))
    sch = schedules.create_schedule(TASK, cron="0 2 * * *", timezone="Europe/Berlin", now=clock.t)
    assert sch["next_run_at"] == "2026-07-01T00:00:00Z" or sch["next_run_at"] == "2026-07-02T00:00:00Z"
    # 02:00 in Berlin (CEST, UTC+2) is 00:00 UTC; created exactly at 00:00 UTC, so the next is tomorrow's
    assert sch["next_run_at"] == "2026-07-02T00:00:00Z"


def test_no_overlap_skip_and_queue(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    schedules.create_schedule(TASK, cron="0 * * * *", name="skipper", now=clock.t)
    schedules.create_schedule(dict(TASK, name="queuer"), cron="0 * * * *", name="queuer", overlap="queue", now=clock.t)
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    clock.t = ts("2026-03-01T01:00:00")
    first = {a.schedule: a for a in sched.tick()}
    assert {a.status for a in first.values()} == {"launched"}
    clock.t = ts("2026-03-01T02:00:00")
    second = {a.schedule: a for a in sched.tick()}
    assert second["skipper"].status == "skipped" and "overlap=skip" in second["skipper"].reason
    assert second["queuer"].status == "queued"
    clock.t = ts("2026-03-01T03:00:00")
    third = {a.schedule: a for a in sched.tick()}
    assert third["queuer"].status == "skipped" and "already queued" in third["queuer"].reason
    finish(first["queuer"].job_id)
    finish(first["skipper"].job_id)
    clock.t = ts("2026-03-01T03:10:00")
    after = sched.tick()
    assert [(a.schedule, a.status) for a in after] == [("queuer", "launched")]   # the queued run starts
    assert len(rec.started) == 3
    assert runs_by_status("skipper") == {"finished": 1, "skipped": 2}   # 02:00 and 03:00


def test_month_budget_refuses_with_reason_and_settles_from_ledger(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    sch = schedules.create_schedule(TASK, cron="0 * * * *", budget_per_run=0.4, budget_per_month=1.0, now=clock.t)
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    for hour, spend in ((1, 0.3), (2, 0.4)):
        clock.t = ts(f"2026-03-01T0{hour}:00:00")
        [a] = sched.tick()
        assert a.status == "launched"
        finish(a.job_id, spend=spend)
    clock.t = ts("2026-03-01T03:00:00")
    acts = sched.tick()                                   # 0.7 spent: 0.4 more would make 1.1 > 1.0
    assert [a.status for a in acts] == ["refused"]
    assert "would break the monthly budget" in acts[0].reason
    st = budgets.status(schedules.month_budget_id(sch["id"]), at=clock.t)
    assert st.spent_usd == pytest.approx(0.7) and st.reserved_usd == 0
    clock.t = ts("2026-04-01T00:00:00")                   # a new month: runs again (after the catch-up skip)
    assert [a.status for a in sched.tick()] == ["skipped", "launched"]
    assert runs_by_status(sch["name"]) == {"finished": 2, "refused": 1, "skipped": 1, "launched": 1}


def test_catch_up_runs_at_most_one_after_downtime(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    schedules.create_schedule(TASK, cron="*/10 * * * *", now=clock.t)
    rec = Recorder()
    clock.t = ts("2026-03-01T05:05:00")                   # down for 5 hours: 30 fire times passed
    acts = Scheduler(clock=clock, launcher=rec).tick()
    assert [a.status for a in acts] == ["skipped", "launched"]
    assert acts[0].reason.startswith("29 fire time(s) passed")
    assert acts[1].fire_at == ts("2026-03-01T05:00:00")
    assert len(rec.started) == 1


def test_restart_never_double_launches(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    schedules.create_schedule(TASK, cron="0 2 * * *", now=clock.t)
    clock.t = ts("2026-03-01T02:00:05")
    rec1, rec2 = Recorder(), Recorder()
    assert len(Scheduler(clock=clock, launcher=rec1).tick()) == 1
    # a second scheduler (a restart, or a second server on the same database) at the same time
    assert Scheduler(clock=clock, launcher=rec2).tick() == []
    assert len(rec1.started) == 1 and rec2.started == []


def test_paused_schedule_does_not_run_and_resume_does_not_catch_up(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    schedules.create_schedule(TASK, cron="0 * * * *", name="p", now=clock.t)
    schedules.set_paused("p", True, now=clock.t)
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    clock.t = ts("2026-03-01T05:30:00")
    assert sched.tick() == []
    schedules.set_paused("p", False, now=clock.t)
    assert sched.tick() == []
    clock.t = ts("2026-03-01T06:00:00")
    assert [a.status for a in sched.tick()] == ["launched"]


def test_launch_failure_marks_job_failed_and_frees_budget(database):
    clock = Clock(ts("2026-03-01T00:00:00"))
    sch = schedules.create_schedule(TASK, cron="0 * * * *", budget_per_run=0.5, budget_per_month=0.5, now=clock.t)

    def broken(job_id):
        raise OSError("no such interpreter")

    clock.t = ts("2026-03-01T01:00:00")
    [a] = Scheduler(clock=clock, launcher=broken).tick()
    with db.session() as s:
        assert s.get(db.Job, a.job_id).status == "failed"
    assert budgets.status(schedules.month_budget_id(sch["id"]), at=clock.t).remaining_usd == pytest.approx(0.5)


def test_schedule_input_errors_name_the_field(database):
    with pytest.raises(InputError, match="cron: got 'every night'"):
        schedules.create_schedule(TASK, cron="every night")
    with pytest.raises(InputError, match="timezone: got 'Berlin'"):
        schedules.create_schedule(TASK, cron="0 2 * * *", timezone="Berlin")
    with pytest.raises(InputError, match="budget_per_run: got -2"):
        schedules.create_schedule(TASK, cron="0 2 * * *", budget_per_run=-2)
    with pytest.raises(InputError, match="overlap: got 'both'"):
        schedules.create_schedule(TASK, cron="0 2 * * *", overlap="both")
    schedules.create_schedule(TASK, cron="0 2 * * *")
    with pytest.raises(InputError, match="name: got 'nightly'"):
        schedules.create_schedule(TASK, cron="0 3 * * *")


def test_reconcile_marks_dead_owner_lost_and_bills_once(database):
    with db.session() as s:
        s.add(db.Job(id="dead", name="d", status="running", cloud="local", cluster_id="swdeadbeef00", spec={},
                     created_at=time.time(), owner_pid=2 ** 22 + 12345, budget_usd=1.0))
        now = time.time()
        s.add(db.NodeRecord(instance_id="swdeadbeef00-worker-1", job_id="dead", cluster_id="swdeadbeef00",
                            cloud="local", instance_type="local.cpu", region="local", zone="local-a", market="spot",
                            role="worker", usd_per_hour=3.6, price_source="t", price_as_of="t",
                            launched_at=now - 10, billed_until=now - 10))
        s.commit()
    out = jobs.reconcile(now=now)
    assert [o["job_id"] for o in out] == ["dead"] and out[0]["billed_usd"] == pytest.approx(0.01)
    assert jobs.reconcile(now=now + 100) == []           # once only
    with db.session() as s:
        assert s.get(db.Job, "dead").status == "lost"
        assert db.job_spend(s, "dead") == pytest.approx(0.01)


def test_reconcile_leaves_a_job_whose_runner_is_alive_alone(database):
    """What a restarted server relies on (tests/e2e/test_serve_restart.py proves it end to end on
    PostgreSQL): a running job whose runner is alive on this host is not reconciled, on either
    database."""
    from spotwise.engine.state.lease import host_id, process_started

    me = os.getpid()
    with db.session() as s:
        s.add(db.Job(id="live", name="l", status="running", cloud="local", cluster_id="swlive0000000", spec={},
                     created_at=time.time(), owner_pid=me, owner_host=host_id(), owner_started=process_started(me),
                     lease_expires_at=time.time() + 60, budget_usd=1.0))
        s.commit()
    assert jobs.reconcile() == []
    with db.session() as s:
        assert s.get(db.Job, "live").status == "running"


def test_a_user_code_schedule_runs_only_while_the_server_serves_user_code(database, monkeypatch):
    """Made while the server served user code, it is refused (with the reason) once it does not."""
    clock = Clock(ts("2026-03-01T00:00:00"))
    task = {"name": "mine", "workdir": "s3://bucket/code.zip", "training": {"entrypoint": "pkg.mod:make_spec"}}
    schedules.create_schedule(task, cron="0 * * * *", budget_per_run=0.5, now=clock.t)
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    monkeypatch.setenv("SPOTWISE_SERVE_USER_CODE", "1")
    clock.t = ts("2026-03-01T01:00:00")
    [a] = sched.tick()
    assert a.status == "launched"
    finish(a.job_id)
    monkeypatch.delenv("SPOTWISE_SERVE_USER_CODE")
    clock.t = ts("2026-03-01T02:00:00")
    [a] = sched.tick()
    assert a.status == "refused" and "task.training.entrypoint, task.workdir" in a.reason
    assert "SPOTWISE_SERVE_USER_CODE" in a.reason and len(rec.started) == 1
