"""Aggregate reads over jobs, events and the ledger, for the dashboard and the Prometheus metrics.

Why here: the service renders these numbers but must not know the schema (the engine owns every
query). Each function reads in one session, so the figures it returns belong together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select

from spotwise.engine.state import db


@dataclass
class Totals:
    """What ``/metrics`` reports from the database at scrape time."""

    jobs_by_status: dict[str, int] = field(default_factory=dict)
    spend_by_cloud_market: dict[tuple[str, str], float] = field(default_factory=dict)   # USD
    preemptions: int = 0
    checkpoint_age_s: dict[str, float] = field(default_factory=dict)   # running job -> seconds


def totals(now: float) -> Totals:
    """Jobs per status, ledger spend per (cloud, market), preemptions over all jobs, and for each
    running job the seconds since its newest checkpoint event (else since it started)."""
    out = Totals()
    with db.session() as s:
        for status, n in s.execute(select(db.Job.status, func.count()).group_by(db.Job.status)):
            out.jobs_by_status[status] = n
        L = db.LedgerEntry
        for cloud, market, usd in s.execute(select(L.cloud, L.market, func.sum(L.usd)).group_by(L.cloud, L.market)):
            out.spend_by_cloud_market[(cloud, market)] = float(usd or 0.0)
        out.preemptions = int(s.scalar(select(func.count()).select_from(db.Event)
                                       .where(db.Event.kind == "preempted")) or 0)
        for j in s.scalars(select(db.Job).where(db.Job.status == "running")):
            last = s.scalar(select(func.max(db.Event.t)).where(db.Event.job_id == j.id,
                                                               db.Event.kind.like("%checkpoint%")))
            ref = last or j.started_at or j.created_at
            out.checkpoint_age_s[j.id] = max(0.0, now - ref)
    return out


@dataclass(frozen=True)
class JobLine:
    """A job as the dashboard lists it (raw times and unrounded spend: the page formats them)."""

    job_id: str
    status: str
    spend_usd: float
    budget_usd: float | None
    steps_completed: int
    preemptions: int
    created_at: float


def recent_jobs(limit: int) -> list[JobLine]:
    """The newest ``limit`` jobs with their ledger spend (one aggregate query for all of them)."""
    with db.session() as s:
        jobs = s.scalars(select(db.Job).order_by(db.Job.created_at.desc()).limit(limit)).all()
        spend = db.jobs_spend(s, [j.id for j in jobs])
        return [JobLine(j.id, j.status, spend[j.id], j.budget_usd, j.steps_completed, j.preemptions, j.created_at)
                for j in jobs]


def spend_series() -> list[tuple[float, float]]:
    """(time, cumulative USD) at the end of every ledger row, oldest first."""
    with db.session() as s:
        rows = s.execute(select(db.LedgerEntry.end, db.LedgerEntry.usd).order_by(db.LedgerEntry.end)).all()
    out, total = [], 0.0
    for end, usd in rows:
        total += usd
        out.append((end, total))
    return out
