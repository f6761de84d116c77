"""``spotwise logs JOB_ID [--follow]``: what the job itself printed (the driver and every rank).

Read from the local state (``job_logs``, :mod:`spotwise.engine.run.joblogs`), which the job's runner
fills while the run goes, so it works during the run, after teardown, and from any shell on the
same database. Each line is tagged with who printed it: ``[rank 1 node sw...-worker-ab12] text``
(``[driver node ...]`` for the driver on the head). ``--follow`` keeps printing new lines until the
job ends (a final status), then exits 0. JSON: one document with the lines; with ``--follow``, one
JSON object a line (JSON Lines), as they come.
"""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option

#: how often ``--follow`` looks for new lines (the runner stores them every second)
FOLLOW_EVERY_S = 0.5


@COMMANDS.register("logs")
def register(app: typer.Typer) -> None:
    @app.command("logs", help="Print what the job itself printed (the driver and every rank, each line tagged "
                              "with its rank and node); --follow: keep printing until the job ends.")
    def logs(
        job_id: str = typer.Argument(..., help="a job id (see `spotwise status`)"),
        follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines until the job ends"),
        tail: Optional[int] = typer.Option(None, "--tail", min=1, help="only the last N lines (then follow from there)"),
        fmt: Format = format_option(),
    ) -> None:
        from spotwise.engine.state import store
        from spotwise.errors import InputError, Problem

        if not store.job_exists(job_id):
            raise InputError(Problem("JOB_ID", job_id, "the id of a job shown by `spotwise status`"), source="logs")
        show(job_id, follow=follow, tail=tail, fmt=fmt)


def show(job_id: str, *, follow: bool, tail: int | None, fmt: Format) -> None:
    import json
    import sys
    import time

    from spotwise.engine.run import joblogs
    from spotwise.engine.state import store
    from spotwise.engine.work.jobs import TERMINAL
    from spotwise.output import print_json

    rows = joblogs.lines(job_id, last=tail) if tail else joblogs.lines(job_id)
    if fmt is Format.json and not follow:
        print_json({"job_id": job_id, "lines": rows, "next": rows[-1]["seq"] if rows else 0})
        return

    def emit(batch: list[dict]) -> None:
        for r in batch:
            print(json.dumps(r) if fmt is Format.json else joblogs.tagged(r))
        sys.stdout.flush()

    emit(rows)
    after = rows[-1]["seq"] if rows else 0
    while follow:
        # the job's status first, then its lines: the lines stored before it ended are all read
        ended = (store.get_job(job_id) or {}).get("status") in TERMINAL
        while batch := joblogs.lines(job_id, after=after, limit=1000):
            emit(batch)
            after = batch[-1]["seq"]
        if ended:
            return
        time.sleep(FOLLOW_EVERY_S)
