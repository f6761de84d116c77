"""Azure: Spot (or regular) VMs through azure-mgmt-compute and azure-mgmt-network.

Per cluster and region (``prepare_cluster``): a network security group ``spotwise-<cluster>-<region>`` that lets the
cluster's subnet reach every port (Ray, gloo/NCCL between nodes), the head's dashboard (Jobs API)
and control ports from ``SPOTWISE_AZURE_CLIENT_CIDRS`` (default: the spotwise VNet, where the
orchestrator runs) and denies every other inbound packet — including the rest of the VNet, which
Azure's default ``AllowVnetInBound`` rule would otherwise admit. No public IP is ever created: the
orchestrator reaches the head at its private address (docs/orchestrator.md).

The region's network: the subnet ``nodes`` of the VNet ``spotwise-<region>``, created only if
missing — the VNet with that one subnet when there is none, else the subnet alone (never a PUT of
an existing VNet: ARM replaces its subnet list, deleting subnets that are not spotwise's).

Per node: a NIC in the region's spotwise VNet carrying the cluster's NSG, then the VM with
``priority=Spot``, ``eviction_policy=Delete`` (an evicted VM and its OS disk go away instead of
lingering, billed), ``billing_profile.max_price=-1`` (pay up to the on-demand price: never evicted
for price), the boot script as base64 custom data, and ``delete_option=Delete`` on the NIC and the
OS disk (named ``<vm>-osdisk``) so deleting the VM deletes what it owns. The NIC is created first
and deleted again if the VM fails, so a failed launch leaves nothing behind; ``cleanup_cluster``
and ``gc`` (:meth:`AzureCloud.leftovers`) sweep NICs, public IPs, OS disks and NSGs a cluster left.

Price: a node is billed at the catalog's price of the offer it was launched from (Azure bills spot
at the price in force, which the catalog's Retail Prices rows track), with that row's source and
date, recorded in the VM's tags so any later ``list_nodes`` reports it too.

Interruptions: the node's watcher polls Scheduled Events for ``Preempt`` (>= 30 s notice), drains
its Ray node, and acknowledges the event (``StartRequests``) once the run's just-in-time checkpoint
is committed — the boot script passes it the run's storage (``--ack-after-checkpoint``), so the
eviction proceeds as soon as nothing is lost rather than at ``NotBefore``.

Errors map by ARM error code: ``AllocationFailed``, ``ZonalAllocationFailed``,
``OverconstrainedAllocationRequest``, ``SkuNotAvailable`` ... -> CapacityError;
``OperationNotAllowed`` (Azure's core-quota code), ``QuotaExceeded`` -> QuotaError;
``AuthorizationFailed``, ``InvalidAuthenticationToken`` ... -> AuthError; HTTP 429 is retried by
azure-core's retry policy and then by our backoff.

The SDKs are the ``spotwise[azure]`` extra (azure-mgmt-compute, azure-mgmt-network,
azure-identity), imported where they are used.

Configuration: ``SPOTWISE_AZURE_SUBSCRIPTION_ID`` (or ``AZURE_SUBSCRIPTION_ID``),
``SPOTWISE_AZURE_RESOURCE_GROUP`` (default ``spotwise``; created by ``infra/azure``),
``SPOTWISE_AZURE_VNET_CIDR`` (default ``10.42.0.0/16``; nodes get the first /20 of it),
``SPOTWISE_AZURE_CLIENT_CIDRS``, ``SPOTWISE_AZURE_HEAD_TYPE`` (default ``Standard_D2s_v5``),
``SPOTWISE_AZURE_NODE_IDENTITY`` (the user-assigned identity nodes carry: required for ``az://``
storage, which nodes reach as it, and used by a node to delete itself:
:mod:`~spotwise.provisioner.clouds.azure.identity`), ``SPOTWISE_AZURE_SSH_PUBLIC_KEY`` (a key is generated and discarded when absent: nodes are
reached through Ray, not SSH), ``SPOTWISE_AZURE_ENDPOINT`` (tests: a local fake over http — the
SDK refuses bearer tokens over http, so a plain bearer policy is used there),
``SPOTWISE_AZURE_ANONYMOUS=1`` (fakes only: a dummy token, refused unless the endpoint is http), and the ports
``SPOTWISE_RAY_PORT``, ``SPOTWISE_RAY_DASHBOARD_PORT``, ``SPOTWISE_CONTROL_PORT``.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import time
import uuid
from types import ModuleType
from typing import Any, Callable

from spotwise.provisioner.boot.shipping import run_storage_uri, shipped_build
from spotwise.config import setting, where
from spotwise.errors import InputError, Problem
from spotwise.extras import require
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner import base
from spotwise.provisioner.clouds.azure.locations import site_problem as _site_problem
from spotwise.provisioner.clouds.azure.sizes import os_disk_type
from spotwise.provisioner.clouds.azure.identity import (
    NODE_STORAGE_SCHEMES, node_env, node_extras, node_identity, storage_identity_problem)
from spotwise.provisioner.base import (
    TAG_CLUSTER, TAG_JOB, TAG_MARKET, TAG_ROLE, AuthError, Cloud, ErrorCodes, LaunchRequest, Node,
    ProvisionError, cluster_tags, env_cidrs, env_ports, register_cloud)
from spotwise.provisioner.boot.script import BootstrapSpec, render_script
from spotwise.provisioner.head_path import authorized_key_line, forget_cluster, head_path, launcher_cidr
from spotwise.utils.retry import retry_after_header, with_backoff

log = logging.getLogger(__name__)

TAG_PRICE = "spotwise-usd-per-hour"
TAG_PRICE_SOURCE = "spotwise-price-source"
# Ubuntu 24.04 (Python 3.12) with the NVIDIA datacenter driver; the 22.04 one has Python 3.10
DEFAULT_IMAGE = ("microsoft-dsvm", "ubuntu-hpc", "2404", "latest")  # publisher, offer, sku, version
DEFAULT_HEAD_TYPE = "Standard_D2s_v5"
DEFAULT_VNET_CIDR = "10.42.0.0/16"
NOT_FOUND = ("NotFound", "ResourceNotFound", "404")

CAPACITY_CODES = frozenset({"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                            "OverconstrainedZonalAllocationRequest", "SkuNotAvailable",
                            "AllocationFailedSpot", "SpotVMEvictionCapacity", "SkuNotAvailableInZone"})
QUOTA_CODES = frozenset({"OperationNotAllowed", "QuotaExceeded", "ResourceQuotaExceeded",
                         "LowPriorityCoreQuotaExceeded", "SpotCoreQuotaExceeded"})
AUTH_CODES = frozenset({"AuthorizationFailed", "AuthenticationFailed", "InvalidAuthenticationToken",
                        "InvalidAuthenticationTokenTenant", "ExpiredAuthenticationToken",
                        "LinkedAuthorizationFailed", "SubscriptionNotFound", "MissingSubscriptionRegistration"})
THROTTLE_CODES = frozenset({"TooManyRequests", "SubscriptionRequestsThrottled", "RetryableError"})
CODES = ErrorCodes(auth=AUTH_CODES, quota=QUOTA_CODES, capacity=CAPACITY_CODES, throttle=THROTTLE_CODES)


def _sdk(module: str) -> ModuleType:
    """One of the Azure SDK's modules, or a MissingExtra naming ``spotwise[azure]``."""
    return require(module, "azure", "the Azure cloud")


def error_code(exc: BaseException) -> str | None:
    err = getattr(exc, "error", None)
    code = getattr(err, "code", None)
    if code:
        return code
    status = getattr(exc, "status_code", None)
    return str(status) if status else None


def _is_throttle(exc: BaseException) -> bool:
    """Worth another try: throttled (429, a throttling code), a 5xx, or no answer at all. azure-core's
    own retries are off (``retry_total=0``), so this one loop, with its injectable sleep, does them."""
    status = getattr(exc, "status_code", None)
    if status == 429 or (isinstance(status, int) and status >= 500) or error_code(exc) in THROTTLE_CODES:
        return True
    errors = _sdk("azure.core.exceptions")
    return isinstance(exc, (errors.ServiceRequestError, errors.ServiceResponseError))


def _retry_after(exc: BaseException) -> float | None:
    """A throttled answer's ``Retry-After`` (ARM sends it with every 429)."""
    return retry_after_header(getattr(getattr(exc, "response", None), "headers", None))


def _bearer_over_http(credential: Any, scope: str):
    """A policy adding ``Authorization: Bearer`` from a TokenCredential without azure-core's https
    check (used only for an explicit http endpoint such as a local test fake)."""
    policies = _sdk("azure.core.pipeline.policies")

    def on_request(self, request) -> None:
        token = credential.get_token(scope)
        request.http_request.headers["Authorization"] = f"Bearer {token.token}"

    # built with type(): its base class comes from require(), which mypy cannot see as a class
    return type("BearerOverHttp", (policies.SansIOHTTPPolicy,), {"on_request": on_request})()


class _AnonymousToken:
    """A TokenCredential for a local ARM fake (``SPOTWISE_AZURE_ANONYMOUS=1``, http endpoints only)."""

    def get_token(self, *scopes, **kw):
        return _sdk("azure.core.credentials").AccessToken("anonymous", int(time.time()) + 3600)


def _ssh_public_key() -> str:
    key = setting("SPOTWISE_AZURE_SSH_PUBLIC_KEY")
    if key:
        return key
    # cryptography comes with azure-identity
    serialization = _sdk("cryptography.hazmat.primitives.serialization")
    rsa = _sdk("cryptography.hazmat.primitives.asymmetric.rsa")
    priv = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    return priv.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                          serialization.PublicFormat.OpenSSH).decode()




@register_cloud("azure")
class AzureCloud(Cloud):
    """VMs in one subscription and resource group."""

    notice_window_s = 30.0        # a Preempt scheduled event comes at least 30 s ahead
    head_over_ssh = True          # the launcher reaches the head over ssh unless SPOTWISE_HEAD_PATH=private
    site_problem = _site_problem  # a location outside infra/azure's: no NAT gateway, no way out

    def __init__(self, *, subscription_id: str | None = None, resource_group: str | None = None,
                 credential: Any = None, endpoint: str | None = None, image: tuple[str, str, str, str] | None = None,
                 admin_username: str = "spotwise", os_disk_gib: int = 200, run_storage: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, attempts: int = 6) -> None:
        self.subscription_id = (subscription_id or setting("SPOTWISE_AZURE_SUBSCRIPTION_ID")
                                or os.environ.get("AZURE_SUBSCRIPTION_ID") or None)
        self.resource_group = resource_group or setting("SPOTWISE_AZURE_RESOURCE_GROUP") or "spotwise"
        self.api_endpoint = endpoint or setting("SPOTWISE_AZURE_ENDPOINT") or None
        self._credential = credential
        self.image = image or DEFAULT_IMAGE
        self.admin_username = admin_username
        self.os_disk_gib = os_disk_gib
        self._sleep = sleep
        self._attempts = attempts
        self._compute: Any = None
        self._network: Any = None
        self._subnets: dict[str, str] = {}
        self._nsgs: dict[tuple[str, str], str] = {}  # (cluster id, region) -> its NSG's resource id
        self.head_type = setting("SPOTWISE_AZURE_HEAD_TYPE") or DEFAULT_HEAD_TYPE
        # the user-assigned identity nodes carry (infra/azure): its only right is deleting VMs of the
        # resource group, so a node's dead man's switch can delete its own VM (see runtime.deadman)
        self.node_identity = node_identity()
        self.vnet_cidr = env_cidrs("SPOTWISE_AZURE_VNET_CIDR", "azure", (DEFAULT_VNET_CIDR,))[0]
        net = ipaddress.ip_network(self.vnet_cidr)
        self.subnet_cidr = str(next(net.subnets(new_prefix=20)) if net.prefixlen < 20 else net)
        self.client_cidrs = env_cidrs("SPOTWISE_AZURE_CLIENT_CIDRS", "azure", (self.vnet_cidr,))
        self.ray_port, self.dashboard_port, self.control_port = env_ports("azure")
        # The run's checkpoint storage: a node's watcher acknowledges a Preempt event once a
        # checkpoint newer than the notice is committed there (None: right after the drain).
        self.run_storage = run_storage

    # NV A10 v5 sizes run NVIDIA's GRID (vGPU) driver, which the default image (DSVM Ubuntu HPC,
    # datacenter driver) does not carry: a node there would never see its GPU
    unlaunchable = {"Standard_NV*A10_v5": "needs NVIDIA's GRID driver, which the default image lacks"}

    node_storage_schemes = NODE_STORAGE_SCHEMES   # az:// as the node's managed identity (identity.py)
    default_storage_setting = "SPOTWISE_AZURE_STORAGE"
    boot_disk_type = staticmethod(os_disk_type)  # type: ignore[assignment]  # per size (azure.sizes), billed as made

    @classmethod
    def storage_identity_problem(cls, storage_uri: str) -> Problem | None:
        return storage_identity_problem(storage_uri)

    @classmethod
    def for_task(cls, spec, opts) -> "AzureCloud":
        """The cloud for one run: it knows the run's storage, so the watcher can hold the
        Scheduled Events acknowledgement until the just-in-time checkpoint is committed (on
        ``az://`` as the node's managed identity; on ``s3://`` with the image's keys)."""
        uri = run_storage_uri(spec, opts, cls.name)
        cloud = cls(run_storage=uri if uri and uri.startswith(("s3://", "az://")) else None)
        cloud.node_build = shipped_build(uri)
        return cloud

    # -- plumbing --------------------------------------------------------------------------------
    def check_credentials(self) -> None:
        """A subscription is set (the sign-in itself is checked by the first call)."""
        if not self.subscription_id:
            raise AuthError("azure: no subscription; set SPOTWISE_AZURE_SUBSCRIPTION_ID (or AZURE_SUBSCRIPTION_ID) "
                            "and sign in (az login, or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET)",
                            cloud="azure")

    def _clients(self):
        if self._compute is None:
            mgmt_compute = _sdk("azure.mgmt.compute")
            mgmt_network = _sdk("azure.mgmt.network")
            self.check_credentials()
            cred = self._credential
            if cred is None and setting("SPOTWISE_AZURE_ANONYMOUS") == "1":
                if not (self.api_endpoint or "").startswith("http://"):
                    raise InputError(Problem(where("SPOTWISE_AZURE_ANONYMOUS"), "1",
                                             "only with an http:// SPOTWISE_AZURE_ENDPOINT (a local fake)"),
                                     source="azure")
                cred = _AnonymousToken()
            if cred is None:
                cred = _sdk("azure.identity").DefaultAzureCredential()
            # retry_total=0: our _call retries (throttling with Retry-After, 5xx) with its injectable sleep
            kw: dict[str, Any] = {"polling_interval": 0 if self.api_endpoint else 5, "retry_total": 0}
            if self.api_endpoint:
                kw["base_url"] = self.api_endpoint
                if self.api_endpoint.startswith("http://"):
                    kw["authentication_policy"] = _bearer_over_http(cred, "https://management.azure.com/.default")
            self._compute = mgmt_compute.ComputeManagementClient(cred, self.subscription_id, **kw)
            self._network = mgmt_network.NetworkManagementClient(cred, self.subscription_id, **kw)
        return self._compute, self._network

    def classify(self, exc: BaseException) -> type[ProvisionError]:
        """By ARM error code (:data:`CODES`) and HTTP status: 401 or an auth code is auth, then
        quota, then capacity codes; a remaining 403 is auth; a rejected sign-in is auth."""
        if isinstance(exc, ProvisionError):
            return type(exc)
        if isinstance(exc, _sdk("azure.core.exceptions").ClientAuthenticationError):
            return AuthError
        code, status = error_code(exc), getattr(exc, "status_code", None)
        if status == 401:
            return AuthError
        kind = CODES.kind(code)
        return AuthError if kind is ProvisionError and status == 403 else kind

    def _call(self, what: str, fn: Callable[[], Any], *, region: str | None = None) -> Any:
        errors = _sdk("azure.core.exceptions")
        try:
            return with_backoff(fn, should_retry=_is_throttle, attempts=self._attempts, sleep=self._sleep,
                                retry_after=_retry_after)
        except errors.ClientAuthenticationError as e:
            raise AuthError(f"azure {what} failed: {e.message}", cloud="azure", region=region,
                            code=error_code(e) or "AuthenticationFailed") from None
        except errors.HttpResponseError as e:
            code = error_code(e)
            cls = self.classify(e)
            raise cls(f"azure {what} failed: {code}: {getattr(e.error, 'message', None) or e.message}",
                      cloud="azure", region=region, code=code) from None

    def _delete(self, what: str, fn: Callable[[], Any], region: str | None = None) -> bool:
        """Run a delete; False when the resource was already gone."""
        try:
            self._call(what, fn, region=region)
            return True
        except ProvisionError as e:
            if e.code in NOT_FOUND:
                return False
            raise

    def _subnet_id(self, region: str) -> str:
        """The region's spotwise subnet ``nodes`` in the VNet ``spotwise-<region>`` (once per process
        and region). Only what is missing is created: the VNet with its one subnet when there is no
        VNet, else the subnet alone (a subnet PUT) when the VNet lacks it. Never a PUT of an existing
        VNet: ARM replaces its subnet list, deleting every other subnet (the operator's, a VPN
        gateway's) or failing while one is in use."""
        if region not in self._subnets:
            nm = _sdk("azure.mgmt.network.models")
            _, network = self._clients()
            rg, name = self.resource_group, f"spotwise-{region}"
            try:
                have = self._call("virtual_networks.get", lambda: network.virtual_networks.get(rg, name), region=region)
            except ProvisionError as e:
                if e.code not in NOT_FOUND:
                    raise
                have = None
            if have is None:
                vnet = nm.VirtualNetwork(location=region, tags={"spotwise": "network"},
                                         address_space=nm.AddressSpace(address_prefixes=[self.vnet_cidr]),
                                         subnets=[nm.Subnet(name="nodes", address_prefix=self.subnet_cidr)])
                res = self._call("virtual_networks.create", lambda: network.virtual_networks.begin_create_or_update(
                    rg, name, vnet).result(), region=region)
                subnet = next(s for s in res.subnets if s.name == "nodes")
            else:
                subnet = next((s for s in have.subnets or [] if s.name == "nodes"), None)
                if subnet is None:
                    subnet = self._call("subnets.create", lambda: network.subnets.begin_create_or_update(
                        rg, name, "nodes", nm.Subnet(address_prefix=self.subnet_cidr)).result(), region=region)
            self._subnets[region] = subnet.id
        return self._subnets[region]

    # -- what a run needs beyond launch/terminate ------------------------------------------------
    def head_offer(self, region: str, zone: str) -> Offer:
        """A small on-demand CPU VM for the Ray head (``Standard_D2s_v5``), priced from
        ``data/head_prices.csv``; a region without a row uses eastus's price and says so."""
        return base.head_offer("azure", self.head_type, region, zone, fallback_region="eastus",
                               env_var="SPOTWISE_AZURE_HEAD_TYPE")

    def nsg_rules(self) -> list:
        """The cluster NSG's inbound rules: the subnet reaches everything (Ray, collectives), the
        orchestrator's CIDRs reach the dashboard and control ports, everything else is denied."""
        nm = _sdk("azure.mgmt.network.models")

        def rule(name, prio, access, sources, ports):
            return nm.SecurityRule(name=name, priority=prio, direction="Inbound", access=access, protocol="*",
                                source_address_prefixes=sources, source_port_range="*",
                                destination_address_prefix="*", destination_port_ranges=ports)

        ports = sorted({str(self.dashboard_port), str(self.control_port)})
        # the launcher's ssh to the head's public IP, from its own address only (the ssh head path)
        ssh = [rule("spotwise-launcher-ssh", 120, "Allow", [launcher_cidr()], ["22"])] if head_path().ssh else []
        return [rule("spotwise-cluster", 100, "Allow", [self.subnet_cidr], ["0-65535"]),
                rule("spotwise-orchestrator", 110, "Allow", list(self.client_cidrs), ports), *ssh,
                rule("spotwise-deny-rest", 4000, "Deny", ["0.0.0.0/0"], ["0-65535"])]

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """Create the cluster's NSG ``spotwise-<cluster>-<region>`` (an NSG serves NICs of its own
        region only; idempotent: ARM PUT)."""
        if (cluster_id, region) in self._nsgs:
            return
        nm = _sdk("azure.mgmt.network.models")
        _, network = self._clients()
        self._subnet_id(region)
        nsg = nm.NetworkSecurityGroup(location=region, tags={TAG_CLUSTER: cluster_id, TAG_JOB: job_id},
                                   security_rules=self.nsg_rules())
        res = self._call("network_security_groups.create", lambda: network.network_security_groups.begin_create_or_update(
            self.resource_group, f"spotwise-{cluster_id}-{region}", nsg).result(), region=region)
        self._nsgs[(cluster_id, region)] = res.id

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        """Once the cluster's VMs are gone: its NICs, public IPs, OS disks and NSG."""
        out = self.leftovers({cluster_id}, match=True, dry_run=False)
        for key in [k for k in self._nsgs if k[0] == cluster_id]:
            del self._nsgs[key]
        return out + forget_cluster("azure", cluster_id)      # its ssh tunnel and key, if it had them

    def leftovers(self, cluster_ids: set[str], *, match: bool, dry_run: bool) -> list[str]:
        """Delete (or, ``dry_run``, list) what clusters left besides VMs: NICs and public IPs tagged
        with a cluster and no live VM, OS disks named ``sw-<cluster>-…`` no VM holds, and the
        clusters' NSGs. ``match=True``: of ``cluster_ids``; ``match=False``: of every other cluster
        (``gc``). Resources still used by a live VM are kept (the next pass gets them)."""
        compute, network = self._clients()
        rg = self.resource_group
        vms = {n.instance_id.lower(): n.cluster_id for n in self.list_nodes()}

        def mine(cid: str | None) -> bool:
            return bool(cid) and (cid in cluster_ids) == match

        out: list[str] = []
        nics = self._call("network_interfaces.list", lambda: list(network.network_interfaces.list(rg)))
        for nic in nics:
            cid = (nic.tags or {}).get(TAG_CLUSTER)
            if mine(cid) and nic.name.removesuffix("-nic").lower() not in vms:
                if dry_run or self._delete("network_interfaces.delete", lambda: network.network_interfaces.begin_delete(
                        rg, nic.name).result()):
                    out.append(f"azure network interface {nic.name}")
        ips = self._call("public_ip_addresses.list", lambda: list(network.public_ip_addresses.list(rg)))
        for ip in ips:
            cid = (ip.tags or {}).get(TAG_CLUSTER)
            if mine(cid) and ip.ip_configuration is None:
                if dry_run or self._delete("public_ip_addresses.delete", lambda: network.public_ip_addresses.begin_delete(
                        rg, ip.name).result()):
                    out.append(f"azure public ip {ip.name}")
        for disk in self._call("disks.list", lambda: list(compute.disks.list_by_resource_group(rg))):
            cid = (disk.tags or {}).get(TAG_CLUSTER) or _cluster_of_disk(disk.name)
            if mine(cid) and not disk.managed_by:
                if dry_run or self._delete("disks.delete", lambda: compute.disks.begin_delete(rg, disk.name).result()):
                    out.append(f"azure disk {disk.name}")
        for nsg in self._call("network_security_groups.list", lambda: list(network.network_security_groups.list(rg))):
            cid = (nsg.tags or {}).get(TAG_CLUSTER)
            if mine(cid) and cid not in vms.values():
                if dry_run or self._delete("network_security_groups.delete",
                                           lambda: network.network_security_groups.begin_delete(rg, nsg.name).result()):
                    out.append(f"azure network security group {nsg.name}")
        return out

    # -- request ----------------------------------------------------------------------------------
    def cluster_tags(self, req: LaunchRequest) -> dict[str, str]:
        """The common tags plus the offer's price, its source and date (what ``list_nodes`` bills
        from); the head's address is a tag too."""
        o = req.offer
        return cluster_tags(req, {TAG_PRICE: f"{o.usd_per_hour:.6f}",
                                  TAG_PRICE_SOURCE: f"{o.source} @ {o.as_of}"[:256]})

    def boot_script(self, req: LaunchRequest) -> str:
        """The node's boot script (plain text; the VM gets it base64-encoded as custom data). On
        ``az://`` storage it exports the node's identity for the store (``identity.node_env``)
        and installs the ``azure`` extra."""
        o = req.offer
        storage = self.node_build.storage_uri if self.node_build else self.run_storage
        watch: tuple[str, ...] = (("--ack-after-checkpoint", f"{self.run_storage.rstrip('/')}/{req.job_id}")
                                  if self.run_storage else ())
        if self.node_identity:
            watch += ("--self-end", "azure")     # a guest shutdown would leave the VM allocated, billing
        return render_script(BootstrapSpec(
            cloud="azure", cluster_id=req.cluster_id, job_id=req.job_id, role=req.role, region=o.region,
            zone=o.zone or "none", market=o.market.value, instance_type=o.instance_type,
            accelerator_count=o.accelerator_count, head_address=req.head_address,
            ray_port=self.ray_port, dashboard_port=self.dashboard_port, watch_args=watch,
            extras=node_extras(storage), env=node_env(storage, self.node_identity),
            build=self.node_build.for_boot() if self.node_build else None,
            ssh_authorized_key=authorized_key_line(req.cluster_id) if _over_ssh(req) else None))

    def vm_body(self, req: LaunchRequest, name: str, nic_id: str):
        m = _sdk("azure.mgmt.compute.models")
        o = req.offer
        pub, offer_, sku, version = self.image
        vm = m.VirtualMachine(
            location=o.region, tags=self.cluster_tags(req),
            hardware_profile=m.HardwareProfile(vm_size=o.instance_type),
            storage_profile=m.StorageProfile(
                image_reference=m.ImageReference(publisher=pub, offer=offer_, sku=sku, version=version),
                os_disk=m.OSDisk(name=f"{name}-osdisk", create_option="FromImage", delete_option="Delete",
                                 disk_size_gb=self.os_disk_gib,
                                 managed_disk=m.ManagedDiskParameters(storage_account_type=os_disk_type(o.instance_type)))),
            os_profile=m.OSProfile(
                computer_name=name[:64], admin_username=self.admin_username,
                custom_data=base64.b64encode(self.boot_script(req).encode()).decode(),
                linux_configuration=m.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=m.SshConfiguration(public_keys=[m.SshPublicKey(
                        path=f"/home/{self.admin_username}/.ssh/authorized_keys", key_data=_ssh_public_key())]))),
            network_profile=m.NetworkProfile(network_interfaces=[
                m.NetworkInterfaceReference(id=nic_id, primary=True, delete_option="Delete")]),
        )
        if o.zone:
            vm.zones = [o.zone]
        if self.node_identity:
            vm.identity = m.VirtualMachineIdentity(type="UserAssigned",
                                                   user_assigned_identities={self.node_identity: m.UserAssignedIdentitiesValue()})
        if o.market is Market.SPOT:
            vm.priority = "Spot"
            vm.eviction_policy = "Delete"
            vm.billing_profile = m.BillingProfile(max_price=req.max_price if req.max_price else -1)
        else:
            vm.priority = "Regular"
        return vm

    # -- Cloud interface --------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Node]:
        """Create ``count`` VMs one by one; return those that came up (raise if none did)."""
        self._validate(request)
        o = request.offer
        compute, network = self._clients()
        nodes: list[Node] = []
        for _ in range(request.count):
            name = f"sw-{request.cluster_id}-{request.role[0]}-{uuid.uuid4().hex[:6]}"[:64]
            try:
                nic, public = self._create_nic(request, name)
                try:
                    vm = self._call("virtual_machines.create", lambda: compute.virtual_machines.begin_create_or_update(
                        self.resource_group, name, self.vm_body(request, name, nic.id)).result(), region=o.region)
                except BaseException:
                    self._delete_nic(name, o.region)
                    raise
            except ProvisionError as e:
                e.offer_key = o.key
                if not nodes:
                    raise
                log.warning("azure gave %d of %d nodes for %s: %s", len(nodes), request.count, o.key, e)
                break
            node = self._node(vm)
            node.address = nic.ip_configurations[0].private_ip_address if nic.ip_configurations else None
            if public:
                node.extra["public_address"] = public      # where the launcher's ssh reaches the head
            node.extra["public_ip"] = bool(public)          # billed by the hour (pricing/attached.py)
            nodes.append(node)
        return nodes

    def _create_nic(self, req: LaunchRequest, name: str) -> tuple[Any, str | None]:
        """The node's NIC, and the public address of the head's own IP (None: it has none)."""
        nm = _sdk("azure.mgmt.network.models")
        _, network = self._clients()
        region = req.offer.region
        nic = nm.NetworkInterface(location=region, tags=self.cluster_tags(req), ip_configurations=[
            nm.NetworkInterfaceIPConfiguration(name="ipconfig1", subnet=nm.Subnet(id=self._subnet_id(region)),
                                               private_ip_allocation_method="Dynamic")])
        if (req.cluster_id, region) in self._nsgs:
            nic.network_security_group = nm.NetworkSecurityGroup(id=self._nsgs[(req.cluster_id, region)])
        pip = None
        if _over_ssh(req):      # the head's own public IP (Standard SKU: static, assigned at creation)
            pip = self._call("public_ip_addresses.create", lambda: network.public_ip_addresses.begin_create_or_update(
                self.resource_group, f"{name}-ip", nm.PublicIPAddress(
                    location=region, tags=self.cluster_tags(req), sku=nm.PublicIPAddressSku(name="Standard"),
                    public_ip_allocation_method="Static")).result(), region=region)
            nic.ip_configurations[0].public_ip_address = nm.PublicIPAddress(id=pip.id)
        made = self._call("network_interfaces.create", lambda: network.network_interfaces.begin_create_or_update(
            self.resource_group, f"{name}-nic", nic).result(), region=region)
        return made, (pip.ip_address if pip is not None else None)

    def _delete_nic(self, vm_name: str, region: str | None) -> None:
        _, network = self._clients()
        try:
            self._delete("network_interfaces.delete", lambda: network.network_interfaces.begin_delete(
                self.resource_group, f"{vm_name}-nic").result(), region)
            self._delete("public_ip_addresses.delete", lambda: network.public_ip_addresses.begin_delete(
                self.resource_group, f"{vm_name}-ip").result(), region)     # a head's, once its NIC is gone
        except ProvisionError as e:
            log.warning("could not delete NIC %s-nic (gc will): %s", vm_name, e)

    def _node(self, vm) -> Node:
        tags = dict(vm.tags or {})
        try:
            price = float(tags.get(TAG_PRICE, "0"))
        except ValueError:
            price = 0.0
        src, _, when = tags.get(TAG_PRICE_SOURCE, "").rpartition(" @ ")
        state = (getattr(vm, "provisioning_state", None) or "unknown").lower()
        return Node(cloud="azure", instance_id=vm.name, instance_type=vm.hardware_profile.vm_size,
                    region=vm.location, zone=(vm.zones or [""])[0],
                    market=tags.get(TAG_MARKET) or ("spot" if vm.priority == "Spot" else "on-demand"),
                    usd_per_hour=price, cluster_id=tags.get(TAG_CLUSTER, ""), job_id=tags.get(TAG_JOB, ""),
                    role=tags.get(TAG_ROLE, "worker"),
                    state="running" if state == "succeeded" else state,
                    extra={"price_source": src, "price_as_of": when} if src else {})

    def terminate(self, nodes: list[Node]) -> None:
        compute, _ = self._clients()
        for n in nodes:
            self._delete("virtual_machines.delete", lambda: compute.virtual_machines.begin_delete(
                self.resource_group, n.instance_id).result(), n.region)
            self._delete_nic(n.instance_id, n.region)  # normally gone with the VM (delete_option)

    def list_nodes(self, cluster_id: str | None = None, *, regions: list[str] | None = None) -> list[Node]:
        """The VMs of spotwise's resource group carrying our cluster tag: one ``virtualMachines``
        list of the group (not of the whole subscription: its read limits are the subscription's),
        every region in one call, so ``regions`` only narrows the answer."""
        self.check_credentials()
        compute, _ = self._clients()
        vms = self._call("virtual_machines.list", lambda: list(compute.virtual_machines.list(self.resource_group)))
        out = []
        for vm in vms:
            tags = vm.tags or {}
            if TAG_CLUSTER in tags and (cluster_id is None or tags[TAG_CLUSTER] == cluster_id) \
                    and (regions is None or vm.location in regions):
                out.append(self._node(vm))
        return out


def _over_ssh(req: LaunchRequest) -> bool:
    """Whether ``req`` is a head the launcher reaches over ssh (a public IP, the cluster's key)."""
    return req.role == "head" and head_path().ssh


def _cluster_of_disk(name: str) -> str | None:
    """The cluster id in an OS disk's name ``sw-<cluster>-<role>-<hex>-osdisk`` (None otherwise)."""
    if not (name.startswith("sw-") and name.endswith("-osdisk")):
        return None
    parts = name[3:-len("-osdisk")].rsplit("-", 2)
    return parts[0] if len(parts) == 3 else None
