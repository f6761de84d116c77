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

Speed (issue 49): each point also carries ``tokens_per_s``, ``mfu`` and ``peak_memory_bytes`` as
the run's speed figures had them then (:func:`spotwise.engine.run.views.speed`; ``None`` where
training could not say: a user spec without ``tokens_per_step``, no MFU on CPU), so a slowdown is
on the same time axis as the spend; ``/metrics`` exports the newest.

Held-out losses (``training.eval``): each ``{step, loss}`` the control actor's snapshot lists is
stored once as an ``eval`` event of the job (``detail``: step, loss) when the recorder first sees
it; :func:`curves` returns them as ``eval_loss`` (one per step, the newest measurement of a step
winning: a resumed run measures again), and ``/metrics`` the newest as ``spotwise_job_eval_loss``.

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
#: a point's speed figures (columns of ``curve_points``, keys of :func:`spotwise.engine.run.views.speed`)
SPEED = ("tokens_per_s", "mfu", "peak_memory_bytes")
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
        self._last: tuple | None = None
        self._evals: set[tuple[int, float | None]] = set()

    def record_evals(self, now: float, snapshot: dict | None) -> int:
        """Store the snapshot's held-out losses not stored yet (an ``eval`` event each); how many."""
        new = [(int(e["step"]), _finite(e.get("loss"))) for e in (snapshot or {}).get("eval_loss") or []
               if isinstance(e, dict) and isinstance(e.get("step"), int)]
        new = [e for e in new if e not in self._evals]
        if not new:
            return 0
        try:
            with db.session() as s:
                for step, loss in new:
                    s.add(db.Event(job_id=self.job_id, t=round(now, 3), kind="eval", detail={"step": step, "loss": loss}))
                s.commit()
        except Exception:  # noqa: BLE001 - like a curve point: never fatal
            log.exception("could not record the held-out losses of %s", self.job_id)
            return 0
        self._evals.update(new)
        return len(new)

    def sample(self, now: float, snapshot: dict | None, spend_usd: float, *, final: bool = False,
               speed: dict | None = None) -> bool:
        """Record ``(step, loss, spend)`` and ``speed`` (``tokens_per_s``, ``mfu``,
        ``peak_memory_bytes``) if :data:`EVERY_S` has passed since the last point and one of them
        changed, or unconditionally with ``final`` (if anything changed). Whether a point was written."""
        snap = snapshot or {}
        self.record_evals(now, snap)
        step = snap.get("step")
        fast = speed or {}
        point = (int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None,
                 _finite(snap.get("loss")), round(float(spend_usd), 9),
                 *(_finite(fast.get(k)) for k in SPEED))
        if point == self._last:
            return False
        if not final and self._last_t is not None and now - self._last_t < self.every_s:
            return False
        try:
            with db.session() as s:
                s.add(db.CurvePoint(job_id=self.job_id, t=round(now, 3), step=point[0], loss=point[1],
                                    spend_usd=point[2], **dict(zip(SPEED, point[3:]))))
                s.commit()
        except Exception:  # noqa: BLE001 - a curve point we could not store must not stop the run
            log.exception("could not record a curve point of %s", self.job_id)
            return False
        self._last_t, self._last = now, point
        return True


def curves(job_id: str) -> dict[str, Any]:
    """The job's curves: ``points`` (oldest first: ``t``, ``step``, ``loss``, ``spend_usd``,
    ``tokens_per_s``, ``mfu``, ``peak_memory_bytes``),
    ``eval_loss`` (``step``, ``loss``, ``t``: the held-out losses, by step),
    ``budget_usd`` (the job's cap, or ``None``) and ``marks`` (``t``, ``kind``, ``label``,
    ``step``: the step reached then, or ``None`` before the first report)."""
    with db.session() as s:
        job = s.get(db.Job, job_id)
        rows = s.scalars(select(db.CurvePoint).where(db.CurvePoint.job_id == job_id)
                         .order_by(db.CurvePoint.t, db.CurvePoint.id)).all()
        points = [_point(r) for r in rows]
        evs = s.scalars(select(db.Event).where(db.Event.job_id == job_id, db.Event.kind.in_(list(MARKS)))
                        .order_by(db.Event.t, db.Event.id)).all()
        marks = [{"t": e.t, "kind": e.kind, "label": MARKS[e.kind], "step": step_at(points, e.t)} for e in evs]
        budget = job.budget_usd if job is not None else None
        evals = _eval_points(s.scalars(select(db.Event).where(db.Event.job_id == job_id, db.Event.kind == "eval")
                                       .order_by(db.Event.t, db.Event.id)).all())
    return {"job_id": job_id, "budget_usd": budget, "points": points, "marks": marks, "eval_loss": evals}


def _eval_points(events) -> list[dict[str, Any]]:
    """``eval`` events as ``[{step, loss, t}]`` by step, a step's newest measurement winning."""
    by_step: dict[int, dict[str, Any]] = {}
    for e in events:
        d = e.detail or {}
        if isinstance(d.get("step"), int):
            by_step[d["step"]] = {"step": d["step"], "loss": _finite(d.get("loss")), "t": e.t}
    return [by_step[k] for k in sorted(by_step)]


def latest_eval(job_ids: list[str]) -> dict[str, float]:
    """Each job's newest finite held-out loss (jobs without one are absent), for ``/metrics``."""
    if not job_ids:
        return {}
    out: dict[str, float] = {}
    with db.session() as s:
        for e in s.scalars(select(db.Event).where(db.Event.job_id.in_(job_ids), db.Event.kind == "eval")
                           .order_by(db.Event.t, db.Event.id)):
            loss = _finite((e.detail or {}).get("loss"))
            if loss is not None:
                out[e.job_id] = loss
    return out


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
    """Each job's newest point (as :func:`curves` lists them); jobs without one are absent.
    For ``/metrics``, which exports it per running job."""
    if not job_ids:
        return {}
    with db.session() as s:
        newest = (select(db.CurvePoint.job_id, func.max(db.CurvePoint.id).label("id"))
                  .where(db.CurvePoint.job_id.in_(job_ids)).group_by(db.CurvePoint.job_id).subquery())
        rows = s.scalars(select(db.CurvePoint).join(newest, db.CurvePoint.id == newest.c.id)).all()
        return {r.job_id: _point(r) for r in rows}


def _point(r: db.CurvePoint) -> dict[str, Any]:
    return {"t": r.t, "step": r.step, "loss": r.loss, "spend_usd": r.spend_usd,
            **{k: getattr(r, k) for k in SPEED}}

