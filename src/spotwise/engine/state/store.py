"""Queries other packages need about jobs, without knowing the schema.

The CLI's commands and the API's routes ask these (and the shapes of :mod:`spotwise.engine.state.records`)
instead of running SQL of their own, so both read a job the same way.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from spotwise.engine.state import db
from spotwise.engine.state.records import event_dict, job_dict

LIVE_STATUSES = ("pending", "running")


def job_exists(job_id: str) -> bool:
    with db.session() as s:
        return s.get(db.Job, job_id) is not None


def list_jobs(*, limit: int, status: str | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` jobs (only those in ``status`` when given), as :func:`job_dict`, with
    their spend from one aggregate query."""
    with db.session() as s:
        q = select(db.Job).order_by(db.Job.created_at.desc()).limit(limit)
        if status:
            q = q.where(db.Job.status == status)
        rows = list(s.scalars(q))
        spend = db.jobs_spend(s, [j.id for j in rows])
        return [job_dict(j, spend[j.id]) for j in rows]


def get_job(job_id: str, *, with_report: bool = False) -> dict[str, Any] | None:
    """One job as :func:`job_dict` (plus its run ``report`` when asked), or None when there is none."""
    with db.session() as s:
        j = s.get(db.Job, job_id)
        if j is None:
            return None
        d = job_dict(j, db.job_spend(s, j.id))
        if with_report:
            d["report"] = j.report
        return d


def job_events(job_id: str, *, after_id: int = 0) -> list[dict[str, Any]]:
    """The job's events after ``after_id``, oldest first, as :func:`event_dict`."""
    with db.session() as s:
        evs = s.scalars(select(db.Event).where(db.Event.job_id == job_id, db.Event.id > after_id)
                        .order_by(db.Event.id)).all()
        return [event_dict(e) for e in evs]


def live_cluster_ids() -> set[str]:
    """Clusters owned by a job that is still pending or running (``spotwise gc`` spares these)."""
    with db.session() as s:
        rows = s.scalars(select(db.Job.cluster_id).where(db.Job.status.in_(LIVE_STATUSES)))
        return {r for r in rows if r}


def dead_jobs(now: float | None = None) -> list[tuple[db.Job, str]]:
    """Pending/running jobs whose owner is dead (:func:`spotwise.engine.state.lease.owner_state`), with why."""
    from spotwise.engine.state.lease import owner_state

    with db.session() as s:
        jobs = s.scalars(select(db.Job).where(db.Job.status.in_(LIVE_STATUSES))).all()
    out = []
    for j in jobs:
        state, why = owner_state(j, now)
        if state == "dead":
            out.append((j, why))
    return out


def record_cluster(cluster_id: str, *, name: str, cloud: str, spec: dict) -> None:
    """A cluster provisioned by ``spotwise up`` is owned by a pseudo-job of the same id, status
    ``running`` until ``spotwise down``; so ``spotwise gc`` never ends a cluster a user brought up
    on purpose, yet one whose ``up`` crashed half-way is recorded and can be found."""
    import time

    with db.session() as s:
        if s.get(db.Job, cluster_id) is None:
            s.add(db.Job(id=cluster_id, name=name, status="running", cloud=cloud, cluster_id=cluster_id,
                         spec=spec, created_at=time.time(), started_at=time.time(),
                         message="cluster provisioned with `spotwise up`"))
            s.commit()


def end_cluster(cluster_id: str, status: str = "terminated", message: str | None = None) -> None:
    """Mark the pseudo-job of an ``up`` cluster ended (no-op for ids that are not such a job)."""
    import time

    with db.session() as s:
        job = s.get(db.Job, cluster_id)
        if job is not None and job.cluster_id == cluster_id and job.status in LIVE_STATUSES:
            job.status = status
            job.finished_at = time.time()
            if message:
                job.message = message
            s.commit()
