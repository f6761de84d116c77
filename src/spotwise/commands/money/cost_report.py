"""``spotwise cost-report``: spend from the ledger, by job, cloud and market, with price provenance."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table


@COMMANDS.register("cost-report")
def register(app: typer.Typer) -> None:
    @app.command("cost-report", help="What was spent, by job, cloud and market, from the ledger.")
    def cost_report_cmd(
        job: Optional[str] = typer.Option(None, "--job", help="one job id (default: all jobs)"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.engine.state.ledger import cost_report
        from spotwise.engine.state.store import job_exists
        from spotwise.errors import InputError, Problem

        if job and not job_exists(job):
            raise InputError(Problem("--job", job, "the id of a job shown by `spotwise status`"))
        rep = cost_report(job)
        if fmt is Format.json:
            print_json(rep)
            return
        print_table(rep["rows"], ["job_id", "cloud", "market", "usd_per_hour", "hours", "cost_usd",
                                  "price_source", "price_as_of"], title="cost report")
        print(f"total: ${rep['total_usd']:.6f}  " + "  ".join(f"{k}: ${v:.6f}" for k, v in rep["by_market"].items()))
