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
* ``GET  /latest/meta-data/iam/security-credentials/[ROLE]`` -> the instance profile's role and its
  temporary credentials (404 for an instance without a profile)

GET without a valid token answers 401, like IMDSv2 with ``HttpTokens=required``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spotwise.utils.timefmt import iso_utc

NOT_FOUND = (404, "not found", "text/plain")


class _Handler(BaseHTTPRequestHandler):
    """One IMDSv2 request: parses ``/i/<instance_id>/<path>`` and answers from the server's state."""

    server: "_HTTPServer"

    def log_message(self, *args: Any) -> None:  # keep test output clean
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
        self.server.metadata.requests += 1
        r = self._route()
        if r is None or r[1] != "/latest/api/token":
            return self._send(404, "not found")
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._send(400, "missing X-aws-ec2-metadata-token-ttl-seconds")
        self._send(200, self.server.metadata.issue_token())

    def do_GET(self) -> None:  # noqa: N802
        md = self.server.metadata
        md.requests += 1
        r = self._route()
        if r is None:
            return self._send(404, "not found")
        instance_id, path = r
        if not md.token_valid(self.headers.get("X-aws-ec2-metadata-token")):
            return self._send(401, "unauthorized")
        self._send(*md.answer(instance_id, path))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], metadata: "MetadataServer") -> None:
        self.metadata = metadata
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A watcher killed mid-request (its node was just reclaimed) is expected here.
        pass


class MetadataServer:
    """Serves IMDSv2 for many instances; notices are posted with :meth:`post_notice`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._notices: dict[str, dict] = {}
        self._rebalance: dict[str, dict] = {}
        self._identity: dict[str, dict] = {}    # instance id -> {"local-ipv4": ..., "tags": {...}}
        self._tokens: set[str] = set()
        self.requests = 0
        self._httpd = _HTTPServer((host, port), self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="imds", daemon=True)

    def issue_token(self) -> str:
        """A new session token (never expires here; the TTL header is only required)."""
        tok = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens.add(tok)
        return tok

    def token_valid(self, token: str | None) -> bool:
        with self._lock:
            return token in self._tokens

    def answer(self, instance_id: str, path: str) -> tuple[int, str, str]:
        """(status, body, content type) of an authorised GET of ``path`` for ``instance_id``."""
        with self._lock:
            notice = self._notices.get(instance_id)
            rebalance = self._rebalance.get(instance_id)
            ident = self._identity.get(instance_id, {})
        if path == "/latest/meta-data/spot/instance-action":
            return NOT_FOUND if notice is None else (200, json.dumps(notice), "application/json")
        if path == "/latest/meta-data/events/recommendations/rebalance":
            return NOT_FOUND if rebalance is None else (200, json.dumps(rebalance), "application/json")
        if path == "/latest/meta-data/instance-id":
            return 200, instance_id, "text/plain"
        if path == "/latest/meta-data/local-ipv4":
            return 200, ident.get("local-ipv4", "127.0.0.1"), "text/plain"
        creds_path = "/latest/meta-data/iam/security-credentials/"
        if path.startswith(creds_path) and ident.get("role"):
            if path == creds_path:
                return 200, ident["role"], "text/plain"
            if path == creds_path + ident["role"]:
                expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
                return 200, json.dumps({"Code": "Success", "Type": "AWS-HMAC", "Expiration": expires,
                                        **ident["credentials"]}), "application/json"
        if path.startswith("/latest/meta-data/tags/instance/"):
            value = ident.get("tags", {}).get(path.rsplit("/", 1)[1])
            return NOT_FOUND if value is None else (200, value, "text/plain")
        return NOT_FOUND

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

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
        notice = {"action": action, "time": iso_utc(at if at is not None else time.time() + 120)}
        with self._lock:
            self._notices[instance_id] = notice
        return notice

    def set_instance(self, instance_id: str, *, local_ipv4: str, tags: dict[str, str] | None = None,
                     role: str | None = None, credentials: dict[str, str] | None = None) -> None:
        """What ``local-ipv4`` and ``tags/instance/*`` answer for ``instance_id``; with ``role``
        (an instance profile's role) and its ``credentials`` (AccessKeyId, SecretAccessKey, Token),
        what ``iam/security-credentials/`` answers, where boto3 on the node finds them."""
        with self._lock:
            self._identity[instance_id] = {"local-ipv4": local_ipv4, "tags": dict(tags or {}),
                                           "role": role, "credentials": dict(credentials or {})}

    def post_rebalance(self, instance_id: str) -> None:
        with self._lock:
            self._rebalance[instance_id] = {"noticeTime": iso_utc(time.time())}

    def clear(self, instance_id: str) -> None:
        with self._lock:
            self._notices.pop(instance_id, None)
            self._rebalance.pop(instance_id, None)

    def __enter__(self) -> "MetadataServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
