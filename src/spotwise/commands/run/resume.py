"""``spotwise resume JOB``: continue a stopped run from its last committed checkpoint, as the same job."""

from __future__ import annotations

from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option


@COMMANDS.register("resume")
def register(app: typer.Typer) -> None:
    @app.command("resume", help="Continue a run that ended budget_exhausted, cancelled or lost from its last "
                                "committed checkpoint: the same job, run name and storage, so the resume is exact.")
    def resume(
        job_id: str = typer.Argument(..., help="the job to continue (see `spotwise status`)"),
        budget: Optional[float] = typer.Option(None, "--budget", help="USD to add on top of what the job has spent "
                                                                     "(default: what is left of its own cap)"),
        deadline_hours: Optional[float] = typer.Option(None, "--deadline-hours",
                                                       help="a new deadline, in hours from now"),
        fmt: Format = format_option(),
    ) -> None:
        """Takes the job (:func:`spotwise.engine.work.resume.prepare`: refused with exit 2 and one line
        of why), then runs it here as ``spotwise launch`` runs a task, with the same output and exit
        codes. A resume the orchestrator refuses before anything launches goes back to the status
        it came from."""
        import sys

        from spotwise.commands.run.launch import _reap_dead_jobs, run_and_report
        from spotwise.engine.work import resume as resumes
        from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator
        from spotwise.engine.display.summary import usd

        _reap_dead_jobs()           # a job whose runner died is `lost` (resumable) rather than `running`
        res = resumes.prepare(job_id, budget_usd=budget, deadline_hours=deadline_hours)
        cap = "no cap" if res.budget_usd is None else (f"cap {usd(res.budget_usd)} ({usd(res.spent_usd)} spent "
                                                       f"+ {usd(res.budget_usd - res.spent_usd)})")
        print(f"[spotwise] resuming job {job_id} from step {res.from_step} (was {res.from_status}); {cap}",
              file=sys.stderr, flush=True)
        try:
            orch = Orchestrator(res.spec, LaunchOptions(budget_usd=res.budget_usd, progress=fmt is Format.table),
                                job_id=job_id, cluster_id=res.cluster_id, resume=True)
        except BaseException as e:
            resumes.abandon(job_id, str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise
        run_and_report(orch, fmt)
