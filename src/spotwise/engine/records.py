"""How the engine's rows read as plain dicts: one shape per row, shared by the CLI and the API.

Why here: ``spotwise status`` and ``GET /api/v1/jobs`` used to build their own job dicts (with
different keys); a field added to a job now shows up in both. Times are ISO-8601 UTC strings
(:func:`iso_utc`), money is rounded to micro-dollars as the ledger's reports are.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from spotwise.engine import db


def iso_utc(t: float | None) -> str | None:
    """``2026-11-25T12:00:00Z`` for a Unix time; None for None or 0 (a time not reached yet)."""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if t else None


def job_dict(j: db.Job, spend: float) -> dict[str, Any]:
    """A job as the CLI and the API show it; ``spend`` is its ledger spend (``db.jobs_spend``)."""
    return {"job_id": j.id, "name": j.name, "status": j.status, "cloud": j.cloud, "cluster_id": j.cluster_id,
            "budget_usd": j.budget_usd, "cost_usd": round(spend, 6), "deadline_hours": j.deadline_hours,
            "steps_completed": j.steps_completed, "preemptions": j.preemptions, "resumes": j.resumes,
            "created_at": iso_utc(j.created_at), "started_at": iso_utc(j.started_at),
            "finished_at": iso_utc(j.finished_at), "final_checkpoint": j.final_checkpoint,
            "model_sha256": j.model_sha256, "message": j.message}


def event_dict(e: db.Event) -> dict[str, Any]:
    """An event: its id (for ``after_id`` paging), Unix time ``t``, ``event`` kind, then its detail."""
    return {"id": e.id, "t": e.t, "event": e.kind, **(e.detail or {})}
