"""How the engine's rows read as plain dicts: one shape per row, shared by the CLI and the API.

Why here: ``spotwise status`` and ``GET /api/v1/jobs`` used to build their own job dicts (with
different keys); a field added to a job now shows up in both. Times are ISO-8601 UTC strings
(:func:`spotwise.utils.timefmt.iso_utc_or_none`), money is rounded to micro-dollars as the ledger's reports are.
"""

from __future__ import annotations

from typing import Any

from spotwise.engine.state import db
from spotwise.utils.timefmt import iso_utc_or_none as iso_utc


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
