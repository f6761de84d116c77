"""Azure: Spot (or regular) VMs through azure-mgmt-compute and azure-mgmt-network.

Per node: a NIC in the region's spotwise VNet, then the VM with ``priority=Spot``,
``eviction_policy=Delete`` (an evicted VM and its disk go away instead of lingering, billed),
``billing_profile.max_price=-1`` (pay up to the on-demand price: never evicted for price), the
boot script as base64 custom data, and ``delete_option=Delete`` on the NIC and OS disk so deleting
the VM deletes what it owns. The NIC is created first and deleted again if the VM fails, so a
failed launch leaves nothing behind; ``gc`` also sweeps tagged NICs without a VM.

Errors map by ARM error code: ``AllocationFailed``, ``ZonalAllocationFailed``,
``OverconstrainedAllocationRequest``, ``SkuNotAvailable`` ... -> CapacityError;
``OperationNotAllowed`` (Azure's core-quota code), ``QuotaExceeded`` -> QuotaError;
``AuthorizationFailed``, ``InvalidAuthenticationToken`` ... -> AuthError; HTTP 429 is retried by
azure-core's retry policy and then by our backoff.

Configuration: ``SPOTWISE_AZURE_SUBSCRIPTION_ID`` (or ``AZURE_SUBSCRIPTION_ID``),
``SPOTWISE_AZURE_RESOURCE_GROUP`` (default ``spotwise``; created by ``infra/azure``),
``SPOTWISE_AZURE_SSH_PUBLIC_KEY`` (a key is generated and discarded when absent: nodes are
reached through Ray, not SSH), ``SPOTWISE_AZURE_ENDPOINT`` (tests: a local fake over http — the
SDK refuses bearer tokens over http, so a plain bearer policy is used there).
"""

from __future__ import annotations

import base64
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
from spotwise.provisioner.bootstrap import HEAD_KEY, BootstrapSpec, render_script
from spotwise.provisioner.retry import with_backoff

log = logging.getLogger(__name__)

TAG_PRICE = "spotwise-usd-per-hour"
DEFAULT_IMAGE = ("microsoft-dsvm", "ubuntu-hpc", "2204", "latest")  # publisher, offer, sku, version

CAPACITY_CODES = frozenset({"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                            "OverconstrainedZonalAllocationRequest", "SkuNotAvailable",
                            "AllocationFailedSpot", "SpotVMEvictionCapacity", "SkuNotAvailableInZone"})
QUOTA_CODES = frozenset({"OperationNotAllowed", "QuotaExceeded", "ResourceQuotaExceeded",
                         "LowPriorityCoreQuotaExceeded", "SpotCoreQuotaExceeded"})
AUTH_CODES = frozenset({"AuthorizationFailed", "AuthenticationFailed", "InvalidAuthenticationToken",
                        "InvalidAuthenticationTokenTenant", "ExpiredAuthenticationToken",
                        "LinkedAuthorizationFailed", "SubscriptionNotFound", "MissingSubscriptionRegistration"})
THROTTLE_CODES = frozenset({"TooManyRequests", "SubscriptionRequestsThrottled", "RetryableError"})


def error_code(exc: BaseException) -> str | None:
    err = getattr(exc, "error", None)
    code = getattr(err, "code", None)
    if code:
        return code
    status = getattr(exc, "status_code", None)
    return str(status) if status else None


def classify(code: str | None, status: int | None = None) -> type[ProvisionError]:
    if code in AUTH_CODES or status == 401:
        return AuthError
    if code in QUOTA_CODES:
        return QuotaError
    if code in CAPACITY_CODES:
        return CapacityError
    if status == 403:
        return AuthError
    return ProvisionError


def _is_throttle(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) == 429 or error_code(exc) in THROTTLE_CODES


def _bearer_over_http(credential: Any, scope: str):
    """A policy adding ``Authorization: Bearer`` from a TokenCredential without azure-core's https
    check (used only for an explicit http endpoint such as a local test fake)."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    class BearerOverHttp(SansIOHTTPPolicy):
        def on_request(self, request) -> None:
            token = credential.get_token(scope)
            request.http_request.headers["Authorization"] = f"Bearer {token.token}"

    return BearerOverHttp()


def _ssh_public_key() -> str:
    key = os.environ.get("SPOTWISE_AZURE_SSH_PUBLIC_KEY")
    if key:
        return key
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    priv = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    return priv.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                          serialization.PublicFormat.OpenSSH).decode()


@register_cloud("azure")
class AzureCloud(Cloud):
    """VMs in one subscription and resource group."""

    def __init__(self, *, subscription_id: str | None = None, resource_group: str | None = None,
                 credential: Any = None, endpoint: str | None = None, image: tuple[str, str, str, str] | None = None,
                 admin_username: str = "spotwise", os_disk_gib: int = 200,
                 sleep: Callable[[float], None] = time.sleep, attempts: int = 6) -> None:
        self.subscription_id = (subscription_id or os.environ.get("SPOTWISE_AZURE_SUBSCRIPTION_ID")
                                or os.environ.get("AZURE_SUBSCRIPTION_ID") or None)
        self.resource_group = resource_group or os.environ.get("SPOTWISE_AZURE_RESOURCE_GROUP") or "spotwise"
        self.endpoint = endpoint or os.environ.get("SPOTWISE_AZURE_ENDPOINT") or None
        self._credential = credential
        self.image = image or DEFAULT_IMAGE
        self.admin_username = admin_username
        self.os_disk_gib = os_disk_gib
        self._sleep = sleep
        self._attempts = attempts
        self._compute = None
        self._network = None
        self._subnets: dict[str, str] = {}

    # -- plumbing --------------------------------------------------------------------------------
    def _check_config(self) -> None:
        if not self.subscription_id:
            raise AuthError("azure: no subscription; set SPOTWISE_AZURE_SUBSCRIPTION_ID (or AZURE_SUBSCRIPTION_ID) "
                            "and sign in (az login, or AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET)",
                            cloud="azure")

    def _clients(self):
        if self._compute is None:
            from azure.mgmt.compute import ComputeManagementClient
            from azure.mgmt.network import NetworkManagementClient

            self._check_config()
            cred = self._credential
            if cred is None:
                from azure.identity import DefaultAzureCredential

                cred = DefaultAzureCredential()
            kw: dict[str, Any] = {"polling_interval": 0 if self.endpoint else 5}
            if self.endpoint:
                kw["base_url"] = self.endpoint
                if self.endpoint.startswith("http://"):
                    kw["authentication_policy"] = _bearer_over_http(cred, "https://management.azure.com/.default")
            self._compute = ComputeManagementClient(cred, self.subscription_id, **kw)
            self._network = NetworkManagementClient(cred, self.subscription_id, **kw)
        return self._compute, self._network

    def _call(self, what: str, fn: Callable[[], Any], *, region: str | None = None) -> Any:
        from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

        try:
            return with_backoff(fn, is_throttle=_is_throttle, attempts=self._attempts, sleep=self._sleep)
        except ClientAuthenticationError as e:
            raise AuthError(f"azure {what} failed: {e.message}", cloud="azure", region=region,
                            code=error_code(e) or "AuthenticationFailed") from None
        except HttpResponseError as e:
            code = error_code(e)
            cls = classify(code, getattr(e, "status_code", None))
            raise cls(f"azure {what} failed: {code}: {getattr(e.error, 'message', None) or e.message}",
                      cloud="azure", region=region, code=code) from None

    def _subnet_id(self, region: str) -> str:
        """The region's spotwise VNet/subnet (PUT is idempotent; once per process and region)."""
        if region not in self._subnets:
            from azure.mgmt.network.models import AddressSpace, Subnet, VirtualNetwork

            _, network = self._clients()
            vnet = VirtualNetwork(location=region, tags={"spotwise": "network"},
                                  address_space=AddressSpace(address_prefixes=["10.42.0.0/16"]),
                                  subnets=[Subnet(name="nodes", address_prefix="10.42.0.0/20")])
            res = self._call("virtual_networks.create", lambda: network.virtual_networks.begin_create_or_update(
                self.resource_group, f"spotwise-{region}", vnet).result(), region=region)
            self._subnets[region] = res.subnets[0].id
        return self._subnets[region]

    # -- request ----------------------------------------------------------------------------------
    def _validate(self, req: LaunchRequest) -> None:
        o = req.offer
        problems = []
        if o.cloud != "azure":
            problems.append(Problem("offer.cloud", o.cloud, "azure"))
        if o.market not in (Market.SPOT, Market.ON_DEMAND):
            problems.append(Problem("offer.market", o.market.value, "spot or on-demand"))
        if req.count < 1:
            problems.append(Problem("count", req.count, "a whole number >= 1"))
        if problems:
            raise InputError(problems, source="azure launch")
        instance_types.validate_offer(o)
        self._check_config()

    def tags(self, req: LaunchRequest) -> dict[str, str]:
        tags = {TAG_CLUSTER: req.cluster_id, TAG_JOB: req.job_id, TAG_MARKET: req.offer.market.value,
                TAG_ROLE: req.role, TAG_PRICE: f"{req.offer.usd_per_hour:.6f}"}
        if req.head_address:
            tags[HEAD_KEY] = req.head_address
        tags.update(req.labels)
        return tags

    def vm_body(self, req: LaunchRequest, name: str, nic_id: str):
        from azure.mgmt.compute import models as m

        o = req.offer
        script = render_script(BootstrapSpec(
            cloud="azure", cluster_id=req.cluster_id, job_id=req.job_id, role=req.role, region=o.region,
            zone=o.zone or "none", market=o.market.value, instance_type=o.instance_type,
            accelerator_count=o.accelerator_count, head_address=req.head_address))
        pub, offer_, sku, version = self.image
        vm = m.VirtualMachine(
            location=o.region, tags=self.tags(req),
            hardware_profile=m.HardwareProfile(vm_size=o.instance_type),
            storage_profile=m.StorageProfile(
                image_reference=m.ImageReference(publisher=pub, offer=offer_, sku=sku, version=version),
                os_disk=m.OSDisk(create_option="FromImage", delete_option="Delete", disk_size_gb=self.os_disk_gib,
                                 managed_disk=m.ManagedDiskParameters(storage_account_type="Premium_LRS"))),
            os_profile=m.OSProfile(
                computer_name=name[:64], admin_username=self.admin_username,
                custom_data=base64.b64encode(script.encode()).decode(),
                linux_configuration=m.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=m.SshConfiguration(public_keys=[m.SshPublicKey(
                        path=f"/home/{self.admin_username}/.ssh/authorized_keys", key_data=_ssh_public_key())]))),
            network_profile=m.NetworkProfile(network_interfaces=[
                m.NetworkInterfaceReference(id=nic_id, primary=True, delete_option="Delete")]),
        )
        if o.zone:
            vm.zones = [o.zone]
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
                nic = self._create_nic(request, name)
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
            nodes.append(node)
        return nodes

    def _create_nic(self, req: LaunchRequest, name: str):
        from azure.mgmt.network.models import NetworkInterface, NetworkInterfaceIPConfiguration, Subnet

        _, network = self._clients()
        region = req.offer.region
        nic = NetworkInterface(location=region, tags=self.tags(req), ip_configurations=[
            NetworkInterfaceIPConfiguration(name="ipconfig1", subnet=Subnet(id=self._subnet_id(region)),
                                            private_ip_allocation_method="Dynamic")])
        return self._call("network_interfaces.create", lambda: network.network_interfaces.begin_create_or_update(
            self.resource_group, f"{name}-nic", nic).result(), region=region)

    def _delete_nic(self, vm_name: str, region: str | None) -> None:
        _, network = self._clients()
        try:
            self._call("network_interfaces.delete", lambda: network.network_interfaces.begin_delete(
                self.resource_group, f"{vm_name}-nic").result(), region=region)
        except ProvisionError as e:
            if e.code not in ("NotFound", "ResourceNotFound", "404"):
                log.warning("could not delete NIC %s-nic (gc will): %s", vm_name, e)

    def _node(self, vm) -> Node:
        tags = dict(vm.tags or {})
        try:
            price = float(tags.get(TAG_PRICE, "0"))
        except ValueError:
            price = 0.0
        state = (getattr(vm, "provisioning_state", None) or "unknown").lower()
        return Node(cloud="azure", instance_id=vm.name, instance_type=vm.hardware_profile.vm_size,
                    region=vm.location, zone=(vm.zones or [""])[0],
                    market=tags.get(TAG_MARKET) or ("spot" if vm.priority == "Spot" else "on-demand"),
                    usd_per_hour=price, cluster_id=tags.get(TAG_CLUSTER, ""), job_id=tags.get(TAG_JOB, ""),
                    role=tags.get(TAG_ROLE, "worker"),
                    state="running" if state == "succeeded" else state)

    def terminate(self, nodes: list[Node]) -> None:
        compute, _ = self._clients()
        for n in nodes:
            try:
                self._call("virtual_machines.delete", lambda: compute.virtual_machines.begin_delete(
                    self.resource_group, n.instance_id).result(), region=n.region)
            except ProvisionError as e:
                if e.code not in ("NotFound", "ResourceNotFound", "404"):
                    raise
            self._delete_nic(n.instance_id, n.region)  # normally gone with the VM (delete_option)

    def list_nodes(self, cluster_id: str | None = None) -> list[Node]:
        self._check_config()
        compute, _ = self._clients()
        vms = self._call("virtual_machines.list_all", lambda: list(compute.virtual_machines.list_all()))
        out = []
        for vm in vms:
            tags = vm.tags or {}
            if TAG_CLUSTER in tags and (cluster_id is None or tags[TAG_CLUSTER] == cluster_id):
                out.append(self._node(vm))
        return out

    def orphan_nics(self, live_cluster_ids: set[str] | None = None) -> list[str]:
        """Names of spotwise NICs whose VM is gone (or whose cluster is not live)."""
        _, network = self._clients()
        vm_names = {n.instance_id for n in self.list_nodes()}
        out = []
        for nic in self._call("network_interfaces.list_all", lambda: list(network.network_interfaces.list_all())):
            tags = nic.tags or {}
            if TAG_CLUSTER not in tags:
                continue
            vm = nic.name.removesuffix("-nic")
            if vm not in vm_names or (live_cluster_ids is not None and tags[TAG_CLUSTER] not in live_cluster_ids):
                out.append(vm)
        return out

    def delete_orphan_nics(self, vm_names: list[str]) -> None:
        for v in vm_names:
            self._delete_nic(v, None)
