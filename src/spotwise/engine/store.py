"""Queries other packages need about jobs, without knowing the schema."""

from __future__ import annotations

from sqlalchemy import select

from spotwise.engine import db

LIVE_STATUSES = ("pending", "running")


def live_cluster_ids() -> set[str]:
    """Clusters owned by a job that is still pending or running (``spotwise gc`` spares these)."""
    with db.session() as s:
        rows = s.scalars(select(db.Job.cluster_id).where(db.Job.status.in_(LIVE_STATUSES)))
        return {r for r in rows if r}


def dead_jobs(now: float | None = None) -> list[tuple[db.Job, str]]:
    """Pending/running jobs whose owner is dead (:func:`spotwise.engine.lease.owner_state`), with why."""
    from spotwise.engine.lease import owner_state

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
