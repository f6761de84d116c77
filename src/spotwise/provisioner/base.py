"""The ``Cloud`` interface every provider implements, and the typed errors failover acts on.

Failover never string-matches error messages: each cloud module maps its API's errors to
:class:`CapacityError` (try the next zone/offer), :class:`QuotaError` and :class:`AuthError`
(skip the whole region/cloud). Every resource a cloud creates is tagged with ``spotwise-cluster``
and ``spotwise-job`` so :meth:`Cloud.list_nodes` can always find it again — that is what makes a
reconcile pass (``spotwise gc``) possible after any crash.

Every cloud speaks the same verbs — ``launch``, ``terminate``, ``list_nodes``, ``classify`` (an
API error to one of the typed errors), ``cluster_tags`` (what every resource of a launch is tagged
with), ``check_credentials``, ``leftovers`` (what a cluster left besides instances) — and what
they share lives here: the common tag keys, the shared request checks (:meth:`Cloud._validate`)
and the head offer read from ``data/head_prices.csv`` (:func:`head_offer`).

Clouds register themselves in :data:`CLOUDS` (``@register_cloud("aws")`` in their own module), so
adding one is one new file: :func:`get_cloud` and :func:`known_clouds` find it by importing every
module of this package. Those modules import no cloud SDK at import time (each SDK is an extra,
imported through :func:`spotwise.extras.require` where it is used).
"""

from __future__ import annotations

import csv
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from spotwise.provisioner.boot.shipping import NodeBuild, run_storage_uri, shipped_build
from spotwise.config import setting, where
from spotwise.errors import InputError, Problem, SpotwiseError
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner import instance_types
from spotwise.provisioner import head_path
from spotwise.provisioner.head_path import HeadEndpoint
from spotwise.provisioner.boot.script import DASHBOARD_PORT, HEAD_KEY, RAY_PORT
from spotwise.registry import Registry

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


class SiteError(ProvisionError):
    """This region cannot be used as configured (no subnet there, no image there): failover skips
    the region with this message in the attempts — a plan over several regions must not abort on
    one it cannot reach. ``problem`` names the setting and what it needs, as an InputError would."""

    def __init__(self, problem: Problem, *, cloud: str, region: str) -> None:
        super().__init__(f"{cloud}/{region} skipped: {problem}", cloud=cloud, region=region, code="site")
        self.problem = problem


#: what failover does about an error, most severe first: skip the cloud, the region, the offer
SEVERITY: tuple[type[ProvisionError], ...] = (AuthError, QuotaError, CapacityError)


@dataclass(frozen=True, slots=True)
class ErrorCodes:
    """A cloud API's error codes grouped by the typed error they mean (matched by code, never by
    message text); ``throttle`` codes are retried with backoff instead."""

    auth: frozenset[str]
    quota: frozenset[str]
    capacity: frozenset[str]
    throttle: frozenset[str] = frozenset()

    def kind(self, code: str | None) -> type[ProvisionError]:
        """The typed error of one code (:class:`ProvisionError` for a code of no group)."""
        for cls, codes in zip(SEVERITY, (self.auth, self.quota, self.capacity)):
            if code in codes:
                return cls
        return ProvisionError


def most_severe(kinds: list[type[ProvisionError]]) -> type[ProvisionError]:
    """Of several errors one call reported (an EC2 fleet's per-override errors, a GCP operation's
    error list), the one failover must act on: auth, then quota, then capacity."""
    return next((cls for cls in SEVERITY if cls in kinds), ProvisionError)


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


def cluster_tags(req: LaunchRequest, extra: Mapping[str, str] | None = None, *,
                 head_address: bool = True) -> dict[str, str]:
    """The tags every resource launched for ``req`` carries, before a cloud adapts their format.

    The common keys (cluster, job, market, role) are what ``list_nodes``/``gc`` find resources by
    on every cloud; ``extra`` is the cloud's own (its price record, a ``Name``); the head's
    address rides along (``head_address``) where nodes read it from their tags; the request's
    ``labels`` come last and win."""
    tags = {TAG_CLUSTER: req.cluster_id, TAG_JOB: req.job_id, TAG_MARKET: req.offer.market.value,
            TAG_ROLE: req.role, **(extra or {})}
    if head_address and req.head_address:
        tags[HEAD_KEY] = req.head_address
    tags.update(req.labels)
    return tags


class Cloud(ABC):
    """A place instances come from. Implementations are small and stateless where possible.

    Contract:
      * ``launch`` returns exactly the nodes that are up, or raises a typed error having released
        anything partially created (never a half-up fleet left silently).
      * ``terminate`` is idempotent: ending an already-ended instance is not an error.
      * ``list_nodes`` finds every live instance carrying our cluster tag (optionally one cluster,
        optionally only in given regions), including ones this process did not launch. A run calls
        it every :data:`~spotwise.engine.plan.options.NODE_POLL_S` (20 s) with its own regions: one or a
        few calls a minute, within every cloud's read limits.
      * ``classify`` maps the cloud's API errors to the typed errors above, by code.
      * ``leftovers`` finds (and ends) what clusters left besides instances, so ``down``/``gc``
        need no cloud-specific code.
    """

    name: str = ""

    #: whether ``launch`` fills a request from its ``alternatives`` too (one call trying several
    #: offers, e.g. an EC2 Fleet's overrides); False: ``offer`` only, and failover passes none.
    supports_alternatives: bool = False
    #: where this cloud's offers come from: the price catalog (True, every real cloud) or its own
    #: :meth:`offers` (the local cloud, which prices itself).
    priced_by_catalog: bool = True
    #: nodes run on this machine, so a ``file://`` checkpoint store is reachable from all of them.
    on_this_machine: bool = False
    #: regions an account has disabled until its owner enables them: a plan ranks them only where
    #: the user named them (:func:`spotwise.provisioner.sites.default_regions`, :meth:`site_problem`)
    opt_in_regions: frozenset[str] = frozenset()

    def site_problem(self, region: str, named: frozenset[str]) -> str | None:
        """Why a run cannot use ``region`` as this cloud is configured, knowable without asking the
        cloud (``named``: the regions the task names), or None. Each cloud registers its own rules
        by overriding this (:mod:`spotwise.provisioner.sites` says which and why); the default:
        nothing known. Never does I/O: the plan asks it for every region it ranks."""
        return None

    @abstractmethod
    def launch(self, request: LaunchRequest) -> list[Node]: ...

    @abstractmethod
    def terminate(self, nodes: list[Node]) -> None: ...

    @abstractmethod
    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        """Live instances carrying our cluster tag (one cluster's when ``cluster_id`` is given).
        ``regions``: the caller knows where to look (a run: its own regions) — a cloud that lists
        per region asks only those, and a failure there is raised, never read as "no nodes". None:
        wherever this cloud's resources may be (``gc``/``down``); a region that cannot be read is
        skipped and named in :attr:`skipped_regions`."""

    #: how often a run may list this cloud's nodes, when that is not the run's ``node_poll_s``: the
    #: local cloud reads its own state files, no API, so it is listed every second. None: the run's.
    list_period_s: float | None = None

    #: seconds after a launch during which a listing may still lack the new instance (EC2 is
    #: eventually consistent after ``CreateFleet``): a run does not take such a node for gone before
    #: then. 0: the cloud lists what it launched at once (the local cloud, the fakes).
    listing_lag_s: float = 0.0

    #: regions the last unrestricted :meth:`list_nodes` / :meth:`leftovers` could not read, with why
    #: (``gc``/``down`` report them); empty for clouds that list in one call.
    skipped_regions: dict[str, str] = {}

    def skipped_error(self) -> InputError:
        """The error of a plan left with no site because this cloud could not read any of its
        :attr:`skipped_regions` (a Slurm cluster that does not answer): one problem each."""
        return InputError([Problem(f"{self.name}/{r}", r, f"a reachable site ({why})")
                           for r, why in self.skipped_regions.items()], source=self.name)

    def queue(self, offer: Offer, nodes: int) -> Any:
        """What waits before ``nodes`` nodes of ``offer`` could start, for a cloud with a job queue
        (a Slurm partition): an object with ``describe() -> str`` and ``wait_hours() -> float |
        None``. None (every other cloud): nothing queues, a launch starts at once or fails."""
        return None

    def describe(self, node: Node) -> Node:
        """Fresh state of one node (default: look it up in ``list_nodes``)."""
        for n in self.list_nodes(node.cluster_id, regions=[node.region]):
            if n.instance_id == node.instance_id:
                return n
        node.state = "terminated"
        return node

    def wait_until_running(self, nodes: list[Node], timeout_s: float = 900.0) -> list[Node]:
        """Block until ``nodes`` are running and return their fresh state (default: as given)."""
        return nodes

    def offers(self) -> list[Offer]:
        """Worker offers this cloud prices itself (only the local cloud does, see
        :attr:`priced_by_catalog`; the others' come from the price catalog). Never the head."""
        return []

    # -- the verbs every cloud speaks the same way -----------------------------------------------
    def classify(self, exc: BaseException) -> type[ProvisionError]:
        """The typed error an exception of this cloud's API means (by its code, never its
        message): what failover acts on. Default: a typed error is itself, anything else is a
        plain :class:`ProvisionError`."""
        return type(exc) if isinstance(exc, ProvisionError) else ProvisionError

    def cluster_tags(self, req: LaunchRequest) -> dict[str, str]:
        """The tags (labels) every resource launched for ``req`` carries, in this cloud's format
        (default: :func:`cluster_tags` as is)."""
        return cluster_tags(req)

    def check_credentials(self) -> None:
        """Raise :class:`AuthError` (or an :class:`~spotwise.errors.InputError` for a missing
        setting) when this cloud cannot be called; called before anything is created. Default:
        nothing to check."""

    def leftovers(self, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
        """What clusters left besides instances (launch templates, security groups, NICs, disks,
        stray processes...), ended unless ``dry_run``; one line each. ``match=True``: those of
        ``cluster_ids`` (``down``); ``match=False``: those of every other cluster (``gc``).
        Default: nothing."""
        return []

    def _offer_problems(self, req: LaunchRequest, offer: Offer) -> list[Problem]:
        """This cloud's own checks of one offer of a request (see :meth:`_validate`)."""
        return []

    def _validate(self, req: LaunchRequest) -> None:
        """Check a request before anything is created: every offer is this cloud's, in a market it
        launches (plus :meth:`_offer_problems`), the count is >= 1, the instance types are known;
        then the credentials. One :class:`~spotwise.errors.InputError` lists every problem."""
        problems: list[Problem] = []
        for o in req.offers:
            if o.cloud != self.name:
                problems.append(Problem("offer.cloud", o.cloud, self.name))
            problems += self._offer_problems(req, o)
            if o.market not in (Market.SPOT, Market.ON_DEMAND):
                problems.append(Problem("offer.market", o.market.value, "spot or on-demand"))
        if req.count < 1:
            problems.append(Problem("count", req.count, "a whole number >= 1"))
        if problems:
            raise InputError(problems, source=f"{self.name} launch")
        for o in req.offers:
            instance_types.validate_offer(o)
        self.check_credentials()

    # -- what a training run needs of a cloud (the orchestrator's only view of it) ---------------
    #: whether the launcher reaches this cloud's head as ``SPOTWISE_HEAD_PATH`` says (ssh to its
    #: public address by default, :mod:`spotwise.provisioner.head_path`); False: the cloud knows its
    #: own way (the local cloud's loopback, a Slurm login host)
    head_over_ssh: bool = False
    ray_port: int = RAY_PORT
    dashboard_port: int = DASHBOARD_PORT
    control_port: int = DASHBOARD_PORT + 1

    #: instance types (fnmatch patterns) this cloud's node image cannot run, with why: the plan
    #: never offers them (e.g. a GPU whose driver the image lacks)
    unlaunchable: dict[str, str] = {}

    @classmethod
    def why_unlaunchable(cls, instance_type: str) -> str | None:
        """Why this cloud's nodes cannot run ``instance_type`` (None: they can)."""
        import fnmatch

        return next((why for pat, why in cls.unlaunchable.items() if fnmatch.fnmatchcase(instance_type, pat)), None)

    #: the storage schemes this cloud's nodes reach with their own identity (AWS: its instance
    #: profile for ``s3://``; GCP: its service account for ``gs://``); a launch whose storage or
    #: token file has another scheme is refused before anything starts (keys baked into an image
    #: are not an identity). Clouds whose nodes run on this machine read any.
    node_storage_schemes: tuple[str, ...] = ("s3",)

    #: the setting naming this cloud's default checkpoint store (``SPOTWISE_AWS_STORAGE``…): the
    #: store of a run on this cloud whose task and launch name none; None: no such setting
    default_storage_setting: str | None = None

    @classmethod
    def storage_identity_problem(cls, storage_uri: str) -> Problem | None:
        """What is missing for this cloud's nodes to reach ``storage_uri`` with their own identity
        (checked before anything launches; None: nothing, or nothing this cloud can tell)."""
        return None

    #: the build of spotwise this run's nodes install (:mod:`spotwise.build`), shipped through the
    #: run's storage; None: nodes need an image that already holds spotwise
    node_build: NodeBuild | None = None
    #: the storage URI of this run's store on this cloud (``STORE``; the run is ``STORE/JOB_ID``), as
    #: :meth:`for_task` found it; None where the run has none (GCP: its nodes' shutdown hold)
    run_storage: str | None = None

    @classmethod
    def for_task(cls, spec, opts) -> "Cloud":
        """The cloud as one run of ``spec`` wants it: its nodes install the launcher's own build,
        shipped through the run's storage (the local cloud reads its simulated market from the
        task instead, and its nodes run this machine's spotwise)."""
        cloud = cls()
        cloud.run_storage = run_storage_uri(spec, opts, cls.name)
        cloud.node_build = shipped_build(cloud.run_storage)
        return cloud

    #: seconds between the cloud's interruption notice and the kill (AWS 120, GCP 30, Azure >= 30);
    #: training keeps its checkpoints close enough that a save that cannot fit it loses at most
    #: about one window of work. None: no bound (the local cloud's simulated market).
    notice_window_s: float | None = None

    def head_offer(self, region: str, zone: str) -> Offer:
        """The on-demand offer the cluster's Ray head runs on in ``region``: a small CPU machine
        that holds the run's state, so losing a spot worker never loses the head."""
        raise SpotwiseError(f"{self.name} has no head instance configured")

    def node_charges(self, region: str, market: str, *, public_ip: bool | None = None,
                     instance_type: str | None = None) -> list:
        """What this cloud bills for one node besides the instance — its boot disk and public IPv4
        address — at their published prices (a list of :class:`spotwise.pricing.attached.Charge`).
        ``public_ip``: whether the node has one (a launched node's ``extra["public_ip"]``); None: as
        this cloud is configured (the plan). ``instance_type``: the node's, where the disk type
        depends on it (:meth:`boot_disk_type`). Default: :func:`spotwise.pricing.attached.node_charges`."""
        from spotwise.pricing.attached import node_charges

        return node_charges(self, region, market, public_ip=public_ip,
                            disk_type=self.boot_disk_type(instance_type))

    def boot_disk_type(self, instance_type: str | None) -> str | None:
        """The boot disk type this cloud creates for ``instance_type`` where it depends on the
        machine (GCP: per series), so the plan and the ledger bill the disk as created; None: the
        cloud's one type (:data:`spotwise.pricing.attached.BOOT_DISKS`)."""
        return None

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """Create what the cluster's nodes share (AWS: its security group). Idempotent."""

    def endpoint(self, cluster_id: str, head: Node) -> HeadEndpoint:
        """Where the orchestrator reaches the head: a cloud whose heads are reached over ssh
        (:attr:`head_over_ssh`), through the cluster's ssh tunnel to the head's public address
        unless ``SPOTWISE_HEAD_PATH=private``; otherwise its private address (from inside the VPC)."""
        if self.head_over_ssh and head_path.head_path().ssh:
            return head_path.ssh_endpoint(self, cluster_id, head)
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


def env_list(name: str) -> list[str]:
    """A comma-separated environment setting (subnets, regions, CIDRs) as a list; unset: []."""
    return [x.strip() for x in (setting(name) or "").split(",") if x.strip()]


def env_cidrs(name: str, source: str, default: tuple[str, ...] = ()) -> list[str]:
    """CIDR blocks from the comma-separated setting ``name`` (``default`` when unset), each checked
    and normalised (``10.0.0.1/8`` → ``10.0.0.0/8``); a bad one is an InputError from ``source``
    naming the setting. Every cloud's client CIDRs open the head's ports, so all read them alike."""
    import ipaddress

    out = []
    for c in env_list(name) or list(default):
        try:
            out.append(str(ipaddress.ip_network(c, strict=False)))
        except ValueError:
            raise InputError(Problem(where(name), c, "IPv4 CIDRs such as 10.42.0.0/16, comma-separated"),
                             source=source) from None
    return out


def env_ports(source: str) -> tuple[int, int, int]:
    """``(ray, dashboard, control)`` ports of a real cloud's nodes: ``SPOTWISE_RAY_PORT``,
    ``SPOTWISE_RAY_DASHBOARD_PORT``, ``SPOTWISE_CONTROL_PORT``, else the bootstrap defaults. The
    node's boot script, its firewall and the orchestrator must agree on them, so every cloud reads
    them the same way; a bad value is an InputError from ``source``."""

    def port(name: str, default: int) -> int:
        raw = setting(name)
        if not raw:
            return default
        value = int(raw) if raw.isdigit() else 0
        if not 1 <= value <= 65535:
            raise InputError(Problem(where(name), raw, "a TCP port 1..65535"), source=source)
        return value

    return (port("SPOTWISE_RAY_PORT", RAY_PORT), port("SPOTWISE_RAY_DASHBOARD_PORT", DASHBOARD_PORT),
            port("SPOTWISE_CONTROL_PORT", DASHBOARD_PORT + 1))


@lru_cache(maxsize=1)
def head_prices() -> dict[tuple[str, str, str], tuple[float, str, str]]:
    """``{(cloud, instance_type, region): (usd_per_hour, source, as_of)}`` of Ray head instances
    (package data ``provisioner/data/head_prices.csv``)."""
    text = resources.files("spotwise.provisioner").joinpath("data/head_prices.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#"))
    return {(r["cloud"], r["instance_type"], r["region"]): (float(r["usd_per_hour"]), r["source"], r["as_of"])
            for r in rows}


def head_offer(cloud: str, head_type: str, region: str, zone: str, *, fallback_region: str,
               env_var: str) -> Offer:
    """The on-demand offer of a cluster's Ray head (``head_type``, a small CPU machine set by
    ``env_var``) in ``region``/``zone``, priced from :func:`head_prices`. A region without a row is
    charged ``fallback_region``'s price and the offer's source says so; a type with neither is an
    :class:`~spotwise.errors.InputError` on ``env_var`` listing the types that have a price."""
    it = instance_types.lookup(cloud, head_type)
    prices = head_prices()
    hit = prices.get((cloud, head_type, region))
    if hit is None:
        base = prices.get((cloud, head_type, fallback_region))
        if base is None or it is None:
            raise InputError(Problem(where(env_var), head_type, "a machine type with a head price: "
                                     + ", ".join(sorted({k[1] for k in prices if k[0] == cloud}))),
                             source=cloud)
        hit = (base[0], f"{base[1]}; {fallback_region} price assumed for {region}", base[2])
    usd, source, as_of = hit
    return Offer(cloud=cloud, instance_type=head_type, accelerator="cpu", accelerator_count=0,
                 region=region, zone=zone, market=Market.ON_DEMAND, usd_per_hour=usd,
                 vcpus=it.vcpus if it else None, memory_gib=it.memory_gib if it else None,
                 source=source, as_of=as_of)


#: every cloud, by name: filled by the ``@register_cloud`` decorators of this package's modules
CLOUDS: Registry[type[Cloud]] = Registry("cloud", ("spotwise.provisioner.clouds",), field="cloud")


def register_cloud(name: str) -> Callable[[type[Cloud]], type[Cloud]]:
    """Class decorator: make a Cloud available as ``get_cloud(name)`` (and name it ``name``)."""

    def deco(cls: type[Cloud]) -> type[Cloud]:
        cls.name = name
        return CLOUDS.register(name)(cls)

    return deco


def known_clouds() -> list[str]:
    """Every cloud's name, sorted."""
    return CLOUDS.names()


def cloud_class(name: str) -> type[Cloud]:
    """The class of the cloud called ``name`` (an unknown name is an InputError listing the known)."""
    return CLOUDS.get(name)


def get_cloud(name: str, **kwargs: Any) -> Cloud:
    """Instantiate the cloud called ``name``."""
    return cloud_class(name)(**kwargs)
