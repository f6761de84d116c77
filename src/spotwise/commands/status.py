"""``spotwise status [JOB_ID]``: jobs and their state, from the database."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_kv, print_table
from spotwise.utils.timefmt import iso_utc_or_none as _ts


def job_row(job, spend: float) -> dict:
    return {"job_id": job.id, "name": job.name, "status": job.status, "cloud": job.cloud,
            "cluster_id": job.cluster_id, "steps_completed": job.steps_completed,
            "preemptions": job.preemptions, "resumes": job.resumes, "cost_usd": round(spend, 6),
            "budget_usd": job.budget_usd, "created_at": _ts(job.created_at),
            "finished_at": _ts(job.finished_at), "final_checkpoint": job.final_checkpoint,
            "model_sha256": job.model_sha256, "message": job.message}


@COMMANDS.register("status")
def register(app: typer.Typer) -> None:
    @app.command("status", help="Show jobs (newest first), or one job in detail.")
    def status(
        job_id: Optional[str] = typer.Argument(None, help="a job id (default: all jobs)"),
        limit: int = typer.Option(20, "--limit", min=1, help="how many jobs to list"),
        fmt: Format = format_option(),
    ) -> None:
        from sqlalchemy import select

        from spotwise.errors import InputError, Problem
        from spotwise.engine import db

        with db.session() as s:
            if job_id:
                job = s.get(db.Job, job_id)
                if job is None:
                    raise InputError(Problem("JOB_ID", job_id, "the id of a job shown by `spotwise status`"))
                row = job_row(job, db.job_spend(s, job.id))
                events = s.scalars(select(db.Event).where(db.Event.job_id == job_id).order_by(db.Event.id)).all()
                row["events"] = [{"t": _ts(e.t), "event": e.kind, **(e.detail or {})} for e in events]
                if fmt is Format.json:
                    print_json(row)
                else:
                    print_kv({k: v for k, v in row.items() if k != "events"}, title=f"job {job_id}")
                    print_table(row["events"], ["t", "event", "instance_id", "market"], title="events")
                return
            jobs = s.scalars(select(db.Job).order_by(db.Job.created_at.desc()).limit(limit)).all()
            spend = db.jobs_spend(s, [j.id for j in jobs])
            rows = [job_row(j, spend[j.id]) for j in jobs]
        if fmt is Format.json:
            print_json(rows)
        else:
            print_table(rows, ["job_id", "status", "steps_completed", "preemptions", "resumes", "cost_usd",
                               "budget_usd", "created_at"], title="jobs")
