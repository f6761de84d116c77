"""The ``Cloud`` interface every provider implements, and the typed errors failover acts on.

Failover never string-matches error messages: each cloud module maps its API's errors to
:class:`CapacityError` (try the next zone/offer), :class:`QuotaError` and :class:`AuthError`
(skip the whole region/cloud). Every resource a cloud creates is tagged with ``spotwise-cluster``
and ``spotwise-job`` so :meth:`Cloud.list_nodes` can always find it again — that is what makes a
reconcile pass (``spotwise gc``) possible after any crash.

Clouds register themselves by name (``register_cloud``), so adding one never edits a central
if/else: ``get_cloud("aws")`` imports ``spotwise.provisioner.aws`` on first use.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Callable

from spotwise.errors import SpotwiseError
from spotwise.pricing.offer import Offer
from spotwise.provisioner.bootstrap import DASHBOARD_PORT, RAY_PORT

TAG_CLUSTER = "spotwise-cluster"
TAG_JOB = "spotwise-job"
TAG_MARKET = "spotwise-market"
TAG_ROLE = "spotwise-role"


class ProvisionError(SpotwiseError):
    """A launch failed. ``offer_key`` names the offer that failed, when known."""

    def __init__(self, message: str, *, offer_key: str | None = None, cloud: str | None = None,
                 region: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.offer_key = offer_key
        self.cloud = cloud
        self.region = region
        self.code = code


class CapacityError(ProvisionError):
    """The cloud has no capacity for this offer right now (e.g. InsufficientInstanceCapacity,
    ZONE_RESOURCE_POOL_EXHAUSTED, AllocationFailed). Failover moves to the next offer and marks
    this one unavailable for a TTL."""


class QuotaError(ProvisionError):
    """An account limit stops the launch in this region/cloud; failover skips the region."""


class AuthError(ProvisionError):
    """Missing or rejected credentials; failover skips the whole cloud."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    """What to launch: ``count`` instances of one offer for one cluster.

    ``role`` is ``head`` or ``worker``; ``head_address`` is the Ray head's ``host:port`` that
    workers join (None for the head itself).
    """

    cluster_id: str
    job_id: str
    offer: Offer
    count: int = 1
    role: str = "worker"
    head_address: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    max_price: float | None = None
    # Other offers of the same cloud, region and market the cloud may fill this request from
    # (e.g. EC2 Fleet overrides: more instance types / AZs in one call). Empty: ``offer`` only.
    alternatives: tuple[Offer, ...] = ()

    @property
    def offers(self) -> tuple[Offer, ...]:
        """``offer`` then ``alternatives``, in preference order."""
        return (self.offer, *self.alternatives)


@dataclass(slots=True, kw_only=True)
class Node:
    """One running (or terminated) instance as the cloud describes it."""

    cloud: str
    instance_id: str
    instance_type: str
    region: str
    zone: str
    market: str
    usd_per_hour: float
    cluster_id: str
    job_id: str
    role: str = "worker"
    state: str = "running"
    launched_at: float | None = None
    address: str | None = None
    ray_node_id: str | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadEndpoint:
    """How the orchestrator reaches a cluster's head: the Ray dashboard (Jobs API) and the job
    driver's control endpoint, plus the environment a client needs to talk to them."""

    dashboard_url: str
    control_url: str
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)   # e.g. the cluster's Ray auth token


class Cloud(ABC):
    """A place instances come from. Implementations are small and stateless where possible.

    Contract:
      * ``launch`` returns exactly the nodes that are up, or raises a typed error having released
        anything partially created (never a half-up fleet left silently).
      * ``terminate`` is idempotent: ending an already-ended instance is not an error.
      * ``list_nodes`` finds every live instance carrying our cluster tag (optionally one cluster),
        including ones this process did not launch.
    """

    name: str = ""

    @abstractmethod
    def launch(self, request: LaunchRequest) -> list[Node]: ...

    @abstractmethod
    def terminate(self, nodes: list[Node]) -> None: ...

    @abstractmethod
    def list_nodes(self, cluster_id: str | None = None) -> list[Node]: ...

    def describe(self, node: Node) -> Node:
        """Fresh state of one node (default: look it up in ``list_nodes``)."""
        for n in self.list_nodes(node.cluster_id):
            if n.instance_id == node.instance_id:
                return n
        node.state = "terminated"
        return node

    def wait_until_running(self, nodes: list[Node], timeout_s: float = 900.0) -> list[Node]:
        """Block until ``nodes`` are running and return their fresh state (default: as given)."""
        return nodes

    def offers(self) -> list[Offer]:
        """Offers this cloud prices itself (only the local cloud does; others use the catalog)."""
        return []

    # -- what a training run needs of a cloud (the orchestrator's only view of it) ---------------
    ray_port: int = RAY_PORT
    dashboard_port: int = DASHBOARD_PORT
    control_port: int = DASHBOARD_PORT + 1

    @classmethod
    def for_task(cls, spec, opts) -> "Cloud":
        """The cloud as one run of ``spec`` wants it (the local cloud reads its simulated market
        from the task; real clouds need nothing from it)."""
        return cls()

    #: seconds between the cloud's interruption notice and the kill (AWS 120, GCP 30, Azure >= 30);
    #: training keeps its checkpoints close enough that a save that cannot fit it loses at most
    #: about one window of work. None: no bound (the local cloud's simulated market).
    notice_window_s: float | None = None

    def head_offer(self, region: str, zone: str) -> Offer:
        """The on-demand offer the cluster's Ray head runs on in ``region``: a small CPU machine
        that holds the run's state, so losing a spot worker never loses the head."""
        raise SpotwiseError(f"{self.name} has no head instance configured")

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """Create what the cluster's nodes share (AWS: its security group). Idempotent."""

    def endpoint(self, cluster_id: str, head: Node) -> HeadEndpoint:
        """Where the orchestrator reaches the head (default: its private address, from inside the VPC)."""
        if not head.address:
            raise SpotwiseError(f"head {head.instance_id} has no address yet")
        return HeadEndpoint(dashboard_url=f"http://{head.address}:{self.dashboard_port}",
                            control_url=f"http://{head.address}:{self.control_port}")

    def observe(self, cluster_id: str, snapshot: dict) -> list[dict]:
        """Called every orchestrator tick with the run's progress; returns cloud-side events for
        the run's report (the local cloud's simulated market posts its spot notices here)."""
        return []

    def was_preempted(self, node: Node) -> bool:
        """A node that went away without the orchestrator ending it: reclaimed (True) or lost?"""
        return node.market == "spot"

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        """After every node of the cluster was terminated: delete what the cluster shared
        (security group, leftover network interfaces, local processes). Returns what it deleted."""
        return []


_REGISTRY: dict[str, Callable[..., Cloud]] = {}
_MODULES = {"local": "spotwise.provisioner.local", "aws": "spotwise.provisioner.aws",
            "gcp": "spotwise.provisioner.gcp", "azure": "spotwise.provisioner.azure"}


def register_cloud(name: str) -> Callable[[type[Cloud]], type[Cloud]]:
    """Class decorator: make a Cloud available as ``get_cloud(name)``."""

    def deco(cls: type[Cloud]) -> type[Cloud]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def known_clouds() -> list[str]:
    return sorted(set(_MODULES) | set(_REGISTRY))


def get_cloud(name: str, **kwargs) -> Cloud:
    """Instantiate the cloud called ``name`` (importing its module on first use)."""
    if name not in _REGISTRY and name in _MODULES:
        importlib.import_module(_MODULES[name])
    if name not in _REGISTRY:
        raise SpotwiseError(f"unknown cloud {name!r}; allowed: {', '.join(known_clouds())}")
    return _REGISTRY[name](**kwargs)
