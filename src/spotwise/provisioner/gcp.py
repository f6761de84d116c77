"""GCP: Spot (or standard) VMs through ``google-cloud-compute`` over REST.

One ``instances.insert`` per node: GPU machine families (A2, A3, G2) carry their GPUs in the
machine type, so no ``guestAccelerators`` are needed (A3 does not accept them). Spot VMs use
``provisioning_model=SPOT`` with ``instance_termination_action=DELETE`` — a preempted node
disappears instead of lingering as a stopped VM with a billed disk.

Errors arrive two ways and are mapped by code: a DONE operation carrying
``error.errors[].code`` (``ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]`` -> CapacityError,
``QUOTA_EXCEEDED`` -> QuotaError) or an HTTP error (401 -> AuthError; 403 by its ``reason``:
``quotaExceeded`` -> QuotaError, rate limits -> retried, else AuthError; 429 -> retried).

Operations are polled through a :class:`ZoneOperationsClient` built with the same client options
— the SDK's own ``ExtendedOperation`` poller would ignore a custom endpoint. Endpoint from
``SPOTWISE_GCP_ENDPOINT`` (tests: a local fake with ``AnonymousCredentials``); project from
``SPOTWISE_GCP_PROJECT`` or the default credentials; image from ``SPOTWISE_GCP_IMAGE``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any, Callable

from spotwise.errors import InputError, Problem
from spotwise.pricing.offer import Market
from spotwise.provisioner import instance_types
from spotwise.provisioner.base import (
    TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE, AuthError, CapacityError, Cloud, LaunchRequest, Node,
    ProvisionError, QuotaError, register_cloud)
from spotwise.provisioner.bootstrap import HEAD_KEY, BootstrapSpec, label_value, render_script
from spotwise.provisioner.retry import with_backoff

log = logging.getLogger(__name__)

LABEL_PRICE = "spotwise-price-microusd"   # label values cannot hold '.', so micro-dollars
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"

CAPACITY_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                            "RESOURCE_POOL_EXHAUSTED", "UNSUPPORTED_OPERATION_FOR_ZONE",
                            "RESOURCE_NOT_FOUND_IN_ZONE", "STOCKOUT"})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "QUOTA_LIMIT_EXCEEDED", "limitExceeded"})
AUTH_REASONS = frozenset({"forbidden", "authError", "insufficientPermissions", "accessNotConfigured",
                          "SERVICE_DISABLED", "ACCESS_TOKEN_TYPE_UNSUPPORTED", "PERMISSION_DENIED"})
THROTTLE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
                              "backendError"})


def _reasons(exc: BaseException) -> list[str]:
    """Error reasons of a google.api_core HTTP error (``errors[].reason`` and ErrorInfo)."""
    out = [e.get("reason") for e in getattr(exc, "errors", None) or () if isinstance(e, dict)]
    try:
        if exc.reason:  # type: ignore[attr-defined]
            out.append(exc.reason)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - no ErrorInfo
        pass
    return [r for r in out if r]


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "code", None) if isinstance(getattr(exc, "code", None), int) else None


def _is_throttle(exc: BaseException) -> bool:
    return _status(exc) == 429 or (_status(exc) == 403 and bool(set(_reasons(exc)) & THROTTLE_REASONS)) \
        or _status(exc) == 503


def classify_http(exc: BaseException) -> type[ProvisionError]:
    status, reasons = _status(exc), set(_reasons(exc))
    if reasons & QUOTA_CODES:
        return QuotaError
    if reasons & CAPACITY_CODES:
        return CapacityError
    if status == 401 or (status == 403 and not reasons & THROTTLE_REASONS):
        return AuthError
    return ProvisionError


def classify_code(code: str | None) -> type[ProvisionError]:
    if code in CAPACITY_CODES:
        return CapacityError
    if code in QUOTA_CODES:
        return QuotaError
    if code in AUTH_REASONS:
        return AuthError
    return ProvisionError


def instance_name(cluster_id: str, role: str) -> str:
    base = label_value(f"sw-{cluster_id}").lower().replace("_", "-").replace(".", "-")[:48].rstrip("-")
    return f"{base}-{role[0]}-{uuid.uuid4().hex[:6]}"


@register_cloud("gcp")
class GcpCloud(Cloud):
    """Compute Engine instances in one project."""

    def __init__(self, *, project: str | None = None, credentials: Any = None, endpoint: str | None = None,
                 image: str | None = None, network: str = "global/networks/default",
                 service_account: str | None = None, boot_disk_gb: int = 200,
                 sleep: Callable[[float], None] = time.sleep, attempts: int = 6,
                 op_timeout_s: float = 600.0) -> None:
        self.endpoint = endpoint or os.environ.get("SPOTWISE_GCP_ENDPOINT") or None
        self._credentials = credentials
        self._project = project or os.environ.get("SPOTWISE_GCP_PROJECT") or None
        self.image = image or os.environ.get("SPOTWISE_GCP_IMAGE") or DEFAULT_IMAGE
        self.network = network
        self.service_account = service_account or os.environ.get("SPOTWISE_GCP_SERVICE_ACCOUNT") or "default"
        self.boot_disk_gb = boot_disk_gb
        self._sleep = sleep
        self._attempts = attempts
        self._op_timeout_s = op_timeout_s
        self._instances = None
        self._ops = None

    # -- plumbing --------------------------------------------------------------------------------
    def _resolve_credentials(self) -> None:
        if self._credentials is not None and self._project:
            return
        if self._credentials is None and os.environ.get("SPOTWISE_GCP_ANONYMOUS") == "1":
            from google.auth.credentials import AnonymousCredentials

            self._credentials = AnonymousCredentials()
        if self._credentials is None:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                self._credentials, project = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"])
            except DefaultCredentialsError:
                raise AuthError("gcp: no credentials found; set GOOGLE_APPLICATION_CREDENTIALS or run "
                                "'gcloud auth application-default login'", cloud="gcp") from None
            self._project = self._project or project
        if not self._project:
            raise InputError(Problem("SPOTWISE_GCP_PROJECT", None, "the GCP project id to launch in"),
                             source="gcp")

    @property
    def project(self) -> str:
        self._resolve_credentials()
        return self._project  # type: ignore[return-value]

    def _clients(self):
        if self._instances is None:
            from google.api_core.client_options import ClientOptions
            from google.cloud import compute_v1

            self._resolve_credentials()
            opts = ClientOptions(api_endpoint=self.endpoint) if self.endpoint else None
            self._instances = compute_v1.InstancesClient(credentials=self._credentials, transport="rest",
                                                         client_options=opts)
            self._ops = compute_v1.ZoneOperationsClient(credentials=self._credentials, transport="rest",
                                                        client_options=opts)
        return self._instances, self._ops

    def _call(self, what: str, fn: Callable[[], Any], *, region: str | None = None) -> Any:
        from google.api_core.exceptions import GoogleAPICallError
        from google.auth.exceptions import GoogleAuthError

        try:
            return with_backoff(fn, is_throttle=_is_throttle, attempts=self._attempts, sleep=self._sleep)
        except GoogleAuthError as e:  # a 401 makes the session refresh; that failing is an auth error
            raise AuthError(f"gcp {what} failed: credentials rejected or not refreshable ({e})",
                            cloud="gcp", region=region, code="authError") from None
        except GoogleAPICallError as e:
            cls = classify_http(e)
            reasons = _reasons(e)
            raise cls(f"gcp {what} failed: HTTP {_status(e)} {reasons}: {getattr(e, 'message', e)}",
                      cloud="gcp", region=region, code=(reasons or [str(_status(e))])[0]) from None

    def _wait(self, op, zone: str, what: str, region: str):
        """Poll a zone operation to DONE through our own ZoneOperationsClient; raise its error."""
        from google.cloud import compute_v1

        _, ops = self._clients()
        deadline = time.monotonic() + self._op_timeout_s
        while op.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise ProvisionError(f"gcp {what}: operation {op.name} not done after {self._op_timeout_s}s",
                                     cloud="gcp", region=region)
            op = self._call(f"{what} (wait)", lambda: ops.wait(project=self.project, zone=zone,
                                                               operation=op.name), region=region)
        errors = list(op.error.errors) if op.error else []
        if errors:
            codes = [e.code for e in errors]
            classes = [classify_code(c) for c in codes]
            cls = next((c for c in (AuthError, QuotaError, CapacityError) if c in classes), ProvisionError)
            code = next((c for c, k in zip(codes, classes) if k is cls), codes[0])
            raise cls(f"gcp {what} failed: " + "; ".join(f"{e.code}: {e.message}" for e in errors),
                      cloud="gcp", region=region, code=code)
        return op

    # -- request ----------------------------------------------------------------------------------
    def _validate(self, req: LaunchRequest) -> None:
        o = req.offer
        problems = []
        if o.cloud != "gcp":
            problems.append(Problem("offer.cloud", o.cloud, "gcp"))
        if not o.zone:
            problems.append(Problem("offer.zone", o.zone, f"a zone of {o.region} (GCP launches per zone)"))
        elif not o.zone.startswith(o.region + "-"):
            problems.append(Problem("offer.zone", o.zone, f"a zone of {o.region}"))
        if o.market not in (Market.SPOT, Market.ON_DEMAND):
            problems.append(Problem("offer.market", o.market.value, "spot or on-demand"))
        if req.count < 1:
            problems.append(Problem("count", req.count, "a whole number >= 1"))
        if problems:
            raise InputError(problems, source="gcp launch")
        instance_types.validate_offer(o)
        self._resolve_credentials()

    def labels(self, req: LaunchRequest) -> dict[str, str]:
        labels = {TAG_CLUSTER: req.cluster_id, TAG_JOB: req.job_id, TAG_MARKET: req.offer.market.value,
                  TAG_ROLE: req.role, LABEL_PRICE: str(round(req.offer.usd_per_hour * 1e6))}
        labels.update(req.labels)
        return {k.lower(): label_value(v).lower() for k, v in labels.items()}

    def instance_body(self, req: LaunchRequest, name: str):
        """The ``Instance`` resource for one node (public so tests and docs can show it)."""
        from google.cloud import compute_v1

        o = req.offer
        script = render_script(BootstrapSpec(
            cloud="gcp", cluster_id=req.cluster_id, job_id=req.job_id, role=req.role, region=o.region,
            zone=o.zone, market=o.market.value, instance_type=o.instance_type,
            accelerator_count=o.accelerator_count, head_address=req.head_address))
        items = [compute_v1.Items(key="startup-script", value=script)]
        if req.head_address:
            items.append(compute_v1.Items(key=HEAD_KEY, value=req.head_address))
        labels = self.labels(req)
        if o.market is Market.SPOT:
            scheduling = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                               on_host_maintenance="TERMINATE", automatic_restart=False)
        else:
            scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                               automatic_restart=True)
        return compute_v1.Instance(
            name=name,
            machine_type=f"zones/{o.zone}/machineTypes/{o.instance_type}",
            labels=labels,
            metadata=compute_v1.Metadata(items=items),
            scheduling=scheduling,
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=self.image, disk_size_gb=self.boot_disk_gb, labels=labels))],
            network_interfaces=[compute_v1.NetworkInterface(
                network=self.network,
                access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])],
            service_accounts=[compute_v1.ServiceAccount(
                email=self.service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"])],
        )

    # -- Cloud interface --------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Node]:
        """Insert ``count`` instances one by one; stop at the first failure.

        Returns the nodes that came up (fewer than asked when a later insert hit a capacity
        error: the caller tops up or releases); raises when the first one fails.
        """
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
        labels = dict(inst.labels)
        try:
            price = int(labels.get(LABEL_PRICE, "0")) / 1e6
        except ValueError:
            price = 0.0
        zone = inst.zone.rsplit("/", 1)[-1] if inst.zone else zone
        nics = list(inst.network_interfaces)
        return Node(cloud="gcp", instance_id=inst.name, instance_type=inst.machine_type.rsplit("/", 1)[-1],
                    region=zone.rsplit("-", 1)[0], zone=zone, market=labels.get(TAG_MARKET, "on-demand"),
                    usd_per_hour=price, cluster_id=labels.get(TAG_CLUSTER, ""), job_id=labels.get(TAG_JOB, ""),
                    role=labels.get(TAG_ROLE, "worker"), state=(inst.status or "unknown").lower(),
                    address=nics[0].network_i_p if nics else None)

    def terminate(self, nodes: list[Node]) -> None:
        instances, _ = self._clients()
        for n in nodes:
            try:
                op = self._call("instances.delete", lambda: instances.delete_unary(
                    project=self.project, zone=n.zone, instance=n.instance_id), region=n.region)
            except ProvisionError as e:
                if e.code in ("notFound", "404"):
                    continue
                raise
            self._wait(op, n.zone, f"delete {n.instance_id}", n.region)

    def list_nodes(self, cluster_id: str | None = None) -> list[Node]:
        from google.cloud import compute_v1

        instances, _ = self._clients()
        flt = f'labels.{TAG_CLUSTER} = "{label_value(cluster_id).lower()}"' if cluster_id else f"labels.{TAG_CLUSTER}:*"
        req = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=flt)
        pager = self._call("instances.aggregatedList", lambda: instances.aggregated_list(request=req))
        out = []
        for scope, scoped in pager:
            for inst in scoped.instances:
                out.append(self._node(inst, scope.rsplit("/", 1)[-1]))
        return out

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
