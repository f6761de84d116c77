"""A wire-level fake of the Compute Engine v1 REST API (the calls spotwise makes).

Serves on 127.0.0.1 for the real ``google-cloud-compute`` client (``transport="rest"``). Records
every request; errors can be queued per operation, shaped the way Compute Engine sends them:
capacity and quota failures as a DONE operation carrying ``error.errors[].code``, throttling and
auth as HTTP errors with a JSON error body. Operations start RUNNING and become DONE on ``wait``
(or after one GET), so the client's polling is exercised.

What it models beyond the instance calls:

* **private addresses** from one subnetwork range per region (``ip_range``; the instance emulator
  passes a loopback range such as ``127.17.0.0/16`` so each node's Ray binds to a real, distinct
  address), served by ``regions/R/subnetworks``;
* **external addresses**: an access config without ``natIP`` gets one from ``external_range``
  (default TEST-NET-2, documentation addresses nothing answers);
* **boot disks**: an insert creates one disk per ``initializeParams`` disk (its labels, the
  instance as its user); deleting the instance deletes ``autoDelete`` disks;
* **firewall rules** (global, with global operations) and **addresses** (regional, with region
  operations), listed, fetched and deleted;
* **machine series rules**: an insert whose boot disk type (none given: ``pd-standard``) or
  network interface type the machine series does not support is refused with GCE's 400
  (:func:`machine_refusal`, its sources beside it);
* **routers and Cloud NAT** (:meth:`add_router`): none in a new project (its ``default`` network
  has no NAT, as on GCE), listed by ``aggregated/routers`` as GCE answers it (``items`` keyed
  ``regions/R``, each router's ``network`` and ``region`` as full URLs, its ``nats`` with
  ``sourceSubnetworkIpRangesToNat``; Compute Engine REST reference, "routers.aggregatedList" and
  the ``RouterNat`` resource);
* **capacity**: :meth:`set_no_capacity` makes inserts in a zone (optionally one provisioning
  model) fail with ``ZONE_RESOURCE_POOL_EXHAUSTED`` until given back;
* **rate limits**: list calls (``aggregated/*``, ``*/operations`` lists, firewall lists) are counted
  in a sliding minute (:attr:`list_times`, on :attr:`clock`); past ``list_limit_per_min`` (default
  1,500: Compute Engine's per-project "list requests" rate quota, docs "Compute Engine rate
  quotas") a list answers 429 with ``Retry-After`` = the seconds until the window has room, so a
  client that comes back earlier only earns another 429;
* **preemption**: :meth:`preempt` records a ``compute.instances.preempted`` zone operation (what
  GCP logs) and :meth:`reclaim` ends the instance the way its ``instanceTerminationAction`` says
  (``DELETE``: gone with its auto-delete disks; ``STOP``: ``TERMINATED``).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import re
import threading
import time
from datetime import datetime, timezone
from urllib.parse import parse_qs

from httpfake import Exchange, LoopbackServer

_P = r"^/compute/v1/projects/([^/]+)"
_INSTANCES = re.compile(_P + r"/zones/([^/]+)/instances(?:/([^/]+))?$")
_ZONE_OPS = re.compile(_P + r"/zones/([^/]+)/operations(?:/([^/]+?)(/wait)?)?$")
_GLOBAL_OPS = re.compile(_P + r"/global/operations/([^/]+?)(/wait)?$")
_REGION_OPS = re.compile(_P + r"/regions/([^/]+)/operations/([^/]+?)(/wait)?$")
_AGG = re.compile(_P + r"/aggregated/(instances|disks|addresses|routers)$")
_FIREWALLS = re.compile(_P + r"/global/firewalls(?:/([^/]+))?$")
_DISK = re.compile(_P + r"/zones/([^/]+)/disks/([^/]+)$")
_ADDRESS = re.compile(_P + r"/regions/([^/]+)/addresses(?:/([^/]+))?$")
_SUBNETS = re.compile(_P + r"/regions/([^/]+)/subnetworks$")

HTTP_ERRORS = {
    "throttle": (429, "rateLimitExceeded", "Rate Limit Exceeded"),
    "auth": (401, "authError", "Request had invalid authentication credentials."),
    "forbidden": (403, "forbidden", "Required 'compute.instances.create' permission"),
    "quota-http": (403, "quotaExceeded", "Quota 'NVIDIA_A100_GPUS' exceeded."),
}
OP_ERRORS = {
    "capacity": "ZONE_RESOURCE_POOL_EXHAUSTED",
    "capacity-details": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "quota": "QUOTA_EXCEEDED",
}
PREEMPTED_OP = "compute.instances.preempted"

# What each machine series accepts as its boot disk and network interface, as GCE enforces it.
# Disk types: GCP's machine-family pages, "Supported disk types" (accelerator-optimized: A3 Mega,
# High, Edge: Hyperdisk, pd-ssd, pd-balanced; A3 Ultra: Hyperdisk Balanced/Extreme only; A2:
# pd-standard, pd-ssd, pd-balanced, Hyperdisk ML; G2: pd-ssd, pd-balanced, Hyperdisk ML/Throughput;
# general-purpose: N4 and C4 Hyperdisk only, N1/N2/E2 any persistent disk). A boot disk without
# ``diskType`` is pd-standard. gVNIC: the A3 page ("gVNIC is required"). GCE's refusal is a
# synchronous 400 whose message names the clashing pair, "[pd-standard, n4-standard-2] features are
# not compatible for creating instance." (quoted from GCE in DataBiosphere/dsub#301 and, for
# pd-balanced on c4, astronomer/astronomer#2463); the interface clash is answered in the same form,
# naming VIRTIO_NET (the default interface).
_PD = {"pd-standard", "pd-balanced", "pd-ssd", "pd-extreme"}
_HD = {"hyperdisk-balanced", "hyperdisk-extreme", "hyperdisk-ml", "hyperdisk-throughput"}
DISK_TYPES: list[tuple[str, set[str]]] = [        # (machine type prefix, boot disk types allowed)
    ("a3-ultragpu", {"hyperdisk-balanced", "hyperdisk-extreme"}),
    ("a4-", {"hyperdisk-balanced", "hyperdisk-extreme"}),
    ("a4x-", {"hyperdisk-balanced", "hyperdisk-extreme"}),
    ("a3-", {"pd-ssd", "pd-balanced"} | _HD),
    ("a2-", {"pd-standard", "pd-ssd", "pd-balanced", "hyperdisk-ml"}),
    ("g2-", {"pd-ssd", "pd-balanced", "hyperdisk-ml", "hyperdisk-throughput"}),
    ("n4-", {"hyperdisk-balanced"}),
    ("c4-", {"hyperdisk-balanced", "hyperdisk-extreme"}),
    ("n1-", _PD), ("n2-", _PD), ("n2d-", _PD), ("e2-", _PD),
]
GVNIC_ONLY = ("a3-", "a4-", "a4x-")


def machine_refusal(body: dict) -> str | None:
    """GCE's message refusing this insert's machine type with its boot disk type or interface type."""
    machine = str(body.get("machineType", "")).rsplit("/", 1)[-1]
    for d in body.get("disks") or []:
        params = d.get("initializeParams")
        if not d.get("boot") or params is None:
            continue
        disk = str(params.get("diskType") or "pd-standard").rsplit("/", 1)[-1]
        allowed = next((ok for prefix, ok in DISK_TYPES if machine.startswith(prefix)), None)
        if allowed is not None and disk not in allowed:
            return f"[{disk}, {machine}] features are not compatible for creating instance."
    if machine.startswith(GVNIC_ONLY):
        for nic in body.get("networkInterfaces") or []:
            if nic.get("nicType", "VIRTIO_NET") != "GVNIC":
                return f"[{nic.get('nicType', 'VIRTIO_NET')}, {machine}] features are not compatible for creating instance."
    return None


def _not_found(what: str) -> tuple[int, dict]:
    return 404, {"error": {"code": 404, "message": f"{what} not found", "errors": [{"reason": "notFound"}]}}


class GcpFake:
    def __init__(self, *, ip_range: str = "10.128.0.0/20", external_range: str = "198.51.100.0/24",
                 network: str = "global/networks/default",
                 list_limit_per_min: int = 1500) -> None:
        self.list_limit_per_min = list_limit_per_min
        self.list_times: list[float] = []                        # clock() of every list call answered
        self.throttled = 0                                       # list calls answered 429
        self.clock = time.monotonic
        self.instances: dict[tuple[str, str, str], dict] = {}   # (project, zone, name) -> body
        self.disks: dict[tuple[str, str, str], dict] = {}       # (project, zone, name) -> disk
        self.firewalls: dict[tuple[str, str], dict] = {}        # (project, name) -> rule
        self.addresses: dict[tuple[str, str, str], dict] = {}   # (project, region, name) -> address
        self.routers: dict[tuple[str, str, str], dict] = {}     # (project, region, name) -> router
        self.operations: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.fail: dict[str, list[str]] = {"insert": [], "delete": [], "list": []}
        self.no_capacity: set[tuple[str, str]] = set()           # (zone | "*", model | "*")
        self.ip_range = ipaddress.ip_network(ip_range)
        self.network = network
        self._ids = itertools.count(1000)
        self._hosts = self.ip_range.hosts()
        self.external_range = ipaddress.ip_network(external_range)
        self._external = self.external_range.hosts()
        next(self._hosts)                                        # .1 is the subnet's gateway
        self._lock = threading.RLock()
        self._server: LoopbackServer | None = None

    # -- control ---------------------------------------------------------------------------------
    def add_router(self, project: str, region: str, *, nat: bool = True, network: str | None = None,
                   name: str | None = None, ranges: str = "ALL_SUBNETWORKS_ALL_IP_RANGES",
                   subnetworks: list[str] | None = None) -> dict:
        """A Cloud Router in ``region`` on ``network`` (default: the fake's), with one NAT (infra/gcp's
        ``google_compute_router_nat``: ``AUTO_ONLY``, ``ranges``) unless ``nat`` is false."""
        base = f"https://www.googleapis.com/compute/v1/projects/{project}"
        net = (network or self.network).rsplit("/", 1)[-1]
        router: dict = {"kind": "compute#router", "id": str(next(self._ids)), "name": name or f"spotwise-{region}",
                        "region": f"{base}/regions/{region}", "network": f"{base}/global/networks/{net}",
                        "selfLink": f"{base}/regions/{region}/routers/{name or f'spotwise-{region}'}"}
        if nat:
            router["nats"] = [{"name": router["name"], "natIpAllocateOption": "AUTO_ONLY",
                               "sourceSubnetworkIpRangesToNat": ranges,
                               **({"subnetworks": [{"name": f"{base}/regions/{region}/subnetworks/{s}",
                                                    "sourceIpRangesToNat": ["ALL_IP_RANGES"]}
                                                   for s in subnetworks]} if subnetworks else {})}]
        with self._lock:
            self.routers[(project, region, router["name"])] = router
        return router

    def has_nat(self, project: str, region: str) -> bool:
        """Whether a router of the fake's network in ``region`` carries a NAT (the emulated GCP asks
        before it lets a node without an external address fetch anything)."""
        net = self.network.rsplit("/", 1)[-1]
        with self._lock:
            return any(r.get("nats") and r["network"].rsplit("/", 1)[-1] == net
                       for (p, reg, _), r in self.routers.items() if p == project and reg == region)

    def queue_error(self, op: str, kind: str, times: int = 1) -> None:
        self.fail[op].extend([kind] * times)

    def running(self) -> list[dict]:
        return [i for i in self.instances.values() if i["status"] != "TERMINATED"]

    def set_no_capacity(self, pairs: list[str]) -> None:
        """``["us-central1-a", "us-central1-b:SPOT", "*:SPOT"]``: inserts there (that provisioning
        model, or any) answer ``ZONE_RESOURCE_POOL_EXHAUSTED``. An empty list gives all back."""
        out = set()
        for p in pairs:
            zone, _, model = p.partition(":")
            out.add((zone, (model or "*").upper()))
        with self._lock:
            self.no_capacity = out

    def preempt(self, zone: str, name: str, project: str | None = None) -> dict:
        """Start GCP's preemption of an instance: the ``compute.instances.preempted`` operation
        appears in the zone (the notice itself is the metadata server's job)."""
        with self._lock:
            key = self._key(zone, name, project)
            inst = self.instances[key]
            op = self._op(key[0], zone, f"zones/{zone}/instances/{name}", PREEMPTED_OP)
            self._finish(op["name"])
            inst["_preempted"] = True
            return inst

    def reclaim(self, zone: str, name: str, project: str | None = None) -> None:
        """End a preempted instance the way its ``instanceTerminationAction`` says."""
        with self._lock:
            key = self._key(zone, name, project)
            inst = self.instances.get(key)
            if inst is None:
                return
            action = (inst.get("scheduling") or {}).get("instanceTerminationAction", "STOP")
            if action == "DELETE":
                self._delete_instance(key)
            else:
                inst["status"] = "TERMINATED"

    def _key(self, zone: str, name: str, project: str | None) -> tuple[str, str, str]:
        if project is not None:
            return (project, zone, name)
        return next(k for k in self.instances if k[1] == zone and k[2] == name)

    def metadata(self, inst: dict) -> dict[str, str]:
        return {i["key"]: i["value"] for i in (inst.get("metadata") or {}).get("items") or []}

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return self._server.url

    def start(self) -> "GcpFake":
        self._server = LoopbackServer({m: self._handle for m in ("GET", "POST", "DELETE")}, name="gcp-compute").start()
        return self

    def _handle(self, ex: Exchange) -> None:
        raw = ex.read_body()
        body = json.loads(raw) if raw else None
        url = ex.url
        with self._lock:
            self.requests.append({"method": ex.command, "path": url.path, "query": parse_qs(url.query),
                                  "body": body, "auth": ex.headers.get("Authorization")})
            if ex.command == "GET" and _is_list(url.path) and (wait := self._over_limit()) is not None:
                self.throttled += 1
                ex.send_json(429, {"error": {"code": 429, "message": "Rate Limit Exceeded", "errors": [
                    {"message": "Rate Limit Exceeded", "domain": "usageLimits", "reason": "rateLimitExceeded"}]}},
                    {"Retry-After": str(wait)})
                return
            auth = ex.headers.get("Authorization") or ""
            if auth.startswith("Bearer emu-") and not auth.endswith("-compute"):
                # a node's token (emulator.gcp_metadata) whose scopes do not include the Compute API
                ex.send_json(403, {"error": {"code": 403, "message": "Request had insufficient authentication scopes.",
                                             "errors": [{"reason": "insufficientPermissions"}]}})
                return
            status, out = self._route(ex.command, url.path, parse_qs(url.query), body)
        ex.send_json(status, out)

    def _over_limit(self) -> int | None:
        """Count one list call; None when within the limit, else the seconds until the window has room."""
        now = self.clock()
        self.list_times[:] = [t for t in self.list_times if now - t < 60]
        if len(self.list_times) >= self.list_limit_per_min:
            return max(1, math.ceil(60 - (now - self.list_times[0])))
        self.list_times.append(now)
        return None

    def list_calls(self) -> list[str]:
        """The path of every list call made (throttled ones included)."""
        return [r["path"] for r in self.requests if r["method"] == "GET" and _is_list(r["path"])]

    def stop(self) -> None:
        if self._server:
            self._server.stop()
            self._server = None

    # -- API -------------------------------------------------------------------------------------
    def _http_error(self, kind: str) -> tuple[int, dict]:
        status, reason, msg = HTTP_ERRORS[kind]
        return status, {"error": {"code": status, "message": msg,
                                  "errors": [{"message": msg, "domain": "global", "reason": reason}]}}

    def _op(self, project: str, scope: str | None, target: str, kind: str, error: str | None = None,
            *, scope_kind: str = "zone") -> dict:
        oid = next(self._ids)
        name = f"operation-{oid}"
        op = {"kind": "compute#operation", "id": str(oid), "name": name, "operationType": kind,
              "targetLink": target, "status": "RUNNING", "progress": 0, "_project": project}
        if scope_kind == "zone":
            op["zone"] = scope
        elif scope_kind == "region":
            op["region"] = scope
        if error:
            op["_pending_error"] = error
        self.operations[name] = op
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def _finish(self, name: str) -> dict:
        op = self.operations[name]
        op["status"] = "DONE"
        op["progress"] = 100
        err = op.pop("_pending_error", None)
        if err:
            op["error"] = {"errors": [{"code": err, "message": f"{err} (fake)"}]}
            op["httpErrorStatusCode"] = 403 if err == "QUOTA_EXCEEDED" else 503
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def _poll_op(self, method: str, name: str, wait: bool) -> tuple[int, dict]:
        if name not in self.operations:
            return _not_found(f"operation {name}")
        op = self.operations[name]
        if wait or op["status"] == "RUNNING" and method == "GET" and op.get("_seen"):
            return 200, self._finish(name)
        op["_seen"] = True
        return 200, {k: v for k, v in op.items() if not k.startswith("_")}

    def _delete_instance(self, key: tuple[str, str, str]) -> None:
        inst = self.instances.pop(key)
        for d in inst.get("disks") or []:
            dkey = (key[0], key[1], d.get("deviceName") or key[2])
            if d.get("autoDelete") and dkey in self.disks:
                del self.disks[dkey]
            elif dkey in self.disks:
                self.disks[dkey]["users"] = []

    def _insert_instance(self, project: str, zone: str, body: dict) -> tuple[int, dict]:
        target = f"zones/{zone}/instances/{body['name']}"
        refused = machine_refusal(body)
        if refused:
            return 400, {"error": {"code": 400, "message": refused,
                                   "errors": [{"message": refused, "domain": "global", "reason": "badRequest"}]}}
        if self.fail["insert"]:
            kind = self.fail["insert"].pop(0)
            if kind in HTTP_ERRORS:
                return self._http_error(kind)
            return 200, self._op(project, zone, target, "insert", OP_ERRORS[kind])
        model = (body.get("scheduling") or {}).get("provisioningModel", "STANDARD")
        if {(zone, model), (zone, "*"), ("*", model), ("*", "*")} & self.no_capacity:
            return 200, self._op(project, zone, target, "insert", OP_ERRORS["capacity"])
        key = (project, zone, body["name"])
        if key in self.instances:
            return 409, {"error": {"code": 409, "message": "already exists", "errors": [{"reason": "alreadyExists"}]}}
        inst = json.loads(json.dumps(body))
        inst.update({"id": str(next(self._ids)), "status": "RUNNING", "zone": f"zones/{zone}",
                     "creationTimestamp": datetime.now(timezone.utc).isoformat(timespec="milliseconds")})
        for nic in inst.get("networkInterfaces", []):
            nic["networkIP"] = str(next(self._hosts))
            nic.setdefault("network", self.network)
            # an access config without natIP gets an ephemeral external address ("If you do not
            # specify an external IP address, an ephemeral IP address ... is assigned": Compute
            # Engine API, instances.insert, networkInterfaces[].accessConfigs[].natIP)
            for ac in nic.get("accessConfigs") or []:
                if ac.get("type", "ONE_TO_ONE_NAT") == "ONE_TO_ONE_NAT" and not ac.get("natIP"):
                    ac["natIP"] = str(next(self._external))
        for d in inst.get("disks") or []:
            params = d.pop("initializeParams", None)
            if params is None:
                continue
            d["deviceName"] = d.get("deviceName") or body["name"]
            self.disks[(project, zone, d["deviceName"])] = {
                "name": d["deviceName"], "zone": f"zones/{zone}", "sizeGb": str(params.get("diskSizeGb", 10)),
                "sourceImage": params.get("sourceImage"), "labels": params.get("labels") or {},
                "users": [f"zones/{zone}/instances/{body['name']}"], "status": "READY"}
            d["source"] = f"zones/{zone}/disks/{d['deviceName']}"
        self.instances[key] = inst
        return 200, self._op(project, zone, target, "insert")

    def _aggregated(self, project: str, what: str, flt: str) -> tuple[int, dict]:
        if what == "instances" and self.fail["list"]:
            return self._http_error(self.fail["list"].pop(0))
        store = {"instances": self.instances, "disks": self.disks, "addresses": self.addresses,
                 "routers": self.routers}[what]
        items: dict[str, dict] = {}
        for (p, scope, _), res in store.items():
            if p == project and _matches(res, flt):
                prefix = "regions" if what in ("addresses", "routers") else "zones"
                items.setdefault(f"{prefix}/{scope}", {what: []})[what].append(_public(res))
        return 200, {"kind": f"compute#{what}AggregatedList", "items": items}

    def _route(self, method: str, path: str, query: dict, body) -> tuple[int, dict]:
        flt = (query.get("filter") or [""])[0]
        if m := _ZONE_OPS.match(path):
            project, zone, name, wait = m.groups()
            if name is None:
                ops = [_public(o) for o in self.operations.values()
                       if o.get("zone") == zone and o["_project"] == project and _matches(o, flt)]
                return 200, {"kind": "compute#operationList", "items": ops}
            return self._poll_op(method, name, bool(wait))
        if m := _GLOBAL_OPS.match(path):
            return self._poll_op(method, m.group(2), bool(m.group(3)))
        if m := _REGION_OPS.match(path):
            return self._poll_op(method, m.group(3), bool(m.group(4)))
        if m := _AGG.match(path):
            return self._aggregated(m.group(1), m.group(2), flt)
        if m := _SUBNETS.match(path):
            return 200, {"kind": "compute#subnetworkList", "items": [{
                "name": "default", "region": f"regions/{m.group(2)}", "network": self.network,
                "ipCidrRange": str(self.ip_range), "gatewayAddress": str(self.ip_range.network_address + 1)}]}
        if m := _FIREWALLS.match(path):
            project, name = m.groups()
            if name is None and method == "POST":
                if (project, body["name"]) in self.firewalls:
                    return 409, {"error": {"code": 409, "message": "already exists",
                                           "errors": [{"reason": "alreadyExists"}]}}
                self.firewalls[(project, body["name"])] = dict(body, id=str(next(self._ids)))
                return 200, self._op(project, None, f"global/firewalls/{body['name']}", "insert", scope_kind="global")
            if name is None:
                return 200, {"kind": "compute#firewallList",
                             "items": [r for (p, _), r in self.firewalls.items() if p == project]}
            if (project, name) not in self.firewalls:
                return _not_found(f"firewall {name}")
            if method == "DELETE":
                del self.firewalls[(project, name)]
                return 200, self._op(project, None, f"global/firewalls/{name}", "delete", scope_kind="global")
            return 200, self.firewalls[(project, name)]
        if m := _DISK.match(path):
            key = m.groups()
            if key not in self.disks:
                return _not_found(f"disk {key[2]}")
            if method == "DELETE":
                if self.disks[key].get("users"):
                    return 400, {"error": {"code": 400, "message": "disk in use",
                                           "errors": [{"reason": "resourceInUseByAnotherResource"}]}}
                del self.disks[key]
                return 200, self._op(key[0], key[1], f"zones/{key[1]}/disks/{key[2]}", "delete")
            return 200, _public(self.disks[key])
        if m := _ADDRESS.match(path):
            project, region, name = m.groups()
            if name is None and method == "POST":
                self.addresses[(project, region, body["name"])] = dict(body, region=f"regions/{region}",
                                                                       address=str(next(self._hosts)))
                return 200, self._op(project, region, f"regions/{region}/addresses/{body['name']}", "insert",
                                     scope_kind="region")
            key = (project, region, name)
            if key not in self.addresses:
                return _not_found(f"address {name}")
            if method == "DELETE":
                del self.addresses[key]
                return 200, self._op(project, region, f"regions/{region}/addresses/{name}", "delete",
                                     scope_kind="region")
            return 200, _public(self.addresses[key])
        if m := _INSTANCES.match(path):
            project, zone, name = m.groups()
            if method == "POST" and name is None:
                return self._insert_instance(project, zone, body)
            key = (project, zone, name)
            if method == "GET":
                if key not in self.instances:
                    return _not_found(f"instance {name}")
                return 200, _public(self.instances[key])
            if method == "DELETE":
                if self.fail["delete"]:
                    return self._http_error(self.fail["delete"].pop(0))
                if key not in self.instances:
                    return _not_found(f"instance {name}")
                self._delete_instance(key)
                return 200, self._op(project, zone, f"zones/{zone}/instances/{name}", "delete")
        return 404, {"error": {"code": 404, "message": f"fake has no route {method} {path}", "errors": []}}


def _is_list(path: str) -> bool:
    """A list call: an aggregated list, a zone's operations, the firewalls, a region's subnetworks."""
    return bool(_AGG.match(path) or path.endswith(("/operations", "/global/firewalls", "/subnetworks")))


def _public(res: dict) -> dict:
    return {k: v for k, v in res.items() if not k.startswith("_")}


def _matches(res: dict, flt: str) -> bool:
    """The filter forms spotwise sends: ``labels.K = "V"``, ``labels.K:*`` and ``FIELD = "V"``."""
    if not flt:
        return True
    labels = res.get("labels") or {}
    if m := re.fullmatch(r'labels\.([\w-]+)\s*=\s*"([^"]*)"', flt.strip()):
        return labels.get(m.group(1)) == m.group(2)
    if m := re.fullmatch(r"labels\.([\w-]+):\*", flt.strip()):
        return m.group(1) in labels
    if m := re.fullmatch(r'(\w+)\s*=\s*"([^"]*)"', flt.strip()):
        return str(res.get(m.group(1))) == m.group(2)
    raise ValueError(f"fake cannot parse filter {flt!r}")
