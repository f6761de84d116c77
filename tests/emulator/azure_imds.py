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
* ``POST /metadata/scheduledevents`` ``{"StartRequests": [{"EventId": ...}]}`` -> 200; the event is
  acknowledged and ``on_ack(vm, event_id)`` is called (the platform may proceed at once).
"""

from __future__ import annotations

import json
import threading
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlparse

INSTANCE = "/metadata/instance/"
EVENTS = "/metadata/scheduledevents"


class AzureImds:
    def __init__(self, on_ack: Callable[[str, str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._vms: dict[str, dict] = {}          # vm name -> {"ip": ..., "tags": {...}}
        self._events: dict[str, list[dict]] = {}
        self._incarnation = 1
        self.acks: list[tuple[str, str]] = []    # (vm, event id) acknowledged, in order
        self.rejected = 0                        # requests without the Metadata header
        self.on_ack = on_ack
        self._server: ThreadingHTTPServer | None = None

    def set_vm(self, name: str, *, private_ip: str, tags: dict[str, str], resource_id: str = "",
               identity: bool = False) -> None:
        """``identity``: the VM carries a managed identity, so ``/metadata/identity/oauth2/token``
        answers a token (else 400, as IMDS does for a VM without one)."""
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
        return f"http://127.0.0.1:{self._server.server_address[1]}/i/{name}"

    def start(self) -> "AzureImds":
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _send(self, code: int, body, text: bool = False) -> None:
                data = (body if text else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _parse(self):
                u = urlparse(self.path)
                parts = u.path.split("/", 3)
                if len(parts) < 4 or parts[1] != "i":
                    return None
                return parts[2], "/" + parts[3], parse_qs(u.query)

            def do_GET(self) -> None:
                got = self._parse()
                if got is None:
                    return self._send(404, {"error": "Not found"})
                name, path, q = got
                if self.headers.get("Metadata") != "true":
                    with imds._lock:
                        imds.rejected += 1
                    return self._send(400, {"error": "Bad request. Required metadata header not specified"})
                with imds._lock:
                    vm = imds._vms.get(name)
                    events = [dict(e) for e in imds._events.get(name, [])]
                    inc = imds._incarnation
                if vm is None:
                    return self._send(404, {"error": "Not found"})
                if path == EVENTS:
                    return self._send(200, {"DocumentIncarnation": inc, "Events": events})
                if path == "/metadata/identity/oauth2/token":
                    if not vm["identity"] or not q.get("resource"):
                        return self._send(400, {"error": "invalid_request", "error_description": "Identity not found"})
                    return self._send(200, {"access_token": f"emulated-{name}", "token_type": "Bearer",
                                            "resource": q["resource"][0], "expires_in": "3599"})
                if not path.startswith(INSTANCE):
                    return self._send(404, {"error": "Not found"})
                text = q.get("format", ["json"])[0] == "text"
                value = self._instance(path[len(INSTANCE):], name, vm)
                if value is None:
                    return self._send(404, {"error": "Not found"})
                if isinstance(value, str) and text:
                    return self._send(200, value, text=True)
                return self._send(200, value)

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

            def do_POST(self) -> None:
                got = self._parse()
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b"{}"
                if got is None or got[1] != EVENTS:
                    return self._send(404, {"error": "Not found"})
                if self.headers.get("Metadata") != "true":
                    return self._send(400, {"error": "Bad request. Required metadata header not specified"})
                name = got[0]
                try:
                    ids = [r["EventId"] for r in json.loads(raw).get("StartRequests", [])]
                except (ValueError, KeyError, TypeError, AttributeError):
                    return self._send(400, {"error": "Bad request"})
                with imds._lock:
                    known = {e["EventId"] for e in imds._events.get(name, [])}
                    acked = [i for i in ids if i in known]
                    for i in acked:
                        imds.acks.append((name, i))
                        for e in imds._events[name]:
                            if e["EventId"] == i:
                                e["EventStatus"] = "Started"
                for i in acked:
                    if imds.on_ack is not None:
                        imds.on_ack(name, i)
                self._send(200, {})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="azure-imds", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class RetailPrices:
    """The Azure Retail Prices API (``GET ?$filter=... armRegionName eq 'R' ...``) on loopback, in
    its own item shape, one page, for the VM sizes and prices given:
    ``{(size, region): (on_demand_usd, spot_usd)}``. ``spotwise catalog refresh --cloud azure``
    reads it through ``SPOTWISE_AZURE_PRICES_ENDPOINT``."""

    def __init__(self, prices: dict[tuple[str, str], tuple[float, float]]) -> None:
        self.prices = dict(prices)
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/retail/prices"

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
        import re

        prices = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                flt = parse_qs(urlparse(self.path).query).get("$filter", [""])[0]
                m = re.search(r"armRegionName eq '([^']+)'", flt)
                body = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                        "Items": prices.items(m.group(1)) if m else [], "NextPageLink": None}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="azure-retail-prices", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
