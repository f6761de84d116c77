"""A wire-level fake of the Azure Resource Manager calls spotwise makes (VNets, NICs, VMs).

Serves on 127.0.0.1 for the real azure-mgmt-compute / azure-mgmt-network clients. Records every
request. Errors are queued per operation and shaped as ARM sends them: synchronous
``{"error": {"code": ...}}`` bodies (SkuNotAvailable, OperationNotAllowed, AuthorizationFailed,
429 TooManyRequests) or — for ``AllocationFailed`` — an accepted PUT whose
``Azure-AsyncOperation`` status later reports ``Failed``, as a real allocation failure does.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_RES = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/"
                  r"Microsoft\.(Compute|Network)/(virtualMachines|networkInterfaces|virtualNetworks)/([^/]+)$", re.I)
_LIST = re.compile(r"^/subscriptions/([^/]+)/providers/Microsoft\.(Compute|Network)/"
                   r"(virtualMachines|networkInterfaces)$", re.I)
_ASYNC = re.compile(r"^/fake-async/([^/]+)$")

SYNC_ERRORS = {
    "sku": (409, "SkuNotAvailable"),
    "quota": (409, "OperationNotAllowed"),
    "authz": (403, "AuthorizationFailed"),
    "token": (401, "InvalidAuthenticationToken"),
    "throttle": (429, "TooManyRequests"),
}
ASYNC_ERRORS = {"allocation": "AllocationFailed", "zonal": "ZonalAllocationFailed"}


class AzureFake:
    def __init__(self) -> None:
        self.resources: dict[str, dict] = {}       # lowercased kind/name -> body
        self.requests: list[dict] = []
        self.fail: dict[str, list[str]] = {"vm": [], "nic": []}
        self._async: dict[str, dict] = {}
        self._ids = itertools.count(1)
        self._ips = itertools.count(4)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def queue_error(self, what: str, kind: str, times: int = 1) -> None:
        self.fail[what].extend([kind] * times)

    def vms(self) -> list[dict]:
        return [r for k, r in self.resources.items() if k.startswith("virtualmachines/")]

    def nics(self) -> list[dict]:
        return [r for k, r in self.resources.items() if k.startswith("networkinterfaces/")]

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "AzureFake":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                path = urlparse(self.path).path
                with fake._lock:
                    fake.requests.append({"method": method, "path": path, "body": body,
                                          "auth": self.headers.get("Authorization")})
                    status, out, headers = fake._route(method, path, body)
                data = json.dumps(out).encode() if out is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._handle("GET")

            def do_PUT(self):
                self._handle("PUT")

            def do_DELETE(self):
                self._handle("DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @staticmethod
    def _err(status: int, code: str) -> tuple[int, dict, dict]:
        headers = {"Retry-After": "0"} if status == 429 else {}
        return status, {"error": {"code": code, "message": f"{code} (fake)"}}, headers

    def _route(self, method: str, path: str, body) -> tuple[int, dict | None, dict]:
        if m := _ASYNC.match(path):
            return 200, self._async.pop(m.group(1), {"status": "Succeeded"}), {}
        if m := _LIST.match(path):
            kind = m.group(3).lower()
            return 200, {"value": [r for k, r in self.resources.items() if k.startswith(kind + "/")]}, {}
        m = _RES.match(path)
        if not m:
            return 404, {"error": {"code": "NotFound", "message": f"no route {method} {path}"}}, {}
        sub, rg, _, kind, name = m.groups()
        key = f"{kind.lower()}/{name.lower()}"
        what = {"virtualmachines": "vm", "networkinterfaces": "nic"}.get(kind.lower())
        if method == "PUT":
            if what and self.fail[what]:
                k = self.fail[what].pop(0)
                if k in SYNC_ERRORS:
                    return self._err(*SYNC_ERRORS[k])
                op = f"op{next(self._ids)}"
                self._async[op] = {"status": "Failed", "error": {"code": ASYNC_ERRORS[k], "message": "fake"}}
                return 201, {**body, "name": name, "properties": {**body.get("properties", {}),
                                                                   "provisioningState": "Creating"}}, \
                    {"Azure-AsyncOperation": f"{self.endpoint}/fake-async/{op}"}
            res = json.loads(json.dumps(body))
            res.update({"id": path, "name": name, "type": f"Microsoft.x/{kind}"})
            props = res.setdefault("properties", {})
            props["provisioningState"] = "Succeeded"
            if kind.lower() == "virtualnetworks":
                for s in props.get("subnets", []):
                    s["id"] = f"{path}/subnets/{s['name']}"
            if kind.lower() == "networkinterfaces":
                for ipc in props.get("ipConfigurations", []):
                    ipc.setdefault("properties", {})["privateIPAddress"] = f"10.42.0.{next(self._ips)}"
            self.resources[key] = res
            return 200, res, {}
        if method == "GET":
            if key not in self.resources:
                return self._err(404, "ResourceNotFound")
            return 200, self.resources[key], {}
        if method == "DELETE":
            if key not in self.resources:
                return 204, None, {}
            res = self.resources.pop(key)
            if kind.lower() == "virtualmachines":  # delete_option=Delete on the NIC reference
                for ref in res.get("properties", {}).get("networkProfile", {}).get("networkInterfaces", []):
                    if ref.get("properties", {}).get("deleteOption") == "Delete":
                        self.resources.pop(f"networkinterfaces/{ref['id'].rsplit('/', 1)[-1].lower()}", None)
            return 200, None, {}
        return 405, {"error": {"code": "MethodNotAllowed", "message": method}}, {}
