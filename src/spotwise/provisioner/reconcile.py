"""No leaks: end a cluster everywhere (``down``) and end whatever no live job owns (``gc``).

Both work from the clouds' own view — resources found by the ``spotwise-cluster`` tag/label —
not from local state, so they still work after any crash. "Live" is the caller's to say (the CLI
asks the orchestrator's store): the provisioner never reaches up into the service layer. Without
it, ``gc`` only ends everything found if explicitly told to (``everything=True``,
``spotwise gc --all``).

A cloud that cannot be asked (no credentials, API error) is reported as skipped, never silently
treated as empty.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from spotwise.errors import SpotwiseError
from spotwise.provisioner.base import Cloud, Node, get_cloud

log = logging.getLogger(__name__)

ALL_CLOUDS = ("aws", "gcp", "azure", "local")


@dataclass(kw_only=True)
class Sweep:
    """What a ``down``/``gc`` pass found and did."""

    ended: list[Node] = field(default_factory=list)
    kept: list[Node] = field(default_factory=list)
    extra_deleted: list[str] = field(default_factory=list)   # launch templates, NICs
    skipped: dict[str, str] = field(default_factory=dict)    # cloud -> why it was not swept
    dry_run: bool = False

    def to_dict(self) -> dict:
        cols = ("cloud", "instance_id", "instance_type", "region", "zone", "market", "cluster_id", "job_id", "state")
        return {"dry_run": self.dry_run,
                "ended": [{k: n.to_dict()[k] for k in cols} for n in self.ended],
                "kept": [{k: n.to_dict()[k] for k in cols} for n in self.kept],
                "extra_deleted": self.extra_deleted, "skipped": self.skipped}


def _clouds(names, factory) -> list[tuple[str, Cloud | None, str | None]]:
    out = []
    for name in names:
        try:
            out.append((name, factory(name), None))
        except Exception as e:  # noqa: BLE001 - a cloud we cannot build is reported, not fatal
            out.append((name, None, f"{type(e).__name__}: {e}"))
    return out


def down(cluster_id: str, *, clouds=ALL_CLOUDS, cloud_factory: Callable[[str], Cloud] = get_cloud) -> Sweep:
    """End every node of ``cluster_id`` on every cloud, and its leftovers (templates, NICs)."""
    sweep = Sweep()
    for name, cloud, err in _clouds(clouds, cloud_factory):
        if cloud is None:
            sweep.skipped[name] = err or "unavailable"
            continue
        try:
            nodes = cloud.list_nodes(cluster_id)
            if nodes:
                cloud.terminate(nodes)
            sweep.ended += nodes
            sweep.extra_deleted += _leftovers(cloud, {cluster_id}, match=True, dry_run=False)
        except Exception as e:  # noqa: BLE001
            sweep.skipped[name] = f"{type(e).__name__}: {e}"
    return sweep


def gc(*, clouds=ALL_CLOUDS, live: set[str] | None = None, everything: bool = False, dry_run: bool = False,
       cloud_factory: Callable[[str], Cloud] = get_cloud) -> Sweep:
    """End every spotwise resource whose cluster is not in ``live``.

    ``live``: the cluster ids still owned by a live job (the caller asks its job store); without
    it the caller must pass ``everything=True`` to end all that is found.
    """
    if live is None and not everything:
        raise SpotwiseError("gc: live jobs cannot be told apart (no live cluster ids given); pass --all to end "
                            "every spotwise resource found, or --dry-run to list them")
    keep = set() if everything else set(live or ())
    sweep = Sweep(dry_run=dry_run)
    for name, cloud, err in _clouds(clouds, cloud_factory):
        if cloud is None:
            sweep.skipped[name] = err or "unavailable"
            continue
        try:
            nodes = cloud.list_nodes(None)
            orphans = [n for n in nodes if n.cluster_id not in keep]
            sweep.kept += [n for n in nodes if n.cluster_id in keep]
            if orphans and not dry_run:
                cloud.terminate(orphans)
            sweep.ended += orphans
            sweep.extra_deleted += _leftovers(cloud, keep, match=False, dry_run=dry_run)
        except Exception as e:  # noqa: BLE001
            sweep.skipped[name] = f"{type(e).__name__}: {e}"
    return sweep


def _leftovers(cloud: Cloud, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
    """Non-instance resources of ours: AWS launch templates and security groups; on clouds with a
    ``leftovers`` method whatever it sweeps (GCP: firewall rules, unattached disks, addresses;
    Azure: NICs, public IPs, OS disks, NSGs; the local cloud: stray processes and temporary
    directories).

    ``match=True``: those of ``cluster_ids``; ``match=False``: those of any other cluster.
    """
    out: list[str] = []
    if hasattr(cloud, "list_templates"):
        tpls = [t for t in cloud.list_templates() if (t[2] in cluster_ids) == match]
        if tpls and not dry_run:
            cloud.delete_templates(tpls)
        out += [f"aws launch template {t[1]} ({t[0]})" for t in tpls]
    if hasattr(cloud, "list_security_groups"):
        groups = [g for g in cloud.list_security_groups() if (g[2] in cluster_ids) == match]
        if groups and not dry_run:
            out += cloud.delete_security_groups(groups)
        elif groups:
            out += [f"aws security group {g[1]} ({g[0]})" for g in groups]
    if hasattr(cloud, "leftovers"):      # Azure: NICs, public IPs, OS disks, NSGs; local: strays, temp dirs
        out += cloud.leftovers(cluster_ids, match=match, dry_run=dry_run)
    return out
