"""``spotwise down CLUSTER_ID``: end every node (and leftover) of a cluster on every cloud."""

from __future__ import annotations

from typing import List, Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option


@COMMANDS.register("down")
def register(app: typer.Typer) -> None:
    @app.command("down", help="End every node of a cluster, on every cloud it could be on.")
    def down(cluster_id: str = typer.Argument(...),
             cloud: Optional[List[str]] = typer.Option(None, "--cloud", help="Only these clouds (repeatable)."),
             fmt: Format = format_option()) -> None:
        from spotwise.errors import InputError, Problem
        from spotwise.output import print_json, print_table
        from spotwise.provisioner import reconcile

        from spotwise.provisioner.base import known_clouds

        clouds = cloud or known_clouds()
        bad = [c for c in clouds if c not in known_clouds()]
        if bad:
            raise InputError(Problem("--cloud", bad, ", ".join(known_clouds())), source="down")
        sweep = reconcile.down(cluster_id, clouds=clouds)
        from spotwise.engine.state import store

        store.end_cluster(cluster_id)
        if fmt is Format.json:
            print_json({"cluster_id": cluster_id, **sweep.to_dict()})
        else:
            print_table(sweep.to_dict()["ended"], ["cloud", "instance_id", "instance_type", "region", "zone"],
                        title=f"ended {len(sweep.ended)} node(s) of {cluster_id}")
            for name, why in sweep.skipped.items():
                typer.echo(f"skipped {name}: {why}", err=True)
