"""Failover: get a whole cluster up by walking a plan's offers in order.

Rules (all driven by the typed errors of :mod:`spotwise.provisioner.base`, never by messages):

* A **site** is (cloud, region, market). A Ray cluster lives in one site — its nodes talk over
  private addresses — so a cluster is filled within a site and sites are tried in the order of
  their first offer in the plan.
* Within a site the first node is the Ray **head**; the workers get its address.
* :class:`CapacityError` marks the offer(s) of that call unavailable for a TTL (default 3 min, in
  an :class:`UnavailableCache` that can outlive one call) and moves to the next offer.
* :class:`QuotaError` skips every remaining offer in that region, and so does :class:`SiteError`
  (the region cannot be used as configured: no subnet or image there); :class:`AuthError` skips
  the whole cloud. Each is in the attempts and the final message, never fatal to the walk.
* A **partial** fleet (fewer nodes than asked) is topped up from the next offers of the same
  site; if the site cannot finish the cluster, its nodes are **released** before moving on —
  never left half-up silently. Any unexpected exception releases everything launched so far.

Pure logic: clouds come from an injectable factory and time from an injectable clock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from spotwise.pricing.offer import Offer
from spotwise.provisioner import instance_types
from spotwise.provisioner.base import (AuthError, CapacityError, Cloud, LaunchRequest, Node,
                                       ProvisionError, QuotaError, SiteError, get_cloud)

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 180.0


@dataclass
class UnavailableCache:
    """Offers that just failed for capacity, keyed by ``Offer.key``, each until a deadline."""

    ttl_s: float = DEFAULT_TTL_S
    clock: Callable[[], float] = time.monotonic
    _until: dict[str, float] = field(default_factory=dict)

    def mark(self, offer: Offer) -> None:
        self._until[offer.key] = self.clock() + self.ttl_s

    def available(self, offer: Offer) -> bool:
        until = self._until.get(offer.key)
        if until is None:
            return True
        if self.clock() >= until:
            del self._until[offer.key]
            return True
        return False

    def unavailable_keys(self) -> list[str]:
        now = self.clock()
        return sorted(k for k, t in self._until.items() if t > now)


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One step of the walk, for the report and the error message."""

    offer_key: str
    outcome: str          # launched | partial | capacity | quota | unusable | auth | error | cached | skipped | released
    nodes: int = 0
    message: str = ""


@dataclass(kw_only=True)
class Cluster:
    cluster_id: str
    job_id: str
    nodes: list[Node]
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def head(self) -> Node | None:
        return next((n for n in self.nodes if n.role == "head"), self.nodes[0] if self.nodes else None)

    @property
    def usd_per_hour(self) -> float:
        return sum(n.usd_per_hour for n in self.nodes)

    def to_dict(self) -> dict:
        return {"cluster_id": self.cluster_id, "job_id": self.job_id,
                "nodes": [{k: n.to_dict()[k] for k in ("cloud", "instance_id", "instance_type", "region",
                                                       "zone", "market", "usd_per_hour", "role", "state",
                                                       "address")} for n in self.nodes],
                "attempts": [asdict(a) for a in self.attempts]}


class ProvisioningFailed(ProvisionError):
    """No site could supply the whole cluster; ``attempts`` says what was tried and why."""

    def __init__(self, message: str, attempts: list[Attempt]) -> None:
        super().__init__(message)
        self.attempts = attempts


def _site(o: Offer) -> tuple[str, str, str]:
    return (o.cloud, o.region, o.market.value)


def _sites(offers: Iterable[Offer]) -> list[list[Offer]]:
    groups: dict[tuple[str, str, str], list[Offer]] = {}
    for o in offers:
        groups.setdefault(_site(o), []).append(o)
    return list(groups.values())


def validate_plan(offers: list[Offer]) -> None:
    """Raise InputError for the first offer no cloud could launch (before anything is created).
    Offers of a cloud the shipped instance-type table knows are checked against it; a cloud that
    prices its own machines (the local cloud) checks them at launch."""
    for o in offers:
        if instance_types.types_for(o.cloud):
            instance_types.validate_offer(o)


class Failover:
    """Walks offers for one cluster. Keep one instance (or at least its cache) per orchestrator."""

    def __init__(self, *, cloud_factory: Callable[[str], Cloud] = get_cloud,
                 cache: UnavailableCache | None = None) -> None:
        self._factory = cloud_factory
        self._clouds: dict[str, Cloud] = {}
        self.cache = cache or UnavailableCache()

    def cloud(self, name: str) -> Cloud:
        if name not in self._clouds:
            self._clouds[name] = self._factory(name)
        return self._clouds[name]

    def provision(self, offers: list[Offer], *, cluster_id: str, job_id: str, nodes: int = 1,
                  max_price: float | None = None, labels: dict[str, str] | None = None,
                  dedicated_head: bool = False, attempts: list[Attempt] | None = None,
                  prepare: Callable[[str, str], None] | None = None) -> Cluster:
        """Launch ``nodes`` nodes for the cluster from the first site that can supply them all.

        ``dedicated_head``: first launch the cloud's head offer (:meth:`Cloud.head_offer`, a small
        on-demand CPU machine) in the site's region and zone, then ``nodes`` *workers* from the
        offers; without it the first node of the offers is the head (``spotwise up``).
        ``prepare(cloud, region)`` is called before the first launch in a site (the cluster's
        security group / firewall rule there): only sites actually tried get one, so a plan over
        three clouds creates nothing on the clouds it never reaches. A :class:`ProvisionError`
        from it skips the site like a failed launch.
        """
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        validate_plan(offers)
        attempts = attempts if attempts is not None else []
        bad_regions: dict[tuple[str, str], str] = {}
        bad_clouds: dict[str, str] = {}
        for site in _sites(offers):
            cloud_name, region = site[0].cloud, site[0].region
            if cloud_name in bad_clouds or (cloud_name, region) in bad_regions:
                why = bad_clouds.get(cloud_name) or bad_regions[(cloud_name, region)]
                attempts += [Attempt(offer_key=o.key, outcome="skipped", message=why) for o in site]
                continue
            if prepare is not None:
                try:
                    prepare(cloud_name, region)
                except AuthError as e:
                    bad_clouds[cloud_name] = f"{cloud_name} skipped: {e}"
                    attempts += [Attempt(offer_key=o.key, outcome="auth", message=str(e)) for o in site[:1]]
                    continue
                except SiteError as e:
                    bad_regions[(cloud_name, region)] = str(e)
                    attempts.append(Attempt(offer_key=site[0].key, outcome="unusable", message=str(e)))
                    continue
                except ProvisionError as e:
                    attempts.append(Attempt(offer_key=site[0].key, outcome="error",
                                            message=f"preparing {cloud_name}/{region}: {e}"))
                    continue
            head: Node | None = None
            if dedicated_head:
                head = self._launch_head(site[0], cluster_id=cluster_id, job_id=job_id, labels=labels or {},
                                         attempts=attempts, bad_regions=bad_regions, bad_clouds=bad_clouds)
                if head is None:
                    continue
            try:
                got = self._fill_site(site, cluster_id=cluster_id, job_id=job_id, want=nodes,
                                      max_price=max_price, labels=labels or {}, attempts=attempts,
                                      bad_regions=bad_regions, bad_clouds=bad_clouds, head=head)
            except BaseException:   # even KeyboardInterrupt: the head is released, then re-raised
                if head is not None:
                    self._release([head])
                raise
            if len(got) == nodes:
                return Cluster(cluster_id=cluster_id, job_id=job_id, nodes=([head] if head else []) + got,
                               attempts=attempts)
            if head is not None:
                got = [head, *got]
            if got:
                self._release(got)
                attempts.append(Attempt(offer_key=site[0].key, outcome="released", nodes=len(got),
                                        message=f"site gave {len(got)} of {nodes} nodes; released them"))
        raise ProvisioningFailed(self._failure_message(nodes, attempts), attempts)

    def add_workers(self, offers: list[Offer], *, head: Node, cluster_id: str, job_id: str, count: int,
                    attempts: list[Attempt], labels: dict[str, str] | None = None) -> list[Node]:
        """Up to ``count`` more workers for a running cluster, from ``offers`` in the head's cloud
        and region only (a Ray cluster lives in one site); walks them in order with the same
        capacity rules. Returns what came up (possibly fewer; never raises for capacity)."""
        same = [o for o in offers if o.cloud == head.cloud and o.region == head.region]
        got: list[Node] = []
        for site in _sites(same):
            if len(got) >= count:
                break
            got += self._fill_site(site, cluster_id=cluster_id, job_id=job_id, want=count - len(got),
                                   max_price=None, labels=labels or {}, attempts=attempts,
                                   bad_regions={}, bad_clouds={}, head=head)
        return got

    def _launch_head(self, first: Offer, *, cluster_id: str, job_id: str, labels: dict[str, str],
                     attempts: list[Attempt], bad_regions: dict, bad_clouds: dict) -> Node | None:
        cloud = self.cloud(first.cloud)
        offer = cloud.head_offer(first.region, first.zone)
        try:
            [head] = cloud.launch(LaunchRequest(cluster_id=cluster_id, job_id=job_id, offer=offer, role="head",
                                                labels=labels))
        except AuthError as e:
            bad_clouds[first.cloud] = f"{first.cloud} skipped: {e}"
            attempts.append(Attempt(offer_key=offer.key, outcome="auth", message=str(e)))
            return None
        except (QuotaError, SiteError) as e:
            bad_regions[(first.cloud, first.region)] = f"{first.cloud}/{first.region} skipped: {e}"
            attempts.append(Attempt(offer_key=offer.key, outcome=_region_outcome(e), message=str(e)))
            return None
        except ProvisionError as e:
            attempts.append(Attempt(offer_key=offer.key, outcome="capacity" if isinstance(e, CapacityError)
                                    else "error", message=str(e)))
            return None
        attempts.append(Attempt(offer_key=offer.key, outcome="launched", nodes=1, message="1 of 1 head node(s)"))
        return head

    # -- one site ---------------------------------------------------------------------------------
    def _fill_site(self, site: list[Offer], *, cluster_id: str, job_id: str, want: int,
                   max_price: float | None, labels: dict[str, str], attempts: list[Attempt],
                   bad_regions: dict, bad_clouds: dict, head: Node | None = None) -> list[Node]:
        """Launch the head (unless given), then workers, walking the site's offers; return what
        came up (without a given ``head``)."""
        cloud_name, region = site[0].cloud, site[0].region
        given_head = head
        got: list[Node] = []
        i = 0
        try:
            while i < len(site) and len(got) < want:
                o = site[i]
                if not self.cache.available(o):
                    attempts.append(Attempt(offer_key=o.key, outcome="cached",
                                            message="marked unavailable (capacity) within the TTL"))
                    i += 1
                    continue
                cloud = self.cloud(cloud_name)
                alts: tuple[Offer, ...] = ()
                if cloud.supports_alternatives:
                    alts = tuple(a for a in site[i + 1:] if self.cache.available(a))
                head = given_head or next((n for n in got if n.role == "head"), None)
                role = "worker" if head else "head"
                count = 1 if role == "head" else want - sum(n.role == "worker" for n in got) - (
                    0 if given_head else sum(n.role == "head" for n in got))
                req = LaunchRequest(
                    cluster_id=cluster_id, job_id=job_id, offer=o, alternatives=alts, count=count,
                    role=role, head_address=f"{head.address}:{cloud.ray_port}" if head and head.address else None,
                    labels=labels, max_price=max_price)
                try:
                    new = cloud.launch(req)
                except AuthError as e:
                    bad_clouds[cloud_name] = f"{cloud_name} skipped: {e}"
                    attempts.append(Attempt(offer_key=o.key, outcome="auth", message=str(e)))
                    attempts += [Attempt(offer_key=x.key, outcome="skipped", message=bad_clouds[cloud_name])
                                 for x in site[i + 1:]]
                    return got
                except (QuotaError, SiteError) as e:
                    bad_regions[(cloud_name, region)] = f"{cloud_name}/{region} skipped: {e}"
                    attempts.append(Attempt(offer_key=o.key, outcome=_region_outcome(e), message=str(e)))
                    attempts += [Attempt(offer_key=x.key, outcome="skipped",
                                         message=bad_regions[(cloud_name, region)]) for x in site[i + 1:]]
                    return got
                except CapacityError as e:
                    for x in (o, *alts):
                        self.cache.mark(x)
                    attempts.append(Attempt(offer_key=o.key, outcome="capacity", message=str(e)))
                    i += 1
                    continue
                except ProvisionError as e:
                    attempts.append(Attempt(offer_key=o.key, outcome="error", message=str(e)))
                    i += 1
                    continue
                got.extend(new)
                failed = {k: v for n in new for k, v in (n.extra.get("capacity_errors") or {}).items()}
                for x in (o, *alts):
                    if x.key in failed:       # filled from other offers of the call: still an attempt
                        self.cache.mark(x)
                        attempts.append(Attempt(offer_key=x.key, outcome="capacity", message=failed[x.key]))
                full = len(new) >= count
                attempts.append(Attempt(offer_key=o.key, outcome="launched" if full else "partial",
                                        nodes=len(new), message=f"{len(new)} of {count} {role} node(s)"))
                if not (role == "head" and full):
                    i += 1  # a head that came up: ask the same offer for the workers next
            return got
        except BaseException:   # even KeyboardInterrupt: what came up is released, then re-raised
            self._release(got)
            raise

    def _release(self, nodes: list[Node]) -> None:
        by_cloud: dict[str, list[Node]] = {}
        for n in nodes:
            by_cloud.setdefault(n.cloud, []).append(n)
        for name, ns in by_cloud.items():
            try:
                self.cloud(name).terminate(ns)
            except Exception as e:  # noqa: BLE001 - still tagged: `spotwise gc` will end them
                log.error("could not release %d %s node(s) (gc will): %s", len(ns), name, e)

    @staticmethod
    def _failure_message(nodes: int, attempts: list[Attempt]) -> str:
        lines = [f"could not get {nodes} node(s) from any offer in the plan:"]
        lines += [f"  - {a.offer_key}: {a.outcome}" + (f" ({a.message})" if a.message else "")
                  for a in attempts]
        if not attempts:
            lines.append("  (the plan had no offers)")
        return "\n".join(lines)


def _region_outcome(e: ProvisionError) -> str:
    """An attempt's outcome for an error that skips the region."""
    return "unusable" if isinstance(e, SiteError) else "quota"


def provision(offers: list[Offer], *, cluster_id: str, job_id: str, nodes: int = 1,
              cloud_factory: Callable[[str], Cloud] = get_cloud, cache: UnavailableCache | None = None,
              max_price: float | None = None) -> Cluster:
    """One-shot helper: :meth:`Failover.provision` with a fresh (or given) cache."""
    return Failover(cloud_factory=cloud_factory, cache=cache).provision(
        offers, cluster_id=cluster_id, job_id=job_id, nodes=nodes, max_price=max_price)
