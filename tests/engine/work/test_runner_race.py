"""30 job runners failing at the same moment: every job still ends in a final status.

Reproduces issue #17's "16 of 30 racing jobs stuck ``running``" on SQLite: each runner is a real
process (forked, so the 30 start together without paying 30 interpreter start-ups) running
:func:`spotwise.engine.work.jobs.run_job`, the body of ``python -m spotwise.engine.work.runner``. Half fail
inside the orchestrator's run (a spot trace that does not exist: after the job is marked running,
its lease claimed and the teardown run), half before it (a budget below one billing minute). Every
failure path writes the job row, closes bills and settles a budget reservation at once, with all
the others. On both databases.
"""

from __future__ import annotations

import multiprocessing as mp

from sqlalchemy import select

from spotwise.engine.work import budgets, jobs
from spotwise.engine.state import db
from spotwise.taskspec import parse_taskspec

N = 30


def _spec(i: int, tmp_path):
    doc = {"name": f"race{i}", "resources": {"accelerators": "cpu:1", "nodes": 1, "clouds": ["local"], "market": "spot"},
           "training": {"entrypoint": "tiny-gpt", "steps": 10,
                        "checkpoint": {"storage": f"file://{tmp_path}/ckpt", "interval_steps": 5}},
           "budget_usd": 1.0}
    if i % 2:
        doc["budget_usd"] = 0.0001                               # refused by the orchestrator up front
    else:
        doc["local"] = {"trace": str(tmp_path / "no-such-trace.json")}   # fails while provisioning
    return parse_taskspec(doc, source="race")


def _run(job_id: str, barrier) -> None:
    import os

    db._engine.cache_clear()              # a child must not share the parent's connections
    barrier.wait(timeout=120)
    try:
        jobs.run_job(job_id)
    finally:
        os._exit(0)


def test_thirty_runners_failing_at_once_all_settle(database, tmp_path):
    budgets.create_budget("race", cap_usd=100.0, period="total")
    ids = []
    with db.locked_session() as s:
        for i in range(N):
            job = jobs.create_job(s, _spec(i, tmp_path))
            budgets.reserve_in(s, "race", 1.0, job_id=job.id)
            ids.append(job.id)
    db.engine().dispose()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(N)
    procs = [ctx.Process(target=_run, args=(j, barrier)) for j in ids]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    with db.session() as s:
        status = dict(s.execute(select(db.Job.id, db.Job.status)).all())
        reservations = s.scalars(select(db.BudgetReservation)).all()
    stuck = {j: st for j, st in status.items() if st in jobs.LIVE}
    assert not stuck, f"{len(stuck)} of {N} jobs stuck: {stuck}"
    assert set(status.values()) == {"failed"}
    assert len(reservations) == N and all(r.state == "committed" for r in reservations)
    assert all(r.actual_usd <= r.amount_usd for r in reservations)
