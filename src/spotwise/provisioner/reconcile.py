"""No leaks: end a cluster everywhere (``down``) and end whatever no live job owns (``gc``).

Both work from the clouds' own view — resources found by the ``spotwise-cluster`` tag/label —
not from local state, so they still work after any crash. "Live" is the caller's to say (the CLI
asks the orchestrator's store): the provisioner never reaches up into the service layer. Without
it, ``gc`` only ends everything found if explicitly told to (``everything=True``,
``spotwise gc --all``).

A cloud that cannot be asked (no credentials, API error, its SDK not installed) is reported as
skipped, never silently treated as empty; so is one region of a cloud that cannot be read (an AWS
opt-in region the account has not enabled), as ``cloud/region``, while the rest is swept. The clouds swept by default are every registered one
(:func:`~spotwise.provisioner.base.known_clouds`); what each left besides instances is its own
:meth:`~spotwise.provisioner.base.Cloud.leftovers`. Both also delete, on this machine, the ssh key
pair (and the head's known-hosts file) the launcher made for each cluster they end
(:mod:`spotwise.provisioner.head_path`): ``gc`` every one whose cluster is not live, found or
not (the launcher that would have deleted it with its cluster may have been killed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable

from spotwise.errors import SpotwiseError
from spotwise.provisioner.base import Cloud, Node, get_cloud, known_clouds
from spotwise.provisioner.head_path import delete_cluster_key, keyed_clusters

log = logging.getLogger(__name__)


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


def _clouds(names: Iterable[str] | None,
            factory: Callable[[str], Cloud]) -> list[tuple[str, Cloud | None, str | None]]:
    out: list[tuple[str, Cloud | None, str | None]] = []
    for name in known_clouds() if names is None else names:
        try:
            out.append((name, factory(name), None))
        # broad on purpose: whatever stops one cloud from being built (no SDK, a bad setting, an
        # SDK's own error) is reported as that cloud skipped; the other clouds are still swept
        except Exception as e:  # noqa: BLE001
            out.append((name, None, f"{type(e).__name__}: {e}"))
    return out


def _regions_skipped(sweep: Sweep, name: str, cloud: Cloud) -> None:
    """The regions this cloud could not read (a disabled opt-in region...), as ``cloud/region``:
    the rest of the cloud was swept, and what is there stays tagged for a later pass."""
    for region, why in cloud.skipped_regions.items():
        sweep.skipped[f"{name}/{region}"] = why


def down(cluster_id: str, *, clouds: Iterable[str] | None = None,
         cloud_factory: Callable[[str], Cloud] = get_cloud) -> Sweep:
    """End every node of ``cluster_id`` on ``clouds`` (default: every cloud), and its leftovers
    (templates, security groups, NICs...)."""
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
            sweep.extra_deleted += cloud.leftovers({cluster_id}, match=True, dry_run=False)
            _regions_skipped(sweep, name, cloud)
        # broad on purpose: one cloud failing mid-sweep (any SDK or API error) is reported as
        # skipped and the sweep goes on; its resources stay tagged for the next pass
        except Exception as e:  # noqa: BLE001
            sweep.skipped[name] = f"{type(e).__name__}: {e}"
    sweep.extra_deleted += _forget_keys([cluster_id])
    return sweep


def gc(*, clouds: Iterable[str] | None = None, live: set[str] | None = None, everything: bool = False, dry_run: bool = False,
       cloud_factory: Callable[[str], Cloud] = get_cloud) -> Sweep:
    """End every spotwise resource whose cluster is not in ``live``, on ``clouds`` (default: every
    cloud).

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
            sweep.extra_deleted += cloud.leftovers(keep, match=False, dry_run=dry_run)
            _regions_skipped(sweep, name, cloud)
        except Exception as e:  # noqa: BLE001 - as in down(): one cloud failing is reported, not fatal
            sweep.skipped[name] = f"{type(e).__name__}: {e}"
    sweep.extra_deleted += _forget_keys(keyed_clusters() - keep, dry_run=dry_run)
    return sweep


def _forget_keys(cluster_ids: Iterable[str], *, dry_run: bool = False) -> list[str]:
    """Delete (or, ``dry_run``, name) the launcher's ssh key files of ``cluster_ids``."""
    out = []
    for cid in sorted(cluster_ids):
        try:
            out += [f"{what} ({cid})" for what in delete_cluster_key(cid, dry_run=dry_run)]
        except ValueError:          # not a name a key file could have
            continue
    return out

