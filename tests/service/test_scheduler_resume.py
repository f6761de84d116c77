"""A schedule with ``unfinished: resume``: a fire time continues the previous run when it ended
unfinished and has a committed checkpoint (the same job, its cap what it spent plus the run
budget, reserved against the month), and starts over, saying why, when it cannot (issue 33 item 4:
"The API and schedules can do the same"). On SQLite and PostgreSQL (the ``database`` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_scheduler import Clock, Recorder, finish, ts

from spotwise.errors import InputError
from spotwise.engine.work import budgets, schedules
from spotwise.engine.state import db
from spotwise.service.scheduler import Scheduler


def task(home: Path) -> dict:
    return {"name": "nightly", "resources": {"nodes": 1, "market": "spot", "clouds": ["local"]},
            "training": {"steps": 10, "checkpoint": {"storage": f"file://{home}/ckpt"}}}


def commit_checkpoint(home: Path, job_id: str, step: int) -> None:
    """What the runtime leaves in the run's storage: a step directory with its commit marker."""
    d = home / "ckpt" / job_id / "checkpoints" / f"step_{step:09d}"
    d.mkdir(parents=True)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "kind": "stop", "world_size": 1}))


def job(job_id: str) -> db.Job:
    with db.session() as s:
        return s.get(db.Job, job_id)


def test_an_unfinished_run_is_resumed_then_a_finished_one_or_one_without_checkpoint_starts_over(database, home):
    clock = Clock(ts("2026-03-01T00:00:00"))
    sch = schedules.create_schedule(task(home), cron="0 2 * * *", budget_per_run=0.5, budget_per_month=5.0,
                                    unfinished="resume", now=clock.t)
    assert sch["unfinished"] == "resume"
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    clock.t = ts("2026-03-01T02:00:10")
    [a] = sched.tick()
    finish(a.job_id, "budget_exhausted", spend=0.5)
    commit_checkpoint(home, a.job_id, 4)

    clock.t = ts("2026-03-02T02:00:10")                 # stopped by its budget: continued, not restarted
    [b] = sched.tick()
    assert (b.status, b.job_id) == ("launched", a.job_id)
    assert b.reason == f"resumed job {a.job_id} from step 4 (it was budget_exhausted)"
    assert rec.started == [a.job_id, a.job_id]
    j = job(a.job_id)
    assert j.status == "pending" and j.budget_usd == pytest.approx(1.0)     # spent 0.5 + the run's 0.5
    month = budgets.status(schedules.month_budget_id(sch["id"]), at=clock.t)
    assert (month.spent_usd, month.reserved_usd) == (pytest.approx(0.5), pytest.approx(0.5))

    finish(a.job_id, "succeeded", spend=0.25)
    clock.t = ts("2026-03-03T02:00:10")                 # it succeeded: the next fire time is a new run
    [c] = sched.tick()
    assert c.status == "launched" and c.job_id != a.job_id and c.reason is None

    finish(c.job_id, "lost")                            # lost before any checkpoint: started over
    clock.t = ts("2026-03-04T02:00:10")
    [d] = sched.tick()
    assert d.status == "launched" and d.job_id not in (a.job_id, c.job_id)
    assert d.reason.startswith(f"started over: cannot resume job {c.job_id}: nothing to resume from")

    finish(d.job_id, "failed")                          # a failure of its own is not resumed either
    clock.t = ts("2026-03-05T02:00:10")
    [e] = sched.tick()
    assert e.status == "launched" and e.job_id != d.job_id and e.reason.startswith("started over: ")
    runs = {r["job_id"]: r for r in schedules.runs("nightly")}
    assert runs[d.job_id]["status"] == "finished"


def test_a_resume_the_month_cannot_pay_for_is_refused_not_restarted(database, home):
    clock = Clock(ts("2026-03-01T00:00:00"))
    schedules.create_schedule(task(home), cron="0 2 * * *", budget_per_run=0.6, budget_per_month=1.0,
                              unfinished="resume", now=clock.t)
    rec = Recorder()
    sched = Scheduler(clock=clock, launcher=rec)
    clock.t = ts("2026-03-01T02:00:10")
    [a] = sched.tick()
    finish(a.job_id, "budget_exhausted", spend=0.6)
    commit_checkpoint(home, a.job_id, 4)
    clock.t = ts("2026-03-02T02:00:10")                 # $0.40 left this month, the resume asks $0.60
    [b] = sched.tick()
    assert b.status == "refused" and b.job_id is None and "budget" in b.reason
    assert job(a.job_id).status == "budget_exhausted" and rec.started == [a.job_id]


def test_the_default_restarts_and_a_bad_rule_names_the_field(database, home):
    clock = Clock(ts("2026-03-01T00:00:00"))
    sch = schedules.create_schedule(task(home), cron="0 2 * * *", budget_per_run=0.5, now=clock.t)
    assert sch["unfinished"] == "restart"
    sched = Scheduler(clock=clock, launcher=Recorder())
    clock.t = ts("2026-03-01T02:00:10")
    [a] = sched.tick()
    finish(a.job_id, "budget_exhausted", spend=0.5)
    commit_checkpoint(home, a.job_id, 4)
    clock.t = ts("2026-03-02T02:00:10")
    [b] = sched.tick()
    assert b.status == "launched" and b.job_id != a.job_id
    with pytest.raises(InputError, match="unfinished: got 'continue'"):
        schedules.create_schedule(task(home), cron="0 2 * * *", name="other", unfinished="continue")
    with pytest.raises(InputError, match="unfinished: got 'again'"):
        schedules.update("nightly", unfinished="again")
    assert schedules.update("nightly", unfinished="resume")["unfinished"] == "resume"
