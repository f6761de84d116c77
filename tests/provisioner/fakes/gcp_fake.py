"""A wire-level fake of the Compute Engine v1 REST API (the instance calls spotwise makes).

Serves on 127.0.0.1 for the real ``google-cloud-compute`` client (``transport="rest"``). Records
every request; errors can be queued per operation, shaped the way Compute Engine sends them:
capacity and quota failures as a DONE operation carrying ``error.errors[].code``, throttling and
auth as HTTP errors with a JSON error body. Operations start RUNNING and become DONE on ``wait``
(or after one GET), so the client's polling is exercised.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

_INSTANCES = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?$")
_OPS = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+?)(/wait)?$")
_AGG = re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances$")

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


class GcpFake:
    def __init__(self) -> None:
        self.instances: dict[tuple[str, str, str], dict] = {}   # (project, zone, name) -> body
        self.operations: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.fail: dict[str, list[str]] = {"insert": [], "delete": [], "list": []}
        self._ids = itertools.count(1000)
        self._ips = itertools.count(2)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- control ---------------------------------------------------------------------------------
    def queue_error(self, op: str, kind: str, times: int = 1) -> None:
        self.fail[op].extend([kind] * times)

    def running(self) -> list[dict]:
        return [i for i in self.instances.values() if i["status"] != "TERMINATED"]

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "GcpFake":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else None
                url = urlparse(self.path)
                with fake._lock:
                    fake.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                          "body": body, "auth": self.headers.get("Authorization")})
                    status, out = fake._route(method, url.path, parse_qs(url.query), body)
                self._send(status, out)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

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

    # -- API -------------------------------------------------------------------------------------
    def _http_error(self, kind: str) -> tuple[int, dict]:
        status, reason, msg = HTTP_ERRORS[kind]
        return status, {"error": {"code": status, "message": msg,
                                  "errors": [{"message": msg, "domain": "global", "reason": reason}]}}

    def _op(self, project: str, zone: str, target: str, kind: str, error: str | None = None) -> dict:
        oid = next(self._ids)
        name = f"operation-{oid}"
        op = {"kind": "compute#operation", "id": str(oid), "name": name, "zone": zone, "operationType": kind,
              "targetLink": target, "status": "RUNNING", "progress": 0}
        if error:
            op["_pending_error"] = error
        self.operations[name] = op
        return op

    def _finish(self, name: str) -> dict:
        op = self.operations[name]
        op["status"] = "DONE"
        op["progress"] = 100
        err = op.pop("_pending_error", None)
        if err:
            op["error"] = {"errors": [{"code": err, "message": f"{err} (fake)"}]}
            op["httpErrorStatusCode"] = 403 if err == "QUOTA_EXCEEDED" else 503
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def _route(self, method: str, path: str, query: dict, body) -> tuple[int, dict]:
        if m := _OPS.match(path):
            name = m.group(3)
            if name not in self.operations:
                return 404, {"error": {"code": 404, "message": "no such operation", "errors": []}}
            if m.group(4) or self.operations[name]["status"] == "RUNNING" and method == "GET" \
                    and self.operations[name].get("_seen"):
                return 200, self._finish(name)
            self.operations[name]["_seen"] = True
            return 200, {k: v for k, v in self.operations[name].items() if not k.startswith("_")}
        if m := _AGG.match(path):
            if self.fail["list"]:
                return self._http_error(self.fail["list"].pop(0))
            flt = (query.get("filter") or [""])[0]
            items: dict[str, dict] = {}
            for (project, zone, _), inst in self.instances.items():
                if project == m.group(1) and _matches(inst, flt):
                    items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
            return 200, {"kind": "compute#instanceAggregatedList", "items": items}
        if m := _INSTANCES.match(path):
            project, zone, name = m.groups()
            if method == "POST" and name is None:
                if self.fail["insert"]:
                    kind = self.fail["insert"].pop(0)
                    if kind in HTTP_ERRORS:
                        return self._http_error(kind)
                    return 200, self._op(project, zone, f"zones/{zone}/instances/{body['name']}",
                                         "insert", OP_ERRORS[kind])
                key = (project, zone, body["name"])
                if key in self.instances:
                    return 409, {"error": {"code": 409, "message": "already exists",
                                           "errors": [{"reason": "alreadyExists"}]}}
                inst = dict(body)
                inst.update({"id": str(next(self._ids)), "status": "RUNNING", "zone": f"zones/{zone}",
                             "creationTimestamp": "2025-01-01T00:00:00.000-00:00"})
                for nic in inst.get("networkInterfaces", []):
                    nic["networkIP"] = f"10.128.0.{next(self._ips)}"
                self.instances[key] = inst
                return 200, self._op(project, zone, f"zones/{zone}/instances/{body['name']}", "insert")
            key = (project, zone, name)
            if method == "GET":
                if key not in self.instances:
                    return 404, {"error": {"code": 404, "message": "not found", "errors": [{"reason": "notFound"}]}}
                return 200, self.instances[key]
            if method == "DELETE":
                if self.fail["delete"]:
                    return self._http_error(self.fail["delete"].pop(0))
                if key not in self.instances:
                    return 404, {"error": {"code": 404, "message": "not found", "errors": [{"reason": "notFound"}]}}
                del self.instances[key]
                return 200, self._op(project, zone, f"zones/{zone}/instances/{name}", "delete")
        return 404, {"error": {"code": 404, "message": f"fake has no route {method} {path}", "errors": []}}


def _matches(inst: dict, flt: str) -> bool:
    """The two filter forms spotwise sends: ``labels.K = "V"`` and ``labels.K:*``."""
    if not flt:
        return True
    labels = inst.get("labels") or {}
    if m := re.fullmatch(r'labels\.([\w-]+)\s*=\s*"([^"]*)"', flt.strip()):
        return labels.get(m.group(1)) == m.group(2)
    if m := re.fullmatch(r"labels\.([\w-]+):\*", flt.strip()):
        return m.group(1) in labels
    raise ValueError(f"fake cannot parse filter {flt!r}")
