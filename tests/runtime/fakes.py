"""Loopback fakes for the runtime tests: instance-metadata services (AWS IMDSv2, GCP, Azure
Scheduled Events), a moto S3 server subprocess, and a fault-injecting HTTP proxy."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from emulator.moto_server import MotoServer
from httpfake import Exchange, LoopbackServer
from spotwise.utils.net import free_port
from spotwise.utils.timefmt import iso_utc as iso

if TYPE_CHECKING:
    from .stores import ObjStore

__all__ = ["EnvPatch", "FakeMetadata", "FaultProxy", "MotoServer", "free_port", "iso"]


class FakeMetadata:
    """One server answering all three clouds' metadata protocols, per instance under /i/<id>."""

    def __init__(self) -> None:
        self.aws: dict[str, dict] = {}          # instance -> {"action", "time"}
        self.gcp_preempted: set[str] = set()
        self.azure_events: dict[str, list[dict]] = {}
        self.azure_acks: list[dict] = []
        self.tokens: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self._server = LoopbackServer({"PUT": self._put, "GET": self._get, "POST": self._post},
                                      name="fake-metadata").start()
        self.port = self._server.port

    @staticmethod
    def _split(ex: Exchange) -> tuple[str, str, str]:
        path, _, query = ex.path.partition("?")
        parts = path.split("/", 3)
        return parts[2], "/" + parts[3], query

    def _put(self, ex: Exchange) -> None:
        inst, path, _ = self._split(ex)
        self.calls.append(("PUT", path))
        if path != "/latest/api/token" or not ex.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return ex.send(400)
        tok = f"tok-{len(self.tokens)}"
        self.tokens.add(tok)
        ex.send(200, tok)

    def _get(self, ex: Exchange) -> None:
        inst, path, query = self._split(ex)
        self.calls.append(("GET", path))
        if path == "/latest/meta-data/spot/instance-action":
            if ex.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
                return ex.send(401)
            n = self.aws.get(inst)
            return ex.send(200, json.dumps(n), "application/json") if n else ex.send(404)
        if path == "/computeMetadata/v1/instance/preempted":
            if ex.headers.get("Metadata-Flavor") != "Google":
                return ex.send(403)
            if "wait_for_change=true" in query and inst not in self.gcp_preempted:
                time.sleep(0.3)   # a real server blocks until change or timeout_sec
            return ex.send(200, "TRUE" if inst in self.gcp_preempted else "FALSE")
        if path == "/metadata/scheduledevents":
            if ex.headers.get("Metadata") != "true":
                return ex.send(400)
            body = {"DocumentIncarnation": 1, "Events": self.azure_events.get(inst, [])}
            return ex.send(200, json.dumps(body), "application/json")
        ex.send(404)

    def _post(self, ex: Exchange) -> None:
        inst, path, _ = self._split(ex)
        n = int(ex.headers.get("Content-Length", 0))
        self.calls.append(("POST", path))
        if path == "/metadata/scheduledevents":
            self.azure_acks.append(json.loads(ex.rfile.read(n)))
            return ex.send(200)
        ex.send(404)

    def base(self, instance: str) -> str:
        return f"http://127.0.0.1:{self.port}/i/{instance}"

    def close(self) -> None:
        self._server.stop()


class EnvPatch:
    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.old = env, {}

    def __enter__(self):
        for k, v in self.env.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class FaultProxy:
    """A fault-injecting HTTP/1.1 proxy on loopback in front of ``upstream`` (e.g. moto_server).

    Requests are forwarded unchanged (bodies de-chunked; responses re-framed with Content-Length).
    Rules pick requests by method and path substring and inject, instead of (or around) the
    upstream call:

    * ``"500"``      — 500 InternalError, the request never reaches upstream;
    * ``"503"``      — 503 SlowDown (S3's throttling answer);
    * ``"429"``      — 429 Too Many Requests (throttling, generic);
    * ``"reset"``    — the connection is reset (RST) after the request is read, nothing forwarded;
    * ``"reset_after"`` — forwarded to upstream (so the write happened), then the connection is
      reset before the client sees the answer (retries must be idempotent);
    * ``"slow"``     — forwarded after ``delay_s``.

    ``body``: a substring of the request body instead of the path (a GCS upload names its object
    in its JSON metadata part, not in the URL).
    ``times``: how many matching requests get the fault (None: all); ``every``: only every n-th
    matching request. ``injected`` counts what was done, by fault.
    """

    def __init__(self, upstream: str) -> None:
        from urllib.parse import urlparse

        u = urlparse(upstream)
        self.upstream = (u.hostname, u.port)
        self.rules: list[dict] = []
        self.injected: dict[str, int] = {}
        self.forwarded = 0
        self._lock = threading.Lock()
        methods = ("GET", "PUT", "POST", "DELETE", "HEAD")
        self._server = LoopbackServer({m: self._handle for m in methods}, name="fault-proxy", http11=True).start()
        self.endpoint = self._server.url

    @staticmethod
    def _body(ex: Exchange) -> bytes:
        if ex.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(ex.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while ex.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += ex.rfile.read(size)
                ex.rfile.readline()
        return ex.rfile.read(int(ex.headers.get("Content-Length", 0) or 0))

    @staticmethod
    def _reset(ex: Exchange) -> None:
        import struct

        ex.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ex.close_connection = True
        ex.connection.close()

    @staticmethod
    def _error(ex: Exchange, status: int, code: str) -> None:
        body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                f"<Message>injected by FaultProxy</Message></Error>")
        ex.send(status, body, "application/xml")

    def _handle(self, ex: Exchange) -> None:
        body = self._body(ex)
        fault, delay = self._pick(ex.command, ex.path, body)
        if fault == "500":
            return self._error(ex, 500, "InternalError")
        if fault == "503":
            return self._error(ex, 503, "SlowDown")
        if fault == "429":
            return self._error(ex, 429, "TooManyRequests")
        if fault == "reset":
            return self._reset(ex)
        if fault == "slow":
            time.sleep(delay)
        headers = {k: v for k, v in ex.headers.items()
                   if k.lower() not in ("transfer-encoding", "connection", "content-length")}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(ex.command, ex.path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            status, rheaders = r.status, r.getheaders()
        finally:
            conn.close()
        with self._lock:
            self.forwarded += 1
        if fault == "reset_after":
            return self._reset(ex)
        ex.send_response(status)
        for k, v in rheaders:
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                ex.send_header(k, v)
        ex.send_header("Content-Length", str(len(data)))
        ex.end_headers()
        if ex.command != "HEAD":
            ex.wfile.write(data)

    def add(self, fault: str, *, method: str | None = None, path: str | None = None, body: str | None = None,
            times: int | None = 1, every: int = 1, delay_s: float = 0.5) -> None:
        with self._lock:
            self.rules.append({"fault": fault, "method": method, "path": path, "body": body, "times": times,
                               "every": every, "seen": 0, "delay_s": delay_s})

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _pick(self, method: str, path: str, body: bytes = b"") -> tuple[str | None, float]:
        with self._lock:
            for r in self.rules:
                if r["method"] and r["method"] != method:
                    continue
                if r["path"] and r["path"] not in path:
                    continue
                if r["body"] and r["body"].encode() not in body:
                    continue
                if r["times"] is not None and r["times"] <= 0:
                    continue
                r["seen"] += 1
                if r["seen"] % r["every"]:
                    continue
                if r["times"] is not None:
                    r["times"] -= 1
                self.injected[r["fault"]] = self.injected.get(r["fault"], 0) + 1
                return r["fault"], r["delay_s"]
        return None, 0.0

    def env(self, moto: "MotoServer") -> dict[str, str]:
        return {**moto.env(), "AWS_ENDPOINT_URL": self.endpoint}

    def fault(self, store: "ObjStore", fault: str, *, op: str, key: str | None = None, **kw) -> None:
        """:meth:`add` a rule by operation instead of by wire detail, for any object store:
        ``op`` is ``upload``, ``download`` (object reads), ``list`` or ``read`` (any GET);
        ``key`` a substring of the object's key."""
        gs = store.scheme == "gs"
        method = {"upload": "POST" if gs else "PUT"}.get(op, "GET")
        rule: dict = {}
        if op == "list":
            rule["path"] = {"gs": "/o?", "az": "comp=list"}.get(store.scheme, "list-type")
        if key is not None:
            if op == "upload" and gs:
                rule["body"] = key
            else:
                rule["path"] = quote(key, safe="") if gs else key
        self.add(fault, method=method, **rule, **kw)

    def close(self) -> None:
        self._server.stop()
