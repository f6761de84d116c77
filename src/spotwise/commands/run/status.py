"""``spotwise status [JOB_ID]``: jobs and their state, from the database."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_kv, print_table


@COMMANDS.register("status")
def register(app: typer.Typer) -> None:
    @app.command("status", help="Show jobs (newest first), or one job: its state and its events in words "
                                "(--details: the whole report too).")
    def status(
        job_id: Optional[str] = typer.Argument(None, help="a job id (default: all jobs)"),
        limit: int = typer.Option(20, "--limit", min=1, help="how many jobs to list"),
        details: bool = typer.Option(False, "--details", help="with JOB_ID: also the run's whole report (the plan, "
                                                              "every attempt, move and checkpoint), as key/value "
                                                              "rows (json: a \"report\" key)"),
        plot: Optional[str] = typer.Option(None, "--plot", help="with JOB_ID: also draw its curves (loss against step, "
                                                                   "spend against time with the budget; preemptions "
                                                                   "and moves marked) to this .png/.svg/.pdf file"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.commands.money.estimate import check_plot_path
        from spotwise.engine.state import store
        from spotwise.errors import InputError, Problem

        if plot is not None:
            if not job_id:
                raise InputError(Problem("--plot", plot, "together with a JOB_ID"), source="status")
            check_plot_path(plot, source="status")
        if job_id:
            row = store.get_job(job_id, with_report=details)
            if row is None:
                raise InputError(Problem("JOB_ID", job_id, "the id of a job shown by `spotwise status`"))
            show_job(row, store.job_events(job_id), fmt=fmt, details=details)
            if plot is not None:
                draw(job_id, plot)
            return
        if details:
            raise InputError(Problem("--details", True, "together with a JOB_ID"))
        rows = store.list_jobs(limit=limit)
        if fmt is Format.json:
            print_json(rows)
        else:
            print_table(rows, ["job_id", "status", "steps_completed", "preemptions", "resumes", "cost_usd",
                               "budget_usd", "created_at"], title="jobs")


def draw(job_id: str, path: str) -> None:
    """The job's curves to ``path`` (:func:`spotwise.curveplot.plot_curves`); one line on stderr
    saying what was drawn (stdout stays the job's table or JSON)."""
    import sys

    from spotwise.curveplot import plot_curves
    from spotwise.engine.run.curves import curves

    s = plot_curves(curves(job_id), path)
    print(f"wrote {path}: {len(s['loss'])} loss points, {len(s['spend'])} spend points, "
          f"{len(s['loss_marks'])} marks", file=sys.stderr)


def show_job(row: dict, events: list[dict], *, fmt: Format, details: bool) -> None:
    """One job. JSON: its row with its events (ISO times), plus ``report`` with ``--details``.
    Table: the row as key/value rows; with ``--details`` the report's every other field as well
    (nested values as JSON: the full view ``spotwise launch`` leaves out of its summary); then
    the events, one sentence each (:func:`spotwise.engine.display.sentences.sentence`)."""
    from spotwise.engine.display.sentences import sentence
    from spotwise.utils.timefmt import iso_utc_or_none as iso_utc

    job_id = row["job_id"]
    if fmt is Format.json:
        print_json({**row, "events": [{**e, "t": iso_utc(e["t"])} for e in events]})
        return
    report = row.pop("report", None) if details else None
    print_kv(row, title=f"job {job_id}")
    if details:
        if report:
            print_kv({k: v for k, v in report.items() if k != "events" and k not in row},
                     title=f"report of {job_id}")
        else:
            print(f"no report yet: job {job_id} has not ended")
    print(f"events ({len(events)}):")
    for e in events:
        print(f"  {iso_utc(e['t'])}  {sentence(e)}")
