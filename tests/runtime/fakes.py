"""Loopback fakes for the runtime tests: instance-metadata services (AWS IMDSv2, GCP, Azure
Scheduled Events), a moto S3 server subprocess, and a fault-injecting HTTP proxy."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeMetadata:
    """One server answering all three clouds' metadata protocols, per instance under /i/<id>."""

    def __init__(self) -> None:
        self.aws: dict[str, dict] = {}          # instance -> {"action", "time"}
        self.gcp_preempted: set[str] = set()
        self.azure_events: dict[str, list[dict]] = {}
        self.azure_acks: list[dict] = []
        self.tokens: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", ctype="text/plain"):
                body = body if isinstance(body, bytes) else body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _split(self):
                path, _, query = self.path.partition("?")
                parts = path.split("/", 3)
                return parts[2], "/" + parts[3], query

            def do_PUT(self):
                inst, path, _ = self._split()
                fake.calls.append(("PUT", path))
                if path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400)
                tok = f"tok-{len(fake.tokens)}"
                fake.tokens.add(tok)
                self._send(200, tok)

            def do_GET(self):
                inst, path, query = self._split()
                fake.calls.append(("GET", path))
                if path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                        return self._send(401)
                    n = fake.aws.get(inst)
                    return self._send(200, json.dumps(n), "application/json") if n else self._send(404)
                if path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403)
                    if "wait_for_change=true" in query and inst not in fake.gcp_preempted:
                        time.sleep(0.3)   # a real server blocks until change or timeout_sec
                    return self._send(200, "TRUE" if inst in fake.gcp_preempted else "FALSE")
                if path == "/metadata/scheduledevents":
                    if self.headers.get("Metadata") != "true":
                        return self._send(400)
                    body = {"DocumentIncarnation": 1, "Events": fake.azure_events.get(inst, [])}
                    return self._send(200, json.dumps(body), "application/json")
                self._send(404)

            def do_POST(self):
                inst, path, _ = self._split()
                n = int(self.headers.get("Content-Length", 0))
                fake.calls.append(("POST", path))
                if path == "/metadata/scheduledevents":
                    fake.azure_acks.append(json.loads(self.rfile.read(n)))
                    return self._send(200)
                self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self._t = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._t.start()

    def base(self, instance: str) -> str:
        return f"http://127.0.0.1:{self.port}/i/{instance}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MotoServer:
    """``moto_server`` on a free loopback port, as a subprocess other processes can reach."""

    def __init__(self) -> None:
        self.port = free_port()
        exe = Path(sys.executable).with_name("moto_server")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
        self.proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                break
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
        proxy = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

            def _reset(self) -> None:
                import struct

                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _error(self, status: int, code: str) -> None:
                body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                        f"<Message>injected by FaultProxy</Message></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                body = self._body()
                fault, delay = proxy._pick(self.command, self.path)
                if fault == "500":
                    return self._error(500, "InternalError")
                if fault == "503":
                    return self._error(503, "SlowDown")
                if fault == "429":
                    return self._error(429, "TooManyRequests")
                if fault == "reset":
                    return self._reset()
                if fault == "slow":
                    time.sleep(delay)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("transfer-encoding", "connection", "content-length")}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    status, rheaders = r.status, r.getheaders()
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.forwarded += 1
                if fault == "reset_after":
                    return self._reset()
                self.send_response(status)
                for k, v in rheaders:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._t = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._t.start()

    def add(self, fault: str, *, method: str | None = None, path: str | None = None,
            times: int | None = 1, every: int = 1, delay_s: float = 0.5) -> None:
        with self._lock:
            self.rules.append({"fault": fault, "method": method, "path": path, "times": times,
                               "every": every, "seen": 0, "delay_s": delay_s})

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _pick(self, method: str, path: str) -> tuple[str | None, float]:
        with self._lock:
            for r in self.rules:
                if r["method"] and r["method"] != method:
                    continue
                if r["path"] and r["path"] not in path:
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

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
