"""A loopback metadata server that speaks AWS IMDSv2 for every local "instance".

Real spot instances learn of their end from the cloud's metadata service; the local cloud serves
the same protocol on 127.0.0.1 so that the very same watcher code runs locally, in tests and on
EC2. Each instance has its own root, ``http://127.0.0.1:PORT/i/<instance_id>``, under which:

* ``PUT  /latest/api/token`` (header ``X-aws-ec2-metadata-token-ttl-seconds``) -> a session token
* ``GET  /latest/meta-data/spot/instance-action`` -> 404 until a notice is posted, then
  ``{"action": "terminate", "time": "<ISO-8601 UTC>"}`` (as EC2 does two minutes ahead)
* ``GET  /latest/meta-data/events/recommendations/rebalance`` -> 404 or ``{"noticeTime": ...}``
* ``GET  /latest/meta-data/instance-id`` -> the instance id
* ``GET  /latest/meta-data/local-ipv4`` -> the instance's private address (127.0.0.1 unless set)
* ``GET  /latest/meta-data/tags/instance/<key>`` -> an instance tag (``InstanceMetadataTags``)

GET without a valid token answers 401, like IMDSv2 with ``HttpTokens=required``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class MetadataServer:
    """Serves IMDSv2 for many instances; notices are posted with :meth:`post_notice`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._notices: dict[str, dict] = {}
        self._rebalance: dict[str, dict] = {}
        self._identity: dict[str, dict] = {}    # instance id -> {"local-ipv4": ..., "tags": {...}}
        self._tokens: set[str] = set()
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _send(self, code: int, body: str = "", ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> tuple[str, str] | None:
                parts = self.path.split("?", 1)[0].split("/", 3)
                if len(parts) < 4 or parts[1] != "i":
                    return None
                return parts[2], "/" + parts[3]

            def do_PUT(self) -> None:  # noqa: N802
                server.requests += 1
                r = self._route()
                if r is None or r[1] != "/latest/api/token":
                    return self._send(404, "not found")
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(400, "missing X-aws-ec2-metadata-token-ttl-seconds")
                tok = secrets.token_urlsafe(24)
                with server._lock:
                    server._tokens.add(tok)
                self._send(200, tok)

            def do_GET(self) -> None:  # noqa: N802
                server.requests += 1
                r = self._route()
                if r is None:
                    return self._send(404, "not found")
                instance_id, path = r
                if self.headers.get("X-aws-ec2-metadata-token") not in server._tokens:
                    return self._send(401, "unauthorized")
                with server._lock:
                    notice = server._notices.get(instance_id)
                    rebalance = server._rebalance.get(instance_id)
                if path == "/latest/meta-data/spot/instance-action":
                    if notice is None:
                        return self._send(404, "not found")
                    return self._send(200, json.dumps(notice), "application/json")
                if path == "/latest/meta-data/events/recommendations/rebalance":
                    if rebalance is None:
                        return self._send(404, "not found")
                    return self._send(200, json.dumps(rebalance), "application/json")
                if path == "/latest/meta-data/instance-id":
                    return self._send(200, instance_id)
                with server._lock:
                    ident = server._identity.get(instance_id, {})
                if path == "/latest/meta-data/local-ipv4":
                    return self._send(200, ident.get("local-ipv4", "127.0.0.1"))
                if path.startswith("/latest/meta-data/tags/instance/"):
                    value = ident.get("tags", {}).get(path.rsplit("/", 1)[1])
                    return self._send(200, value) if value is not None else self._send(404, "not found")
                return self._send(404, "not found")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                # A watcher killed mid-request (its node was just reclaimed) is expected here.
                pass

        self._httpd = Server((host, port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="imds", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def base_url(self, instance_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/i/{instance_id}"

    def start(self) -> "MetadataServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def post_notice(self, instance_id: str, *, action: str = "terminate", at: float | None = None) -> dict:
        """Announce that ``instance_id`` will be stopped/terminated at ``at`` (unix time)."""
        notice = {"action": action, "time": _iso(at if at is not None else time.time() + 120)}
        with self._lock:
            self._notices[instance_id] = notice
        return notice

    def set_instance(self, instance_id: str, *, local_ipv4: str, tags: dict[str, str] | None = None) -> None:
        """What ``local-ipv4`` and ``tags/instance/*`` answer for ``instance_id``."""
        with self._lock:
            self._identity[instance_id] = {"local-ipv4": local_ipv4, "tags": dict(tags or {})}

    def post_rebalance(self, instance_id: str) -> None:
        with self._lock:
            self._rebalance[instance_id] = {"noticeTime": _iso(time.time())}

    def clear(self, instance_id: str) -> None:
        with self._lock:
            self._notices.pop(instance_id, None)
            self._rebalance.pop(instance_id, None)

    def __enter__(self) -> "MetadataServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
