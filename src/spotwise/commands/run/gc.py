"""``spotwise gc``: reap jobs whose runner is dead, then end every spotwise resource that no live
job owns, on every cloud (stray local processes and temporary directories included)."""

from __future__ import annotations

from typing import List, Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option


@COMMANDS.register("gc")
def register(app: typer.Typer) -> None:
    @app.command("gc", help="End spotwise instances/templates/NICs that no live job owns (reconcile).")
    def gc(all_: bool = typer.Option(False, "--all", help="End everything of ours found, live or not."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be ended."),
           cloud: Optional[List[str]] = typer.Option(None, "--cloud", help="Only these clouds (repeatable)."),
           fmt: Format = format_option()) -> None:
        from spotwise.errors import InputError, Problem
        from spotwise.output import print_json, print_table
        from spotwise.provisioner import reconcile

        from spotwise.provisioner.base import known_clouds

        clouds = cloud or known_clouds()
        bad = [c for c in clouds if c not in known_clouds()]
        if bad:
            raise InputError(Problem("--cloud", bad, ", ".join(known_clouds())), source="gc")
        from spotwise.engine.work import jobs
        from spotwise.engine.state.store import dead_jobs, live_cluster_ids

        # jobs whose runner is dead first: their nodes are ended, bills closed, status `lost`;
        # then whatever no live job owns
        reaped = ([{"job_id": j.id, "status": "lost (dry run)", "why": why} for j, why in dead_jobs()]
                  if dry_run else jobs.reconcile())
        sweep = reconcile.gc(clouds=clouds, live=None if all_ else live_cluster_ids(), everything=all_,
                             dry_run=dry_run)
        if fmt is Format.json:
            print_json({**sweep.to_dict(), "jobs": reaped})
        else:
            for r in reaped:
                typer.echo(f"job {r['job_id']}: {r['status']} ({r['why']})")
            verb = "would end" if dry_run else "ended"
            print_table(sweep.to_dict()["ended"], ["cloud", "instance_id", "cluster_id", "region", "state"],
                        title=f"{verb} {len(sweep.ended)} node(s)")
            for x in sweep.extra_deleted:
                typer.echo(f"{verb} {x}")
            for name, why in sweep.skipped.items():
                typer.echo(f"skipped {name}: {why}", err=True)
