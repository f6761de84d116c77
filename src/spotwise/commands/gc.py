"""``spotwise gc``: end every spotwise resource that no live job owns, on every cloud."""

from __future__ import annotations

from typing import List, Optional

import typer

from spotwise.output import Format


def register(app: typer.Typer) -> None:
    @app.command("gc", help="End spotwise instances/templates/NICs that no live job owns (reconcile).")
    def gc(all_: bool = typer.Option(False, "--all", help="End everything of ours found, live or not."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be ended."),
           cloud: Optional[List[str]] = typer.Option(None, "--cloud", help="Only these clouds (repeatable)."),
           fmt: Format = typer.Option(Format.table, "--format")) -> None:
        from spotwise.errors import InputError, Problem
        from spotwise.output import print_json, print_table
        from spotwise.provisioner import reconcile

        clouds = cloud or list(reconcile.ALL_CLOUDS)
        bad = [c for c in clouds if c not in reconcile.ALL_CLOUDS]
        if bad:
            raise InputError(Problem("--cloud", bad, ", ".join(reconcile.ALL_CLOUDS)), source="gc")
        from spotwise.service.store import live_cluster_ids

        sweep = reconcile.gc(clouds=clouds, live=None if all_ else live_cluster_ids(), everything=all_,
                             dry_run=dry_run)
        if fmt is Format.json:
            print_json(sweep.to_dict())
        else:
            verb = "would end" if dry_run else "ended"
            print_table(sweep.to_dict()["ended"], ["cloud", "instance_id", "cluster_id", "region", "state"],
                        title=f"{verb} {len(sweep.ended)} node(s)")
            for x in sweep.extra_deleted:
                typer.echo(f"{verb} {x}")
            for name, why in sweep.skipped.items():
                typer.echo(f"skipped {name}: {why}", err=True)
