"""A wire-level fake of the Azure Resource Manager calls spotwise makes (test support).

Serves on 127.0.0.1 for the real azure-mgmt-compute / azure-mgmt-network clients: VNets, NSGs,
NICs, VMs, managed disks and public IPs, in one subscription. Records every request. What it
models because spotwise depends on it:

* a NIC gets the next private address of its subnet's prefix (Azure keeps the first four), so a
  VNet on a loopback range (``127.18.0.0/16``) gives every node a real, distinct loopback address;
* a VM PUT creates its OS disk (``storageProfile.osDisk.name``, ``managedBy`` = the VM); deleting
  the VM deletes the NIC and the disk whose ``deleteOption`` is ``Delete`` and detaches the rest;
* an NSG still referenced by a NIC cannot be deleted (``InUseNetworkSecurityGroupCannotBeDeleted``),
  a NIC referenced by a VM neither (``NicInUse``), as in ARM;
* custom data is kept aside (:meth:`custom_data`) and never returned by GET, as in ARM;
* capacity per VM size, region and priority (:meth:`set_no_capacity`), and errors queued per
  operation (:meth:`queue_error`), shaped as ARM sends them: synchronous ``{"error": {"code":
  ...}}`` bodies (SkuNotAvailable, OperationNotAllowed, AuthorizationFailed, 429 TooManyRequests)
  or — for ``AllocationFailed`` — an accepted PUT whose ``Azure-AsyncOperation`` status later
  reports ``Failed``, as a real allocation failure does;
* rate limits: GET lists are counted in a sliding minute (:attr:`list_times`, on :attr:`clock`);
  past ``list_limit_per_min`` (default 200: Resource Manager's 12,000 subscription reads an hour,
  docs "Understand how Azure Resource Manager throttles requests") a list answers 429
  ``TooManyRequests`` with ``Retry-After`` = the seconds until the window has room;
* a VNet PUT **replaces** its subnet list, as ARM does: a subnet the body leaves out is deleted
  (``InUseSubnetCannotBeDeleted`` while a NIC uses it); a subnet PUT
  (``virtualNetworks/V/subnets/S``) adds or replaces that one subnet only. :meth:`put_vnet` seeds a
  VNet the way an operator made it (a subnet that is not spotwise's, e.g. a VPN gateway's);
* eviction (:meth:`evict`): a Spot VM with ``evictionPolicy=Delete`` is deleted with what it owns.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import random
import re
import threading
import time

from httpfake import Exchange, LoopbackServer

_KINDS = "virtualMachines|networkInterfaces|virtualNetworks|networkSecurityGroups|disks|publicIPAddresses"
_RES = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/"
                  rf"Microsoft\.(Compute|Network)/({_KINDS})/([^/]+)$", re.I)
_LIST = re.compile(r"^/subscriptions/([^/]+)(?:/resourceGroups/([^/]+))?/providers/Microsoft\.(Compute|Network)/"
                   rf"({_KINDS})$", re.I)
_ASYNC = re.compile(r"^/fake-async/([^/]+)$")
_SUBNET = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Network/"
                     r"virtualNetworks/([^/]+)/subnets/([^/]+)$", re.I)

SYNC_ERRORS = {
    "sku": (409, "SkuNotAvailable"),
    "quota": (409, "OperationNotAllowed"),
    "authz": (403, "AuthorizationFailed"),
    "token": (401, "InvalidAuthenticationToken"),
    "throttle": (429, "TooManyRequests"),
}
ASYNC_ERRORS = {"allocation": "AllocationFailed", "zonal": "ZonalAllocationFailed"}


def _premium_refusal(body: dict) -> str | None:
    """ARM's refusal of a Premium_LRS OS disk on a size that is not Premium Storage capable (an ``s``
    among the size name's additive features, or a family ending in ``S``: Azure docs, "Azure virtual
    machine sizes naming conventions"); the message as ARM sends it, quoted in
    google/cloud-forensics-utils#488."""
    props = body.get("properties") or {}
    size = (props.get("hardwareProfile") or {}).get("vmSize", "")
    disk = (props.get("storageProfile") or {}).get("osDisk") or {}
    kind = (disk.get("managedDisk") or {}).get("storageAccountType")
    m = re.match(r"^Standard_([A-Z]+)(\d+)(?:-\d+)?([a-z]*)", size)
    capable = bool(m) and ("s" in m.group(3) or m.group(1).endswith("S"))
    if kind == "Premium_LRS" and not capable:
        return (f"Requested operation cannot be performed because the VM size {size} does not support the "
                f"storage account type Premium_LRS of disk '{disk.get('name', '')}'. Consider updating the VM "
                "to a size that supports Premium storage.")
    return None


def _short(resource_id: str) -> str:
    return resource_id.rstrip("/").rsplit("/", 1)[-1].lower()


class AzureFake:
    def __init__(self, *, list_limit_per_min: int = 200, public_range: str = "198.51.100.0/24") -> None:
        self.list_limit_per_min = list_limit_per_min
        #: where public IP addresses come from (default TEST-NET-2, which nothing answers; the emulated
        #: Azure passes a loopback range, where a head's sshd listens)
        # from a random place in it, so two fakes on one machine (a test and a bench, two xdist
        # workers) do not hand out the same addresses
        net = ipaddress.ip_network(public_range)
        first = random.randrange(0, max(1, net.num_addresses - 4096))
        self._public_hosts = (net[first + i] for i in itertools.count(1) if first + i < net.num_addresses - 1)
        self.list_times: list[float] = []          # clock() of every list answered
        self.throttled = 0
        self.clock = time.monotonic
        self.resources: dict[str, dict] = {}       # lowercased kind/name -> body
        self.requests: list[dict] = []
        self.fail: dict[str, list[str]] = {"vm": [], "nic": []}
        self.no_capacity: dict[tuple[str, str, str], str] = {}   # (size, region, priority) -> error kind
        self.custom_data: dict[str, str] = {}      # VM name (lowercased) -> base64 custom data it was given
        self.deleted: list[str] = []               # kind/name of every resource deleted, in order
        self._async: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self._next_ip: dict[str, int] = {}         # subnet id -> next host index
        self._lock = threading.Lock()
        self._server: LoopbackServer | None = None

    # -- test controls ----------------------------------------------------------------------------
    def queue_error(self, what: str, kind: str, times: int = 1) -> None:
        self.fail[what].extend([kind] * times)

    def set_no_capacity(self, rules: dict[tuple[str, str, str], str]) -> None:
        """``{(vm_size, region, "Spot"|"Regular"): kind}`` — ``"*"`` matches any; ``kind`` one of
        ``sku`` (SkuNotAvailable, synchronous) or ``allocation``/``zonal`` (failed async operation).
        Replaces the previous rules; ``{}`` gives capacity back."""
        bad = [k for k in rules.values() if k not in SYNC_ERRORS and k not in ASYNC_ERRORS]
        if bad:
            raise ValueError(f"unknown capacity error kinds {bad}")
        with self._lock:
            self.no_capacity = dict(rules)

    def evict(self, vm_name: str) -> bool:
        """Evict a VM as Azure does with ``evictionPolicy=Delete``: the VM and what it owns with
        ``deleteOption=Delete`` go away. False when there was no such VM."""
        with self._lock:
            return self._delete_vm(f"virtualmachines/{vm_name.lower()}")

    def put_vnet(self, name: str, region: str, prefix: str, subnets: dict[str, str],
                 resource_group: str = "rg-1", subscription: str = "sub-1", nat_gateway: str | None = None) -> dict:
        """A VNet that exists before spotwise (``subnets``: name -> prefix), as an operator made it;
        ``nat_gateway``: the resource id of a NAT gateway every subnet is associated with (infra/azure's
        ``azurerm_subnet_nat_gateway_association``)."""
        path = (f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Network/"
                f"virtualNetworks/{name}")
        nat = {"natGateway": {"id": nat_gateway}} if nat_gateway else {}
        body = {"location": region, "properties": {"addressSpace": {"addressPrefixes": [prefix]}, "subnets": [
            {"name": n, "properties": {"addressPrefix": p, **nat}} for n, p in subnets.items()]}}
        with self._lock:
            return self._put("virtualnetworks", f"virtualnetworks/{name.lower()}", path, name, body)[1]

    def first_nic(self, vm: dict, *, required: bool = False) -> dict | None:
        """The network interface a VM's ``networkProfile`` names first, as stored. Where it is gone
        (deleted with its VM since the VM was listed): None, or KeyError when ``required``."""
        ref = vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"]
        with self._lock:
            nic = self.resources.get(f"networkinterfaces/{ref.rsplit('/', 1)[-1].lower()}")
        if nic is None and required:
            raise KeyError(f"{vm['name']}: its network interface is gone")
        return nic

    def nic_public_ip(self, vm: dict) -> str | None:
        """The address of the public IP on a VM's first NIC (None: it has none)."""
        nic = self.first_nic(vm) or {}
        with self._lock:
            ipcs = (nic.get("properties") or {}).get("ipConfigurations") or [{}]
            pip = ((ipcs[0].get("properties") or {}).get("publicIPAddress") or {}).get("id")
            res = self.resources.get(f"publicipaddresses/{_short(pip)}") if pip else None
        return ((res or {}).get("properties") or {}).get("ipAddress")

    def nic_port_22_sources(self, vm: dict) -> list[str]:
        """The source prefixes the NSG of a VM's first NIC allows inbound TCP port 22 from."""
        nic = self.first_nic(vm) or {}
        with self._lock:
            nsg_id = ((nic.get("properties") or {}).get("networkSecurityGroup") or {}).get("id")
            nsg = self.resources.get(f"networksecuritygroups/{_short(nsg_id)}") if nsg_id else None
            rules = [r.get("properties") or {} for r in ((nsg or {}).get("properties") or {}).get("securityRules") or []]
        out: list[str] = []
        for r in rules:
            ports = [*(r.get("destinationPortRanges") or []), *([r["destinationPortRange"]] if r.get("destinationPortRange") else [])]
            opens_22 = any(p == "*" or p == "22" or ("-" in p and int(p.split("-")[0]) <= 22 <= int(p.split("-")[1]))
                           for p in ports)
            if r.get("direction") == "Inbound" and r.get("access") == "Allow" and r.get("protocol") in ("Tcp", "*") and opens_22:
                out += [*(r.get("sourceAddressPrefixes") or []),
                        *([r["sourceAddressPrefix"]] if r.get("sourceAddressPrefix") else [])]
        return sorted(set(out))

    def nic_subnet(self, vm: dict) -> tuple[str, dict]:
        """The VNet name and the subnet (as ARM returns it) of a VM's first NIC (KeyError: the NIC
        is gone)."""
        nic = self.first_nic(vm, required=True)
        with self._lock:
            sid = nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
            vnet = sid.split("/subnets/")[0].rsplit("/", 1)[-1]
            res = self.resources.get(f"virtualnetworks/{vnet.lower()}") or {"properties": {}}
            subnet = next((dict(s) for s in res["properties"].get("subnets", []) if s.get("id", "").lower() == sid.lower()),
                          {"id": sid, "properties": {}})
        return vnet, subnet

    def subnets(self, vnet: str) -> dict[str, str]:
        """``{name: prefix}`` of a VNet's subnets."""
        res = self.resources.get(f"virtualnetworks/{vnet.lower()}") or {"properties": {}}
        return {s["name"]: s["properties"]["addressPrefix"] for s in res["properties"].get("subnets", [])}

    def of_kind(self, kind: str) -> list[dict]:
        return [r for k, r in self.resources.items() if k.startswith(kind.lower() + "/")]

    def vms(self) -> list[dict]:
        return self.of_kind("virtualMachines")

    def nics(self) -> list[dict]:
        return self.of_kind("networkInterfaces")

    def disks(self) -> list[dict]:
        return self.of_kind("disks")

    def nsgs(self) -> list[dict]:
        return self.of_kind("networkSecurityGroups")

    def public_ips(self) -> list[dict]:
        return self.of_kind("publicIPAddresses")

    def list_calls(self) -> list[str]:
        """The path of every list call made (throttled ones included)."""
        return [r["path"] for r in self.requests if r["method"] == "GET" and _LIST.match(r["path"])]

    # -- server -----------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return self._server.url

    def start(self) -> "AzureFake":
        self._server = LoopbackServer({m: self._handle for m in ("GET", "PUT", "DELETE")}, name="azure-arm").start()
        return self

    def _handle(self, ex: Exchange) -> None:
        raw = ex.read_body()
        body = json.loads(raw) if raw else None
        path = ex.url.path
        with self._lock:
            self.requests.append({"method": ex.command, "path": path, "body": body,
                                  "auth": ex.headers.get("Authorization")})
            status, out, headers = self._route(ex.command, path, body)
        ex.send(status, json.dumps(out) if out is not None else b"", "application/json", headers)

    def stop(self) -> None:
        if self._server:
            self._server.stop()
            self._server = None

    # -- ARM --------------------------------------------------------------------------------------
    @staticmethod
    def _err(status: int, code: str, message: str | None = None) -> tuple[int, dict, dict]:
        headers = {"Retry-After": "0"} if status == 429 else {}
        return status, {"error": {"code": code, "message": message or f"{code} (fake)"}}, headers

    def _fail_async(self, code: str, name: str, body: dict) -> tuple[int, dict, dict]:
        op = f"op{next(self._ids)}"
        self._async[op] = {"status": "Failed", "error": {"code": code, "message": f"{code} (fake)"}}
        return 201, {**body, "name": name, "properties": {**body.get("properties", {}),
                                                           "provisioningState": "Creating"}}, \
            {"Azure-AsyncOperation": f"{self.endpoint}/fake-async/{op}"}

    def _capacity_rule(self, body: dict) -> str | None:
        props = body.get("properties", {})
        size = props.get("hardwareProfile", {}).get("vmSize", "")
        region = body.get("location", "")
        prio = props.get("priority") or "Regular"
        for (s, r, p), kind in self.no_capacity.items():
            if s in ("*", size) and r in ("*", region) and p in ("*", prio):
                return kind
        return None

    def _route(self, method: str, path: str, body) -> tuple[int, dict | None, dict]:
        if m := _ASYNC.match(path):
            return 200, self._async.pop(m.group(1), {"status": "Succeeded"}), {}
        if method == "GET" and (m := _LIST.match(path)):
            now = self.clock()
            self.list_times[:] = [t for t in self.list_times if now - t < 60]
            if len(self.list_times) >= self.list_limit_per_min:
                self.throttled += 1
                wait = max(1, math.ceil(60 - (now - self.list_times[0])))
                return 429, {"error": {"code": "TooManyRequests", "message": "throttled (fake)"}}, \
                    {"Retry-After": str(wait)}
            self.list_times.append(now)
            _, rg, _, kind = m.groups()
            rows = [r for r in self.of_kind(kind)
                    if rg is None or f"/resourcegroups/{rg.lower()}/" in r["id"].lower()]
            return 200, {"value": rows}, {}
        if m := _SUBNET.match(path):
            return self._subnet(method, m.group(3), m.group(4), path, body)
        m = _RES.match(path)
        if not m:
            return 404, {"error": {"code": "NotFound", "message": f"no route {method} {path}"}}, {}
        _, _, _, kind, name = m.groups()
        key = f"{kind.lower()}/{name.lower()}"
        if method == "PUT":
            return self._put(kind.lower(), key, path, name, body)
        if method == "GET":
            if key not in self.resources:
                return self._err(404, "ResourceNotFound")
            return 200, self.resources[key], {}
        if method == "DELETE":
            return self._delete(kind.lower(), key)
        return 405, {"error": {"code": "MethodNotAllowed", "message": method}}, {}

    def _subnet(self, method: str, vnet: str, name: str, path: str, body) -> tuple[int, dict | None, dict]:
        res = self.resources.get(f"virtualnetworks/{vnet.lower()}")
        if res is None:
            return self._err(404, "ResourceNotFound", f"VNet {vnet} not found (fake)")
        subs = res["properties"].setdefault("subnets", [])
        have = next((s for s in subs if s["name"].lower() == name.lower()), None)
        if method == "GET":
            return (200, have, {}) if have else self._err(404, "NotFound", f"subnet {name} not found (fake)")
        if method != "PUT":
            return 405, {"error": {"code": "MethodNotAllowed", "message": method}}, {}
        new = {"name": name, "id": path, "properties": {**(body or {}).get("properties", {}),
                                                         "provisioningState": "Succeeded"}}
        subs[:] = [s for s in subs if s is not have] + [new]
        return 200, new, {}

    def _in_use(self, subnet_id: str) -> bool:
        return any((ipc.get("properties", {}).get("subnet") or {}).get("id", "").lower() == subnet_id.lower()
                   for nic in self.nics() for ipc in nic.get("properties", {}).get("ipConfigurations", []))

    def _put(self, kind: str, key: str, path: str, name: str, body: dict) -> tuple[int, dict | None, dict]:
        what = {"virtualmachines": "vm", "networkinterfaces": "nic"}.get(kind)
        if what and self.fail[what]:
            k = self.fail[what].pop(0)
            if k in SYNC_ERRORS:
                return self._err(*SYNC_ERRORS[k])
            return self._fail_async(ASYNC_ERRORS[k], name, body)
        if kind == "virtualmachines" and (refused := _premium_refusal(body)):
            return self._err(400, "InvalidParameter", refused)
        if kind == "virtualmachines" and (k := self._capacity_rule(body)):
            if k in SYNC_ERRORS:
                size = body["properties"]["hardwareProfile"]["vmSize"]
                return self._err(SYNC_ERRORS[k][0], SYNC_ERRORS[k][1],
                                 f"The requested VM size {size} is currently not available in location "
                                 f"{body.get('location')}. (fake)")
            return self._fail_async(ASYNC_ERRORS[k], name, body)
        res = json.loads(json.dumps(body))
        res.update({"id": path, "name": name, "type": f"Microsoft.x/{kind}"})
        props = res.setdefault("properties", {})
        props["provisioningState"] = "Succeeded"
        if kind == "virtualnetworks":
            for s in props.get("subnets", []):
                s["id"] = f"{path}/subnets/{s['name']}"
            kept = {s["id"].lower() for s in props.get("subnets", [])}
            for old in (self.resources.get(key) or {}).get("properties", {}).get("subnets", []):
                if old["id"].lower() not in kept and self._in_use(old["id"]):
                    return self._err(400, "InUseSubnetCannotBeDeleted",
                                     f"Subnet {old['name']} is in use and cannot be deleted (fake)")
        elif kind == "networkinterfaces":
            nsg = (props.get("networkSecurityGroup") or {}).get("id")
            if nsg and f"networksecuritygroups/{_short(nsg)}" not in self.resources:
                return self._err(400, "InvalidResourceReference", f"NSG {nsg} not found (fake)")
            for ipc in props.get("ipConfigurations", []):
                pip = ((ipc.get("properties") or {}).get("publicIPAddress") or {}).get("id")
                if pip and f"publicipaddresses/{_short(pip)}" not in self.resources:
                    return self._err(400, "InvalidResourceReference", f"public IP {pip} not found (fake)")
            old = self.resources.get(key)
            for i, ipc in enumerate(props.get("ipConfigurations", [])):
                p = ipc.setdefault("properties", {})
                prev = (old or {}).get("properties", {}).get("ipConfigurations", [{}] * (i + 1))[i]
                p["privateIPAddress"] = (prev.get("properties", {}).get("privateIPAddress")
                                         or self._allocate_ip((p.get("subnet") or {}).get("id", "")))
        elif kind == "publicipaddresses":
            # a Standard SKU address is Static, and a static one is assigned when the resource is
            # created ("Public IP addresses", learn.microsoft.com/azure/virtual-network/ip-services/
            # public-ip-addresses: SKU and allocation); from the fake's public range
            if (res.get("sku") or {}).get("name") == "Standard" and props.get("publicIPAllocationMethod") != "Static":
                return self._err(400, "StandardSkuPublicIPAddressesMustBeStatic",
                                 f"Standard sku publicIp {name} must have AllocationMethod set to Static (fake)")
            old_ip = (self.resources.get(key) or {}).get("properties", {}).get("ipAddress")
            props["ipAddress"] = old_ip or str(next(self._public_hosts))
        elif kind == "virtualmachines":
            os_profile = props.get("osProfile") or {}
            if "customData" in os_profile:
                self.custom_data[name.lower()] = os_profile.pop("customData")
            disk = props.get("storageProfile", {}).get("osDisk", {})
            disk_name = disk.setdefault("name", f"{name}_OsDisk_1_{next(self._ids):08x}")
            disk.setdefault("managedDisk", {})["id"] = path.split("/providers/")[0] + \
                f"/providers/Microsoft.Compute/disks/{disk_name}"
            self.resources[f"disks/{disk_name.lower()}"] = {
                "id": disk["managedDisk"]["id"], "name": disk_name, "location": body.get("location"),
                "type": "Microsoft.Compute/disks", "managedBy": path,
                "properties": {"diskSizeGB": disk.get("diskSizeGB", 30), "diskState": "Attached",
                               "provisioningState": "Succeeded"}}
        self.resources[key] = res
        return 200, res, {}

    def _allocate_ip(self, subnet_id: str) -> str:
        vnet = self.resources.get(f"virtualnetworks/{_short(subnet_id.split('/subnets/')[0])}", {})
        prefix = next((s["properties"]["addressPrefix"] for s in vnet.get("properties", {}).get("subnets", [])
                       if s.get("id", "").lower() == subnet_id.lower()), "10.42.0.0/20")
        net = ipaddress.ip_network(prefix)
        n = self._next_ip.get(subnet_id.lower(), 4)
        self._next_ip[subnet_id.lower()] = n + 1
        return str(net.network_address + n)

    def _delete(self, kind: str, key: str) -> tuple[int, dict | None, dict]:
        if key not in self.resources:
            return 204, None, {}
        if kind == "virtualmachines":
            self._delete_vm(key)
            return 200, None, {}
        if kind == "networksecuritygroups" and any(
                _short((n["properties"].get("networkSecurityGroup") or {}).get("id", "")) == key.split("/", 1)[1]
                for n in self.nics()):
            return self._err(400, "InUseNetworkSecurityGroupCannotBeDeleted")
        if kind == "networkinterfaces" and any(
                _short(ref["id"]) == key.split("/", 1)[1]
                for vm in self.vms() for ref in vm["properties"].get("networkProfile", {}).get("networkInterfaces", [])):
            return self._err(400, "NicInUse")
        if kind == "disks" and self.resources[key].get("managedBy"):
            return self._err(409, "OperationNotAllowed", "Disk is attached to a VM (fake)")
        self.resources.pop(key)
        self.deleted.append(key)
        return 200, None, {}

    def _delete_vm(self, key: str) -> bool:
        res = self.resources.pop(key, None)
        if res is None:
            return False
        self.deleted.append(key)
        props = res.get("properties", {})
        for ref in props.get("networkProfile", {}).get("networkInterfaces", []):
            if ref.get("properties", {}).get("deleteOption") == "Delete":
                nic = f"networkinterfaces/{_short(ref['id'])}"
                if self.resources.pop(nic, None) is not None:
                    self.deleted.append(nic)
        disk = props.get("storageProfile", {}).get("osDisk", {})
        dkey = f"disks/{disk.get('name', '').lower()}"
        if dkey in self.resources:
            if disk.get("deleteOption") == "Delete":
                self.resources.pop(dkey)
                self.deleted.append(dkey)
            else:
                self.resources[dkey]["managedBy"] = None
                self.resources[dkey]["properties"]["diskState"] = "Unattached"
        return True
