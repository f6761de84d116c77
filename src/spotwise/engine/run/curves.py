"""A run's curves: loss against step, spend against time, and the moments that explain their shape.

Written as the run goes (:class:`CurveRecorder`, called on the orchestrator's monitor tick) and
read by ``spotwise status JOB --plot``, the HTTP API (``GET /api/v1/jobs/{id}/curves``) and the
dashboard's job page (:func:`curves`), so the three show the same series.

Sampling: at most one point every :data:`EVERY_S` seconds while something changed (the step, the
loss or the spend), plus a last point when the run ends. Ten seconds keeps a day-long run at a few
thousand rows, and is finer than anything a person reads off a plot; the step and loss are what
training last reported (rank 0's), so the loss curve is the reported losses at those moments, not
every step's. A loss that is not finite is stored as ``None`` (JSON has no NaN; the plot shows a
gap), and a sample that cannot be written is logged, never fatal: a curve must not stop a run.

Marks: preemptions and lost nodes, moves between markets, migrations, the budget's stops and resumes, from
the job's events; each carries the step training had reached then (the last sample at or before
it), so it can be drawn on both curves.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy import func, select

from spotwise.engine.state import db

log = logging.getLogger("spotwise.orchestrator")

EVERY_S = 10.0
#: event kind -> the label a plot and the dashboard show at that moment
MARKS = {"preempted": "preempted", "lost": "node lost", "move": "market move", "migrated": "migrated",
         "budget_stop_requested": "budget stop", "budget_hard_stop": "budget hard stop", "resumed": "resumed"}


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


class CurveRecorder:
    """Samples one job's step, loss and spend into ``curve_points``."""

    def __init__(self, job_id: str, every_s: float = EVERY_S) -> None:
        self.job_id = job_id
        self.every_s = every_s
        self._last_t: float | None = None
        self._last: tuple[int | None, float | None, float] | None = None

    def sample(self, now: float, snapshot: dict | None, spend_usd: float, *, final: bool = False) -> bool:
        """Record ``(step, loss, spend)`` if :data:`EVERY_S` has passed since the last point and one
        of them changed, or unconditionally with ``final`` (if anything changed). Whether a point
        was written."""
        snap = snapshot or {}
        step = snap.get("step")
        point = (int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None,
                 _finite(snap.get("loss")), round(float(spend_usd), 9))
        if point == self._last:
            return False
        if not final and self._last_t is not None and now - self._last_t < self.every_s:
            return False
        try:
            with db.session() as s:
                s.add(db.CurvePoint(job_id=self.job_id, t=round(now, 3), step=point[0], loss=point[1],
                                    spend_usd=point[2]))
                s.commit()
        except Exception:  # noqa: BLE001 - a curve point we could not store must not stop the run
            log.exception("could not record a curve point of %s", self.job_id)
            return False
        self._last_t, self._last = now, point
        return True


def curves(job_id: str) -> dict[str, Any]:
    """The job's curves: ``points`` (oldest first: ``t``, ``step``, ``loss``, ``spend_usd``),
    ``budget_usd`` (the job's cap, or ``None``) and ``marks`` (``t``, ``kind``, ``label``,
    ``step``: the step reached then, or ``None`` before the first report)."""
    with db.session() as s:
        job = s.get(db.Job, job_id)
        rows = s.scalars(select(db.CurvePoint).where(db.CurvePoint.job_id == job_id)
                         .order_by(db.CurvePoint.t, db.CurvePoint.id)).all()
        points = [{"t": r.t, "step": r.step, "loss": r.loss, "spend_usd": r.spend_usd} for r in rows]
        evs = s.scalars(select(db.Event).where(db.Event.job_id == job_id, db.Event.kind.in_(list(MARKS)))
                        .order_by(db.Event.t, db.Event.id)).all()
        marks = [{"t": e.t, "kind": e.kind, "label": MARKS[e.kind], "step": step_at(points, e.t)} for e in evs]
        budget = job.budget_usd if job is not None else None
    return {"job_id": job_id, "budget_usd": budget, "points": points, "marks": marks}


def step_at(points: list[dict], t: float) -> int | None:
    """The step of the last point at or before ``t`` (``None`` when none had one)."""
    step = None
    for p in points:
        if p["t"] > t:
            break
        if p["step"] is not None:
            step = p["step"]
    return step


def latest(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each job's newest point (``step``, ``loss``, ``spend_usd``, ``t``); jobs without one are absent.
    For ``/metrics``, which exports it per running job."""
    if not job_ids:
        return {}
    with db.session() as s:
        newest = (select(db.CurvePoint.job_id, func.max(db.CurvePoint.id).label("id"))
                  .where(db.CurvePoint.job_id.in_(job_ids)).group_by(db.CurvePoint.job_id).subquery())
        rows = s.scalars(select(db.CurvePoint).join(newest, db.CurvePoint.id == newest.c.id)).all()
        return {r.job_id: {"t": r.t, "step": r.step, "loss": r.loss, "spend_usd": r.spend_usd} for r in rows}

