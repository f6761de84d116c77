"""``spotwise schedule add|list|pause|resume|remove|runs``: cron-scheduled, budget-capped runs."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_kv, print_table


@COMMANDS.register("schedule")
def register(app: typer.Typer) -> None:
    sch = typer.Typer(help="Scheduled runs (started by `spotwise serve`).", no_args_is_help=True)

    @sch.command("add", help="Schedule a task file on a cron line.")
    def add(
        task: str = typer.Argument(..., help="task YAML file"),
        cron: str = typer.Option(..., "--cron", help="5-field cron line, e.g. '0 2 * * *'"),
        tz: str = typer.Option("UTC", "--timezone", help="IANA time zone of the cron line"),
        per_run: Optional[float] = typer.Option(None, "--budget-per-run", help="USD cap of each run"),
        per_month: Optional[float] = typer.Option(None, "--budget-per-month", help="USD cap per calendar month"),
        deadline: Optional[float] = typer.Option(None, "--deadline-hours", help="deadline of each run"),
        name: Optional[str] = typer.Option(None, "--name", help="schedule name (default: the task's name)"),
        overlap: str = typer.Option("skip", "--overlap", help="skip or queue a run while the previous one runs"),
        unfinished: str = typer.Option("restart", "--unfinished",
                                       help="restart, or resume a previous run that ended unfinished (budget, "
                                            "cancelled, lost) from its last checkpoint"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.engine.work.schedules import create_schedule
        from spotwise.taskspec import load_taskspec

        d = create_schedule(load_taskspec(task), cron=cron, timezone=tz, budget_per_run=per_run,
                            budget_per_month=per_month, deadline_hours=deadline, name=name, overlap=overlap,
                            unfinished=unfinished)
        print_json(d) if fmt is Format.json else print_kv(d, title=f"schedule {d['name']}")

    @sch.command("list", help="Schedules with their next run.")
    def list_(fmt: Format = format_option()) -> None:
        from spotwise.engine.work.schedules import list_schedules

        rows = list_schedules()
        if fmt is Format.json:
            print_json(rows)
        else:
            print_table(rows, ["id", "name", "cron", "timezone", "paused", "next_run_at", "budget_per_run",
                               "budget_per_month", "overlap", "unfinished"], title="schedules")

    def _toggle(ref: str, paused: bool, fmt: Format) -> None:
        from spotwise.engine.work.schedules import set_paused

        d = set_paused(ref, paused)
        print_json(d) if fmt is Format.json else print(f"{d['name']}: {'paused' if paused else 'resumed'}")

    @sch.command("pause", help="Pause a schedule (by id or name).")
    def pause(ref: str = typer.Argument(...), fmt: Format = format_option()) -> None:
        _toggle(ref, True, fmt)

    @sch.command("resume", help="Resume a schedule (runs missed while paused are not caught up).")
    def resume(ref: str = typer.Argument(...), fmt: Format = format_option()) -> None:
        _toggle(ref, False, fmt)

    @sch.command("remove", help="Remove a schedule and its run records (its jobs stay).")
    def remove(ref: str = typer.Argument(...), fmt: Format = format_option()) -> None:
        from spotwise.engine.work.schedules import remove as rm

        removed = rm(ref)
        print_json({"removed": removed}) if fmt is Format.json else print(f"removed schedule {removed}")

    @sch.command("runs", help="What became of each fire time (launched, skipped, refused, with the reason).")
    def runs(ref: Optional[str] = typer.Argument(None), limit: int = typer.Option(50, "--limit", min=1),
             fmt: Format = format_option()) -> None:
        from spotwise.engine.work.schedules import runs as r

        rows = r(ref, limit)
        print_json(rows) if fmt is Format.json else print_table(
            rows, ["fire_at", "schedule_id", "status", "job_id", "reason"], title="schedule runs")

    app.add_typer(sch, name="schedule")
