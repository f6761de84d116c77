"""``spotwise status [JOB_ID]``: jobs and their state, from the database."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_kv, print_table


@COMMANDS.register("status")
def register(app: typer.Typer) -> None:
    @app.command("status", help="Show jobs (newest first), or one job in detail.")
    def status(
        job_id: Optional[str] = typer.Argument(None, help="a job id (default: all jobs)"),
        limit: int = typer.Option(20, "--limit", min=1, help="how many jobs to list"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.engine import store
        from spotwise.utils.timefmt import iso_utc_or_none as iso_utc
        from spotwise.errors import InputError, Problem

        if job_id:
            row = store.get_job(job_id)
            if row is None:
                raise InputError(Problem("JOB_ID", job_id, "the id of a job shown by `spotwise status`"))
            row["events"] = [{**e, "t": iso_utc(e["t"])} for e in store.job_events(job_id)]
            if fmt is Format.json:
                print_json(row)
            else:
                print_kv({k: v for k, v in row.items() if k != "events"}, title=f"job {job_id}")
                print_table(row["events"], ["t", "event", "instance_id", "market"], title="events")
            return
        rows = store.list_jobs(limit=limit)
        if fmt is Format.json:
            print_json(rows)
        else:
            print_table(rows, ["job_id", "status", "steps_completed", "preemptions", "resumes", "cost_usd",
                               "budget_usd", "created_at"], title="jobs")
