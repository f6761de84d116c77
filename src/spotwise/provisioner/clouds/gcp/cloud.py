"""GCP: Spot (or standard) VMs through ``google-cloud-compute`` over REST.

What a run gets: an on-demand CPU head (``n2-standard-2`` unless ``SPOTWISE_GCP_HEAD_TYPE``),
GPU workers as Spot VMs (``provisioning_model=SPOT``, ``instance_termination_action=DELETE``) or
standard VMs, the boot script as ``startup-script`` metadata, **no external IP** (unless
``SPOTWISE_GCP_EXTERNAL_IP=1``) and a node service account whose scopes are
``devstorage.read_write`` and ``compute`` (``gs://`` storage and self-delete as that account,
checked before launch: :mod:`~spotwise.provisioner.clouds.gcp.identity`). Each cluster gets one network
tag and two firewall rules (``prepare_cluster``): everything between the cluster's own nodes, and
the head's dashboard/control ports from the VPC's subnet ranges (or ``SPOTWISE_GCP_CLIENT_CIDRS``)
only. Firewall rules cannot carry labels, so their name and description carry the cluster id;
``cleanup_cluster`` and ``gc`` delete them with any disk or address a cluster left.

One ``instances.insert`` per node: GPU machine families (A2, A3, G2) carry their GPUs in the
machine type, so no ``guestAccelerators`` are needed (A3 does not accept them). Spot VMs use
``provisioning_model=SPOT`` with ``instance_termination_action=DELETE`` — a preempted node
disappears instead of lingering as a stopped VM with a billed disk.

Errors arrive two ways and are mapped by code: a DONE operation carrying
``error.errors[].code`` (``ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]`` -> CapacityError,
``QUOTA_EXCEEDED`` -> QuotaError) or an HTTP error (401 -> AuthError; 403 by its ``reason``:
``quotaExceeded`` -> QuotaError, rate limits -> retried, else AuthError; 429 -> retried).

The SDK is the ``spotwise[gcp]`` extra (google-cloud-compute), imported where it is used.
Operations are polled through a :class:`ZoneOperationsClient` built with the same client options
— the SDK's own ``ExtendedOperation`` poller would ignore a custom endpoint. Endpoint from
``SPOTWISE_GCP_ENDPOINT`` (tests: a local fake with ``AnonymousCredentials``); project from
``SPOTWISE_GCP_PROJECT`` or the default credentials; image from ``SPOTWISE_GCP_IMAGE``; network
and subnetwork from ``SPOTWISE_GCP_NETWORK`` / ``SPOTWISE_GCP_SUBNETWORK`` (``{region}`` in it: the node's).

Price billed: the catalog price of the offer the node was launched from, with its source and
date, written on the instance (a label in micro-dollars, source and date as metadata) so a later
process — ``gc``, a restarted orchestrator — bills the same figure. GCP publishes no per-zone spot
price API to read at launch (unlike EC2's DescribeSpotPriceHistory).
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any, Callable

from spotwise.config import setting, where
from spotwise.errors import InputError, Problem
from spotwise.extras import require
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner import base
from spotwise.provisioner.base import (
    TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE, AuthError, CapacityError, Cloud, ErrorCodes, LaunchRequest,
    Node, ProvisionError, QuotaError, SiteError, cluster_tags, env_cidrs, env_ports, most_severe, register_cloud)
from spotwise.provisioner.boot.script import HEAD_KEY, BootstrapSpec, label_value, render_script
from spotwise.provisioner.clouds.gcp.machines import boot_disk_type, nic_type
from spotwise.provisioner.clouds.gcp.outbound import outbound_problem as _outbound_problem, site_problem as _site_problem
from spotwise.provisioner.clouds.gcp.shutdown import shutdown_items
from spotwise.provisioner.clouds.gcp.names import DESC_KEY as _DESC_KEY
from spotwise.provisioner.clouds.gcp.names import (  # noqa: F401 - FIREWALL_PREFIX: gc's and the tests' name
    FIREWALL_PREFIX, firewall_names, instance_name, network_tag, ssh_firewall_name)
from spotwise.provisioner.head_path import authorized_key_line, forget_cluster, head_path, launcher_cidr
from spotwise.provisioner.clouds.gcp.identity import (  # noqa: F401 - NODE_SCOPES: the default, named here too
    NODE_SCOPES, NODE_STORAGE_SCHEMES, node_scopes, node_service_account, storage_identity_problem)
from spotwise.utils.retry import retry_after_header, with_backoff

log = logging.getLogger(__name__)

LABEL_PRICE = "spotwise-price-microusd"   # label values cannot hold '.', so micro-dollars
META_PRICE_SOURCE = "spotwise-price-source"   # "<source> @ <as_of>" (labels cannot hold it)
DEFAULT_HEAD_TYPE = "n2-standard-2"
PREEMPTED_OP = "compute.instances.preempted"
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"

CAPACITY_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                            "RESOURCE_POOL_EXHAUSTED", "UNSUPPORTED_OPERATION_FOR_ZONE",
                            "RESOURCE_NOT_FOUND_IN_ZONE", "STOCKOUT"})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "QUOTA_LIMIT_EXCEEDED", "limitExceeded"})
AUTH_REASONS = frozenset({"forbidden", "authError", "insufficientPermissions", "accessNotConfigured",
                          "SERVICE_DISABLED", "ACCESS_TOKEN_TYPE_UNSUPPORTED", "PERMISSION_DENIED"})
THROTTLE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
                              "backendError"})
#: the codes of a DONE operation's ``error.errors[]`` (HTTP errors: :meth:`GcpCloud.classify`)
CODES = ErrorCodes(auth=AUTH_REASONS, quota=QUOTA_CODES, capacity=CAPACITY_CODES, throttle=THROTTLE_REASONS)


def _sdk(module: str = "google.cloud.compute_v1") -> ModuleType:
    """google-cloud-compute (or google.auth / google.api_core, which it brings), or a MissingExtra
    naming ``spotwise[gcp]``."""
    return require(module, "gcp", "the GCP cloud")


def _reasons(exc: BaseException) -> list[str]:
    """Error reasons of a google.api_core HTTP error (``errors[].reason`` and ErrorInfo)."""
    out = [e.get("reason") for e in getattr(exc, "errors", None) or () if isinstance(e, dict)]
    try:
        reason = getattr(exc, "reason", None)
    # broad on purpose: api_core's ``reason`` property parses the error's details, and an error
    # without ErrorInfo may fail that in more than one way; it then simply has no reason
    except Exception:  # noqa: BLE001
        reason = None
    if reason:
        out.append(reason)
    return [r for r in out if r]


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "code", None) if isinstance(getattr(exc, "code", None), int) else None


def _is_throttle(exc: BaseException) -> bool:
    return _status(exc) == 429 or (_status(exc) == 403 and bool(set(_reasons(exc)) & THROTTLE_REASONS)) \
        or _status(exc) == 503


def _retry_after(exc: BaseException) -> float | None:
    """A throttled answer's ``Retry-After`` (the REST transport keeps the HTTP response)."""
    return retry_after_header(getattr(getattr(exc, "response", None), "headers", None))




@register_cloud("gcp")
class GcpCloud(Cloud):
    """Compute Engine instances in one project."""

    notice_window_s = 30.0        # preemption notice (ACPI soft-off 30 s before the kill)
    head_over_ssh = True          # the launcher reaches the head over ssh unless SPOTWISE_HEAD_PATH=private
    node_storage_schemes = NODE_STORAGE_SCHEMES   # gs:// as the node's service account (identity.py)
    default_storage_setting = "SPOTWISE_GCP_STORAGE"
    boot_disk_type = staticmethod(boot_disk_type)  # type: ignore[assignment]  # per series (gcp.machines), billed as made

    @classmethod
    def storage_identity_problem(cls, storage_uri: str) -> Problem | None:
        return storage_identity_problem(storage_uri)

    def __init__(self, *, project: str | None = None, credentials: Any = None, endpoint: str | None = None,
                 image: str | None = None, network: str | None = None, subnetwork: str | None = None,
                 service_account: str | None = None, boot_disk_gb: int = 200,
                 external_ip: bool | None = None, sleep: Callable[[float], None] = time.sleep,
                 attempts: int = 6, op_timeout_s: float = 600.0) -> None:
        # the API endpoint (not ``Cloud.endpoint``, the head's address the orchestrator reaches)
        self.api_endpoint = endpoint or setting("SPOTWISE_GCP_ENDPOINT") or None
        self._credentials = credentials
        self._project = project or setting("SPOTWISE_GCP_PROJECT") or None
        self.image = image or setting("SPOTWISE_GCP_IMAGE") or DEFAULT_IMAGE
        self.network = network or setting("SPOTWISE_GCP_NETWORK") or "global/networks/default"
        self.subnetwork = subnetwork or setting("SPOTWISE_GCP_SUBNETWORK") or None
        self.service_account = service_account or node_service_account()
        self.node_scopes = node_scopes()
        self.boot_disk_gb = boot_disk_gb
        if external_ip is None:
            raw = setting("SPOTWISE_GCP_EXTERNAL_IP") or "0"
            if raw not in ("0", "1"):
                raise InputError(Problem(where("SPOTWISE_GCP_EXTERNAL_IP"), raw, "0 (no external IP, default) or 1"),
                                 source="gcp")
            external_ip = raw == "1"
        self.external_ip = external_ip
        self.head_type = setting("SPOTWISE_GCP_HEAD_TYPE") or DEFAULT_HEAD_TYPE
        self.client_cidrs = env_cidrs("SPOTWISE_GCP_CLIENT_CIDRS", "gcp")
        self.ray_port, self.dashboard_port, self.control_port = env_ports("gcp")
        self._sleep = sleep
        self._attempts = attempts
        self._op_timeout_s = op_timeout_s
        self._c: dict[str, Any] = {}
        self._prepared: set[str] = set()

    outbound_problem = _outbound_problem      # a region without Cloud NAT: the plan leaves it out
    site_problem = _site_problem              # a region other than SPOTWISE_GCP_SUBNETWORK's

    # -- plumbing --------------------------------------------------------------------------------
    def check_credentials(self) -> None:
        """Resolve the credentials (given, anonymous for a fake, else the application default
        ones) and the project; raise AuthError without credentials, InputError without a project."""
        if self._credentials is not None and self._project:
            return
        if self._credentials is None and setting("SPOTWISE_GCP_ANONYMOUS") == "1":
            self._credentials = _sdk("google.auth.credentials").AnonymousCredentials()
        if self._credentials is None:
            google_auth = _sdk("google.auth")
            try:
                self._credentials, project = google_auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"])
            except _sdk("google.auth.exceptions").DefaultCredentialsError:
                raise AuthError("gcp: no credentials found; set GOOGLE_APPLICATION_CREDENTIALS or run "
                                "'gcloud auth application-default login'", cloud="gcp") from None
            self._project = self._project or project
        if not self._project:
            raise InputError(Problem("SPOTWISE_GCP_PROJECT", None, "the GCP project id to launch in"),
                             source="gcp")

    @property
    def project(self) -> str:
        self.check_credentials()
        assert self._project is not None   # check_credentials raised otherwise
        return self._project

    def _client(self, kind: str):
        """One REST client of ``compute_v1`` (``InstancesClient``, ``FirewallsClient``...) on our endpoint."""
        if kind not in self._c:
            compute_v1 = _sdk()
            client_options = _sdk("google.api_core.client_options")
            self.check_credentials()
            opts = client_options.ClientOptions(api_endpoint=self.api_endpoint) if self.api_endpoint else None
            self._c[kind] = getattr(compute_v1, kind)(credentials=self._credentials, transport="rest", client_options=opts)
        return self._c[kind]

    def _clients(self):
        return self._client("InstancesClient"), self._client("ZoneOperationsClient")

    def classify(self, exc: BaseException) -> type[ProvisionError]:
        """An HTTP error by its status and reasons: a quota or capacity reason first, then 401, or
        403 without a rate-limit reason, is auth; a credentials refresh failing is auth too."""
        if isinstance(exc, ProvisionError):
            return type(exc)
        if isinstance(exc, _sdk("google.auth.exceptions").GoogleAuthError):
            return AuthError
        status, reasons = _status(exc), set(_reasons(exc))
        if reasons & QUOTA_CODES:
            return QuotaError
        if reasons & CAPACITY_CODES:
            return CapacityError
        if status == 401 or (status == 403 and not reasons & THROTTLE_REASONS):
            return AuthError
        return ProvisionError

    def _call(self, what: str, fn: Callable[[], Any], *, region: str | None = None) -> Any:
        api_errors = _sdk("google.api_core.exceptions")
        auth_errors = _sdk("google.auth.exceptions")
        try:
            return with_backoff(fn, should_retry=_is_throttle, attempts=self._attempts, sleep=self._sleep,
                                retry_after=_retry_after)
        except auth_errors.GoogleAuthError as e:  # a 401 makes the session refresh; that failing is an auth error
            raise AuthError(f"gcp {what} failed: credentials rejected or not refreshable ({e})",
                            cloud="gcp", region=region, code="authError") from None
        except api_errors.GoogleAPICallError as e:
            cls = self.classify(e)
            reasons = _reasons(e)
            raise cls(f"gcp {what} failed: HTTP {_status(e)} {reasons}: {getattr(e, 'message', e)}",
                      cloud="gcp", region=region, code=(reasons or [str(_status(e))])[0]) from None

    def _wait(self, op, zone: str | None, what: str, region: str | None, *, regional: bool = False):
        """Poll an operation to DONE through our own operations client — the zone's, the region's
        (``regional``: ``region`` is its scope) or the global one (``zone`` None) — and raise its
        error, typed by code."""
        compute_v1 = _sdk()
        deadline = time.monotonic() + self._op_timeout_s
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise ProvisionError(f"gcp {what}: operation {op.name} not done after {self._op_timeout_s}s",
                                     cloud="gcp", region=region)
            if regional:
                rops = self._client("RegionOperationsClient")
                op = self._call(f"{what} (wait)", lambda: rops.wait(project=self.project, region=region,
                                                                    operation=op.name), region=region)
            elif zone:
                ops = self._client("ZoneOperationsClient")
                op = self._call(f"{what} (wait)", lambda: ops.wait(project=self.project, zone=zone,
                                                                   operation=op.name), region=region)
            else:
                gops = self._client("GlobalOperationsClient")
                op = self._call(f"{what} (wait)", lambda: gops.wait(project=self.project, operation=op.name),
                                region=region)
        errors = list(op.error.errors) if op.error else []
        if errors:
            codes = [e.code for e in errors]
            classes = [CODES.kind(c) for c in codes]
            cls = most_severe(classes)
            code = next((c for c, k in zip(codes, classes) if k is cls), codes[0])
            raise cls(f"gcp {what} failed: " + "; ".join(f"{e.code}: {e.message}" for e in errors),
                      cloud="gcp", region=region, code=code)
        return op

    # -- what a run needs beyond launch/terminate ------------------------------------------------
    def head_offer(self, region: str, zone: str) -> Offer:
        """The on-demand CPU head in ``zone``, priced from ``data/head_prices.csv`` (a region
        without a row is charged us-central1's price and its source says so)."""
        return base.head_offer("gcp", self.head_type, region, zone, fallback_region="us-central1",
                               env_var="SPOTWISE_GCP_HEAD_TYPE")

    def vpc_cidrs(self, region: str) -> list[str]:
        """The IP ranges of the network's subnetworks in ``region`` (who may reach the head)."""
        compute_v1 = _sdk()
        subnets = self._client("SubnetworksClient")
        req = compute_v1.ListSubnetworksRequest(project=self.project, region=region)
        net = self.network.rsplit("/", 1)[-1]
        sub = (self.subnetwork or "").rsplit("/", 1)[-1].replace("{region}", region)    # "" : any
        out = []
        for sn in self._call("subnetworks.list", lambda: subnets.list(request=req), region=region):
            if sn.network.rsplit("/", 1)[-1] == net and (not sub or sn.name == sub):
                out.append(sn.ip_cidr_range)
        if not out:
            raise SiteError(Problem("SPOTWISE_GCP_SUBNETWORK", self.subnetwork, f"a subnetwork of {self.network} in "
                                    f"{region} (none there; or set SPOTWISE_GCP_CLIENT_CIDRS)"),
                            cloud="gcp", region=region)   # a plan over several regions skips this one
        return out

    def firewall_bodies(self, cluster_id: str, job_id: str, region: str) -> list:
        """The cluster's two ingress rules (public so tests and docs can show them): all traffic
        between nodes carrying the cluster's tag (Ray, gloo/NCCL), and the head's dashboard and
        control ports from the VPC (or ``SPOTWISE_GCP_CLIENT_CIDRS``). Nothing faces the internet."""
        compute_v1 = _sdk()
        tag = network_tag(cluster_id)
        internal, clients = firewall_names(cluster_id)
        desc = f"spotwise {_DESC_KEY}{cluster_id} spotwise-job={job_id}"
        cidrs = self.client_cidrs or self.vpc_cidrs(region)
        return [
            compute_v1.Firewall(name=internal, network=self.network, direction="INGRESS", priority=1000,
                                description=desc, source_tags=[tag], target_tags=[tag],
                                allowed=[compute_v1.Allowed(I_p_protocol=p) for p in ("tcp", "udp", "icmp")]),
            compute_v1.Firewall(name=clients, network=self.network, direction="INGRESS", priority=1000,
                                description=desc, source_ranges=cidrs, target_tags=[tag],
                                allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=[
                                    str(self.dashboard_port), str(self.control_port)])]),
        ] + ([compute_v1.Firewall(name=ssh_firewall_name(cluster_id), network=self.network, direction="INGRESS",
                                  priority=1000, description=desc, source_ranges=[launcher_cidr()], target_tags=[tag],
                                  allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])])]
             if head_path().ssh else [])     # the launcher's ssh to the head, from its own address only

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """Create the cluster's firewall rules (idempotent: an existing rule of the same name is kept)."""
        if cluster_id in self._prepared:
            return
        fw = self._client("FirewallsClient")
        for body in self.firewall_bodies(cluster_id, job_id, region):
            try:
                op = self._call("firewalls.insert", lambda: fw.insert_unary(project=self.project,
                                                                             firewall_resource=body), region=region)
                self._wait(op, None, f"firewall {body.name}", region)
            except ProvisionError as e:
                if e.code != "alreadyExists":
                    raise
        self._prepared.add(cluster_id)

    def was_preempted(self, node: Node) -> bool:
        """True when Compute Engine recorded a ``compute.instances.preempted`` operation for the
        node (what GCP logs when it reclaims a Spot VM); a node gone without one was lost."""
        if node.market != "spot":
            return False
        compute_v1 = _sdk()
        ops = self._client("ZoneOperationsClient")
        req = compute_v1.ListZoneOperationsRequest(project=self.project, zone=node.zone,
                                                   filter=f'operationType = "{PREEMPTED_OP}"')
        try:
            found = self._call("zoneOperations.list", lambda: ops.list(request=req), region=node.region)
            return any(op.target_link.rsplit("/", 1)[-1] == node.instance_id for op in found)
        except ProvisionError as e:
            log.warning("could not read %s's operations (counted as preempted: spot): %s", node.instance_id, e)
            return True

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        """After the cluster's instances are gone: delete its firewall rules and any disk or
        address it left (boot disks go with their instance; a failed insert can leave one)."""
        out = self.delete_leftovers(self.find_leftovers({cluster_id}, match=True))
        self._prepared.discard(cluster_id)
        return out + forget_cluster("gcp", cluster_id)      # its ssh tunnel and key, if it had them

    # -- leftovers (cleanup and gc) ---------------------------------------------------------------
    def list_firewalls(self) -> list[tuple[str, str]]:
        """``(name, cluster_id)`` of every spotwise firewall rule (read from its description)."""
        compute_v1 = _sdk()
        fw = self._client("FirewallsClient")
        req = compute_v1.ListFirewallsRequest(project=self.project)
        out = []
        for r in self._call("firewalls.list", lambda: fw.list(request=req)):
            if r.name.startswith(FIREWALL_PREFIX) and _DESC_KEY in (r.description or ""):
                cid = r.description.split(_DESC_KEY, 1)[1].split()[0]
                out.append((r.name, cid))
        return out

    def list_disks(self) -> list[tuple[str, str, str, bool]]:
        """``(zone, name, cluster_id, in_use)`` of every disk carrying our cluster label."""
        compute_v1 = _sdk()
        disks = self._client("DisksClient")
        req = compute_v1.AggregatedListDisksRequest(project=self.project, filter=f"labels.{TAG_CLUSTER}:*")
        out = []
        for scope, scoped in self._call("disks.aggregatedList", lambda: disks.aggregated_list(request=req)):
            for d in scoped.disks:
                out.append((scope.rsplit("/", 1)[-1], d.name, dict(d.labels).get(TAG_CLUSTER, ""), bool(list(d.users))))
        return out

    def list_addresses(self) -> list[tuple[str, str, str]]:
        """``(region, name, cluster_id)`` of every address carrying our cluster label."""
        compute_v1 = _sdk()
        addrs = self._client("AddressesClient")
        req = compute_v1.AggregatedListAddressesRequest(project=self.project, filter=f"labels.{TAG_CLUSTER}:*")
        out = []
        for scope, scoped in self._call("addresses.aggregatedList", lambda: addrs.aggregated_list(request=req)):
            for a in scoped.addresses:
                out.append((scope.rsplit("/", 1)[-1], a.name, dict(a.labels).get(TAG_CLUSTER, "")))
        return out

    def leftovers(self, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
        """What clusters left besides instances (see :meth:`find_leftovers`), deleted unless
        ``dry_run``; one line each (the shared hook of ``reconcile.gc``)."""
        found = self.find_leftovers(cluster_ids, match=match)
        if dry_run:
            return [f"gcp {kind} {name} ({scope})" for kind, scope, name in found]
        return self.delete_leftovers(found)

    def find_leftovers(self, cluster_ids: set[str], *, match: bool) -> list[tuple[str, str, str]]:
        """``(kind, scope, name)`` of what clusters left besides instances: firewall rules,
        unattached disks, addresses — of ``cluster_ids`` (``match``) or of every other cluster.
        Label values are lowercased, so ids are compared lowercased."""
        ids = {label_value(c).lower() for c in cluster_ids}

        def pick(cid: str) -> bool:
            return (label_value(cid).lower() in ids) == match

        out = [("firewall", "global", name) for name, cid in self.list_firewalls() if pick(cid)]
        out += [("disk", zone, name) for zone, name, cid, used in self.list_disks() if pick(cid) and not used]
        out += [("address", region, name) for region, name, cid in self.list_addresses() if pick(cid)]
        return out

    def delete_leftovers(self, items: list[tuple[str, str, str]]) -> list[str]:
        """Delete what :meth:`find_leftovers` found; a 404 (already gone) is not an error."""
        out = []
        for kind, scope, name in items:
            try:
                if kind == "firewall":
                    c = self._client("FirewallsClient")
                    op = self._call("firewalls.delete", lambda: c.delete_unary(project=self.project, firewall=name))
                    self._wait(op, None, f"delete firewall {name}", None)
                elif kind == "disk":
                    c = self._client("DisksClient")
                    op = self._call("disks.delete", lambda: c.delete_unary(project=self.project, zone=scope, disk=name))
                    self._wait(op, scope, f"delete disk {name}", scope.rsplit("-", 1)[0])
                else:
                    c = self._client("AddressesClient")
                    op = self._call("addresses.delete", lambda: c.delete_unary(project=self.project, region=scope,
                                                                                address=name))
                    self._wait(op, None, f"delete address {name}", scope, regional=True)
            except ProvisionError as e:
                if e.code in ("notFound", "404"):
                    continue
                raise
            out.append(f"gcp {kind} {name} ({scope})")
        return out

    # -- request ----------------------------------------------------------------------------------
    def _offer_problems(self, req: LaunchRequest, offer: Offer) -> list[Problem]:
        """GCP launches per zone: the offer names a zone of its region."""
        if not offer.zone:
            return [Problem("offer.zone", offer.zone, f"a zone of {offer.region} (GCP launches per zone)")]
        if not offer.zone.startswith(offer.region + "-"):
            return [Problem("offer.zone", offer.zone, f"a zone of {offer.region}")]
        return []

    def cluster_tags(self, req: LaunchRequest) -> dict[str, str]:
        """The common tags plus the price (in micro-dollars), as GCP labels: lowercase keys and
        values of ``[a-z0-9_-]``. The head's address is instance metadata instead (no ':' in a label)."""
        labels = cluster_tags(req, {LABEL_PRICE: str(round(req.offer.usd_per_hour * 1e6))}, head_address=False)
        return {k.lower(): label_value(v).lower() for k, v in labels.items()}

    def instance_body(self, req: LaunchRequest, name: str):
        """The ``Instance`` resource for one node (public so tests and docs can show it)."""
        compute_v1 = _sdk()
        o = req.offer
        over_ssh = req.role == "head" and head_path().ssh      # an external address and the cluster's key
        script = render_script(BootstrapSpec(
            cloud="gcp", cluster_id=req.cluster_id, job_id=req.job_id, role=req.role, region=o.region,
            zone=o.zone, market=o.market.value, instance_type=o.instance_type,
            accelerator_count=o.accelerator_count, head_address=req.head_address,
            ray_port=self.ray_port, dashboard_port=self.dashboard_port, extras="gcp",
            build=self.node_build.for_boot() if self.node_build else None,
            ssh_authorized_key=authorized_key_line(req.cluster_id) if over_ssh else None))
        items = [compute_v1.Items(key="startup-script", value=script),
                 compute_v1.Items(key=META_PRICE_SOURCE, value=f"{o.source} @ {o.as_of}")]
        if req.head_address:
            items.append(compute_v1.Items(key=HEAD_KEY, value=req.head_address))
        items += shutdown_items(compute_v1, self.run_storage, req.job_id)   # a preemption waits for the checkpoint
        if o.accelerator_count:      # a Deep Learning image installs its NVIDIA driver only when asked
            items.append(compute_v1.Items(key="install-nvidia-driver", value="True"))
        labels = self.cluster_tags(req)
        if o.market is Market.SPOT:
            scheduling = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                               on_host_maintenance="TERMINATE", automatic_restart=False)
        else:
            scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                               automatic_restart=True)
        nic = compute_v1.NetworkInterface(network=self.network, nic_type=nic_type(o.instance_type))
        if self.subnetwork:
            nic.subnetwork = self.subnetwork.replace("{region}", o.region)   # infra/gcp: one per region
        if self.external_ip or over_ssh:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        return compute_v1.Instance(
            name=name,
            machine_type=f"zones/{o.zone}/machineTypes/{o.instance_type}",
            labels=labels,
            tags=compute_v1.Tags(items=[network_tag(req.cluster_id)]),
            metadata=compute_v1.Metadata(items=items),
            scheduling=scheduling,
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(  # the series' type: gcp.machines
                    source_image=self.image, disk_size_gb=self.boot_disk_gb, labels=labels,
                    disk_type=f"zones/{o.zone}/diskTypes/{boot_disk_type(o.instance_type)}"))],
            network_interfaces=[nic],
            service_accounts=[compute_v1.ServiceAccount(email=self.service_account, scopes=list(self.node_scopes))],
        )

    # -- Cloud interface --------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Node]:
        """Insert ``count`` instances one by one; stop at the first failure.

        Returns the nodes that came up (fewer than asked when a later insert hit a capacity
        error: the caller tops up or releases); raises when the first one fails."""
        self._validate(request)
        instances, _ = self._clients()
        o = request.offer
        nodes: list[Node] = []
        for _ in range(request.count):
            name = instance_name(request.cluster_id, request.role)
            body = self.instance_body(request, name)
            try:
                op = self._call("instances.insert", lambda: instances.insert_unary(
                    project=self.project, zone=o.zone, instance_resource=body), region=o.region)
                self._wait(op, o.zone, f"insert {name} ({o.key})", o.region)
                inst = self._call("instances.get", lambda: instances.get(
                    project=self.project, zone=o.zone, instance=name), region=o.region)
            except ProvisionError as e:
                e.offer_key = o.key
                if not nodes:
                    raise
                log.warning("gcp gave %d of %d nodes for %s: %s", len(nodes), request.count, o.key, e)
                break
            nodes.append(self._node(inst, o.zone))
        return nodes

    def _node(self, inst, zone: str) -> Node:
        from datetime import datetime

        labels = dict(inst.labels)
        try:
            price = int(labels.get(LABEL_PRICE, "0")) / 1e6
        except ValueError:
            price = 0.0
        meta = {i.key: i.value for i in (inst.metadata.items if inst.metadata else [])}
        src, _, when = (meta.get(META_PRICE_SOURCE) or "").rpartition(" @ ")
        extra = {"price_source": src, "price_as_of": when} if src else {}
        launched = None
        if inst.creation_timestamp:
            try:
                launched = datetime.fromisoformat(inst.creation_timestamp).timestamp()
            except ValueError:
                launched = None
        zone = inst.zone.rsplit("/", 1)[-1] if inst.zone else zone
        nics = list(inst.network_interfaces)
        nat = [a.nat_i_p for a in (nics[0].access_configs if nics else []) if a.nat_i_p]
        extra["public_ip"] = bool(nat)              # billed while it exists (pricing/attached.py)
        if nat:
            extra["public_address"] = nat[0]        # where the launcher's ssh reaches a head
        return Node(cloud="gcp", instance_id=inst.name, instance_type=inst.machine_type.rsplit("/", 1)[-1],
                    region=zone.rsplit("-", 1)[0], zone=zone, market=labels.get(TAG_MARKET, "on-demand"),
                    usd_per_hour=price, cluster_id=labels.get(TAG_CLUSTER, ""), job_id=labels.get(TAG_JOB, ""),
                    role=labels.get(TAG_ROLE, "worker"), state=(inst.status or "unknown").lower(),
                    launched_at=launched, address=nics[0].network_i_p if nics else None, extra=extra)

    def terminate(self, nodes: list[Node]) -> None:
        instances, _ = self._clients()
        for n in nodes:
            try:
                op = self._call("instances.delete", lambda: instances.delete_unary(
                    project=self.project, zone=n.zone, instance=n.instance_id), region=n.region)
                self._wait(op, n.zone, f"delete {n.instance_id}", n.region)
            except ProvisionError as e:
                if e.code in ("notFound", "404"):
                    continue
                raise

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        """One ``instances.aggregatedList`` filtered by our label (every zone in one call, so no
        region needs naming: ``regions`` only narrows the answer)."""
        compute_v1 = _sdk()
        instances, _ = self._clients()
        flt = f'labels.{TAG_CLUSTER} = "{label_value(cluster_id).lower()}"' if cluster_id else f"labels.{TAG_CLUSTER}:*"
        req = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=flt)
        pager = self._call("instances.aggregatedList", lambda: instances.aggregated_list(request=req))
        out = []
        for scope, scoped in pager:
            for inst in scoped.instances:
                out.append(self._node(inst, scope.rsplit("/", 1)[-1]))
        return [n for n in out if regions is None or n.region in regions]

    def wait_until_running(self, nodes: list[Node], timeout_s: float = 900.0) -> list[Node]:
        instances, _ = self._clients()
        deadline = time.monotonic() + timeout_s
        out = []
        for n in nodes:
            while True:
                inst = self._call("instances.get", lambda: instances.get(
                    project=self.project, zone=n.zone, instance=n.instance_id), region=n.region)
                fresh = self._node(inst, n.zone)
                if fresh.state in ("running", "terminated", "stopping") or time.monotonic() > deadline:
                    break
                self._sleep(5)
            out.append(fresh)
        return out
