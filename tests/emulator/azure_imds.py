"""Loopback Azure services for emulated VMs (test support, never product code): the Instance
Metadata Service (:class:`AzureImds`) and the public Retail Prices API (:class:`RetailPrices`).

Each VM has its own root ``http://127.0.0.1:PORT/i/<vm-name>``, under which it answers what a VM's
``169.254.169.254`` answers, only with the header ``Metadata: true`` (else HTTP 400, as IMDS does):

* ``GET /metadata/instance/compute/name?...&format=text`` -> the VM name
* ``GET /metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress?...&format=text``
  -> the NIC's private address
* ``GET /metadata/instance/compute/tagsList`` -> ``[{"name": ..., "value": ...}]``;
  ``.../compute/tagsList/<key>?format=text`` -> that tag's value (what spotwise's boot script asks)
  and ``.../compute/tags?format=text`` -> ``k1:v1;k2:v2``
* ``GET /metadata/scheduledevents`` -> ``{"DocumentIncarnation": n, "Events": [...]}``; a posted
  ``Preempt`` event names the VM in ``Resources`` and carries ``NotBefore`` (RFC 1123)
* ``GET /metadata/identity/oauth2/token?resource=...`` -> for a VM carrying a managed identity,
  a JWT Azurite's ``--oauth basic`` accepts (:func:`entra_jwt`); 400 for a VM without one
* ``POST /metadata/scheduledevents`` ``{"StartRequests": [{"EventId": ...}]}`` -> 200; the event is
  acknowledged and ``on_ack(vm, event_id)`` is called (the platform may proceed at once).
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from email.utils import formatdate
import re
from typing import Callable
from urllib.parse import parse_qs

from httpfake import Exchange, LoopbackServer

INSTANCE = "/metadata/instance/"
EVENTS = "/metadata/scheduledevents"


TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"


def _b64(obj: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def entra_jwt(resource: str, *, oid: str, lifetime_s: int = 3599) -> str:
    """A token shaped as Entra ID issues a managed identity: a JWT whose issuer
    (``https://sts.windows.net/TENANT/``), audience (the resource asked for) and lifetime are what
    Azurite's ``--oauth basic`` checks (it does not check the signature)."""
    now = int(time.time())
    claims = {"aud": resource, "iss": f"https://sts.windows.net/{TENANT}/", "iat": now - 60, "nbf": now - 60,
              "exp": now + lifetime_s, "oid": oid, "sub": oid, "tid": TENANT}
    return f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64(claims)}.c2ln"


class AzureImds:
    def __init__(self, on_ack: Callable[[str, str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._vms: dict[str, dict] = {}          # vm name -> {"ip": ..., "tags": {...}}
        self._events: dict[str, list[dict]] = {}
        self._incarnation = 1
        self.acks: list[tuple[str, str]] = []    # (vm, event id) acknowledged, in order
        self.tokens: list[tuple[str, str]] = []  # (vm, resource) of every managed-identity token issued
        self.rejected = 0                        # requests without the Metadata header
        self.on_ack = on_ack
        self._server: LoopbackServer | None = None

    def set_vm(self, name: str, *, private_ip: str, tags: dict[str, str], resource_id: str = "",
               identity: bool | str = False) -> None:
        """``identity``: the VM carries a managed identity (a user-assigned one's resource id, or
        True), so ``/metadata/identity/oauth2/token`` answers a token (else 400, as IMDS does for a
        VM without one, or for an ``msi_res_id`` the VM does not carry)."""
        with self._lock:
            self._vms[name] = {"ip": private_ip, "tags": dict(tags), "id": resource_id, "identity": identity}

    def post_preempt(self, name: str, not_before: float) -> str:
        """A ``Preempt`` event for ``name`` with ``NotBefore`` at epoch ``not_before``; its id."""
        eid = str(uuid.uuid4()).upper()
        with self._lock:
            self._incarnation += 1
            self._events.setdefault(name, []).append({
                "EventId": eid, "EventStatus": "Scheduled", "EventType": "Preempt",
                "ResourceType": "VirtualMachine", "Resources": [name],
                "NotBefore": formatdate(not_before, usegmt=True), "Description": "Spot eviction (emulated)",
                "EventSource": "Platform", "DurationInSeconds": -1})
        return eid

    def base_url(self, name: str) -> str:
        assert self._server is not None
        return f"{self._server.url}/i/{name}"

    def start(self) -> "AzureImds":
        self._server = LoopbackServer({"GET": self._handle_get, "POST": self._handle_post}, name="azure-imds").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    # -- the wire ---------------------------------------------------------------------------------
    @staticmethod
    def _send(ex: Exchange, code: int, body, text: bool = False) -> None:
        ex.send(code, body if text else json.dumps(body), "text/plain" if text else "application/json")

    @staticmethod
    def _parse(ex: Exchange):
        u = ex.url
        parts = u.path.split("/", 3)
        if len(parts) < 4 or parts[1] != "i":
            return None
        return parts[2], "/" + parts[3], parse_qs(u.query)

    def _handle_get(self, ex: Exchange) -> None:
        send = self._send
        got = self._parse(ex)
        if got is None:
            return send(ex, 404, {"error": "Not found"})
        name, path, q = got
        if ex.headers.get("Metadata") != "true":
            with self._lock:
                self.rejected += 1
            return send(ex, 400, {"error": "Bad request. Required metadata header not specified"})
        with self._lock:
            vm = self._vms.get(name)
            events = [dict(e) for e in self._events.get(name, [])]
            inc = self._incarnation
        if vm is None:
            return send(ex, 404, {"error": "Not found"})
        if path == EVENTS:
            return send(ex, 200, {"DocumentIncarnation": inc, "Events": events})
        if path == "/metadata/identity/oauth2/token":
            asked = q.get("msi_res_id", [None])[0]
            if not vm["identity"] or not q.get("resource") or \
                    (asked is not None and (not isinstance(vm["identity"], str) or asked.lower() != vm["identity"].lower())):
                return send(ex, 400, {"error": "invalid_request", "error_description": "Identity not found"})
            with self._lock:
                self.tokens.append((name, q["resource"][0]))
            return send(ex, 200, {"access_token": entra_jwt(q["resource"][0], oid=f"emu-{name}"), "token_type": "Bearer",
                                  "resource": q["resource"][0], "expires_in": "3599",
                                  "expires_on": str(int(time.time()) + 3599)})
        if not path.startswith(INSTANCE):
            return send(ex, 404, {"error": "Not found"})
        text = q.get("format", ["json"])[0] == "text"
        value = self._instance(path[len(INSTANCE):], name, vm)
        if value is None:
            return send(ex, 404, {"error": "Not found"})
        if isinstance(value, str) and text:
            return send(ex, 200, value, text=True)
        return send(ex, 200, value)

    @staticmethod
    def _instance(sub: str, name: str, vm: dict):
        tags = vm["tags"]
        if sub == "compute/name":
            return name
        if sub == "compute/resourceId":
            return vm["id"] or None
        if sub == "network/interface/0/ipv4/ipAddress/0/privateIpAddress":
            return vm["ip"]
        if sub == "compute/tags":
            return ";".join(f"{k}:{v}" for k, v in tags.items())
        if sub == "compute/tagsList":
            return [{"name": k, "value": v} for k, v in tags.items()]
        if sub.startswith("compute/tagsList/"):
            return tags.get(sub.split("/", 2)[2])
        return None

    def _handle_post(self, ex: Exchange) -> None:
        got = self._parse(ex)
        raw = ex.read_body() or b"{}"
        if got is None or got[1] != EVENTS:
            return self._send(ex, 404, {"error": "Not found"})
        if ex.headers.get("Metadata") != "true":
            return self._send(ex, 400, {"error": "Bad request. Required metadata header not specified"})
        name = got[0]
        try:
            ids = [r["EventId"] for r in json.loads(raw).get("StartRequests", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._send(ex, 400, {"error": "Bad request"})
        with self._lock:
            known = {e["EventId"] for e in self._events.get(name, [])}
            acked = [i for i in ids if i in known]
            for i in acked:
                self.acks.append((name, i))
                for e in self._events[name]:
                    if e["EventId"] == i:
                        e["EventStatus"] = "Started"
        for i in acked:
            if self.on_ack is not None:
                self.on_ack(name, i)
        self._send(ex, 200, {})


class RetailPrices:
    """The Azure Retail Prices API (``GET ?$filter=... armRegionName eq 'R' ...``) on loopback, in
    its own item shape, one page, for the VM sizes and prices given:
    ``{(size, region): (on_demand_usd, spot_usd)}``. ``spotwise catalog refresh --cloud azure``
    reads it through ``SPOTWISE_AZURE_PRICES_ENDPOINT``."""

    def __init__(self, prices: dict[tuple[str, str], tuple[float, float]]) -> None:
        self.prices = dict(prices)
        self._server: LoopbackServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"{self._server.url}/api/retail/prices"

    def items(self, region: str) -> list[dict]:
        out = []
        for (size, r), (od, spot) in self.prices.items():
            if r != region:
                continue
            short = size.removeprefix("Standard_").replace("_", " ")
            for price, suffix in ((od, ""), (spot, " Spot")):
                out.append({"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
                            "armRegionName": r, "location": r, "effectiveStartDate": "2026-11-01T00:00:00Z",
                            "meterName": short + suffix, "skuName": short + suffix,
                            "productName": "Virtual Machines ND Series", "serviceName": "Virtual Machines",
                            "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": "Consumption",
                            "isPrimaryMeterRegion": True, "armSkuName": size})
        return out

    def start(self) -> "RetailPrices":
        self._server = LoopbackServer({"GET": self._handle_get}, name="azure-retail-prices").start()
        return self

    def _handle_get(self, ex: Exchange) -> None:
        flt = parse_qs(ex.url.query).get("$filter", [""])[0]
        m = re.search(r"armRegionName eq '([^']+)'", flt)
        ex.send_json(200, {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                           "Items": self.items(m.group(1)) if m else [], "NextPageLink": None})

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
