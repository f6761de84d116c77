"""``spotwise up TASK.yaml``: provision a task's cluster (no training) and print its nodes."""

from __future__ import annotations

import uuid
from typing import Optional

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option

NODE_FIELDS = ("cloud", "instance_id", "instance_type", "region", "zone", "market", "usd_per_hour")


def plan_offers(spec, clouds: list[str]):
    """Offers for the task on ``clouds``, cheapest first: the planner's candidates (catalog for real
    clouds; the local cloud prices itself), by price alone (``up`` runs no job to estimate)."""
    from spotwise.engine.plan.planner import candidate_offers

    return sorted(candidate_offers(spec, clouds), key=lambda o: o.usd_per_hour)


def up_cluster(task: str, *, cloud: str | None = None, wait: bool = True, cluster_id: str | None = None) -> dict:
    from spotwise.errors import InputError, Problem
    from spotwise.provisioner.base import known_clouds
    from spotwise.provisioner.failover import Failover
    from spotwise.taskspec import load_taskspec

    spec = load_taskspec(task)
    if cloud is not None and cloud not in known_clouds():
        raise InputError(Problem("--cloud", cloud, ", ".join(known_clouds())), source="up")
    from spotwise.provisioner.base import cloud_class

    clouds = [cloud] if cloud else (list(spec.resources.clouds)
                                    or [c for c in known_clouds() if cloud_class(c).priced_by_catalog])
    offers = plan_offers(spec, clouds)
    if not offers:
        raise InputError(Problem("resources", {"accelerators": dict(spec.resources.accelerators), "clouds": clouds,
                                               "regions": list(spec.resources.regions)},
                                 "a combination some cloud sells (see `spotwise prices`)"), source=task)
    from spotwise.engine.state import store

    cid = cluster_id or f"{spec.name}-{uuid.uuid4().hex[:6]}"
    store.record_cluster(cid, name=spec.name, cloud=",".join(clouds), spec=spec.model_dump(mode="json"))
    fo = Failover()
    try:
        cluster = fo.provision(offers, cluster_id=cid, job_id=cid, nodes=spec.resources.nodes)
    except BaseException as e:
        store.end_cluster(cid, status="failed", message=str(e))
        raise
    nodes = cluster.nodes
    if wait:
        waited = []
        for name in sorted({n.cloud for n in nodes}):
            waited += fo.cloud(name).wait_until_running([n for n in nodes if n.cloud == name])
        nodes = waited
    return {"cluster_id": cid,
            "nodes": [{**{k: n.to_dict()[k] for k in NODE_FIELDS}, "role": n.role, "address": n.address,
                       "state": n.state} for n in nodes]}


@COMMANDS.register("up")
def register(app: typer.Typer) -> None:
    @app.command("up", help="Provision the cluster a task file asks for (no training) and print its nodes.")
    def up(task: str = typer.Argument(..., help="TASK.yaml"),
           cloud: Optional[str] = typer.Option(None, "--cloud", help="aws, gcp, azure or local (default: the task's clouds)"),
           no_wait: bool = typer.Option(False, "--no-wait", help="Return once launched, without waiting for 'running'."),
           cluster_id: Optional[str] = typer.Option(None, "--cluster-id", help="Use this id instead of a generated one."),
           fmt: Format = format_option()) -> None:
        from spotwise.output import print_json, print_table

        result = up_cluster(task, cloud=cloud, wait=not no_wait, cluster_id=cluster_id)
        if fmt is Format.json:
            print_json(result)
        else:
            print_table(result["nodes"], [*NODE_FIELDS, "role", "state"], title=f"cluster {result['cluster_id']}")
