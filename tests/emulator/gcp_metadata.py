"""A loopback stand-in for GCP's metadata server, one root per emulated instance (test support).

Each instance is served under ``http://127.0.0.1:PORT/i/<name>``, so its boot script and its
interruption watcher use the real paths below that root, exactly as on a VM (where the root is
``http://metadata.google.internal``):

* ``computeMetadata/v1/instance/name``, ``.../id``, ``.../zone``, ``.../network-interfaces/0/ip``
* ``computeMetadata/v1/instance/attributes/<key>`` (the instance's metadata items, e.g.
  ``spotwise-head``, ``startup-script``)
* ``computeMetadata/v1/instance/preempted`` -> ``FALSE`` until :meth:`preempt`, then ``TRUE``

As on GCP: every request must carry ``Metadata-Flavor: Google`` (else 403), answers carry that
header and an ``ETag``, an unknown path is 404, and ``?wait_for_change=true`` holds the request
until the value differs from the one the client knows (``last_etag``, else the value at the time
of the request), or ``timeout_sec`` passes — then answers the current value.
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PREFIX = "/computeMetadata/v1/instance/"


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


class GcpMetadataServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._cond = threading.Condition()
        self._instances: dict[str, dict[str, str]] = {}     # name -> {path: value}
        self.requests: list[tuple[str, str]] = []           # (instance, path)
        self.refused = 0                                    # requests without Metadata-Flavor
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _send(self, code: int, body: str, etag: str | None = None) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                parts = url.path.split("/", 3)
                if len(parts) < 4 or parts[1] != "i" or not ("/" + parts[3]).startswith(PREFIX):
                    return self._send(404, "not found")
                name, path = parts[2], ("/" + parts[3])[len(PREFIX):]
                if self.headers.get("Metadata-Flavor") != "Google":
                    server.refused += 1
                    return self._send(403, "Missing required header: Metadata-Flavor")
                q = parse_qs(url.query)
                server.requests.append((name, path))
                value = server._get(name, path)
                if value is None:
                    return self._send(404, "not found")
                if (q.get("wait_for_change") or [""])[0].lower() == "true":
                    known = (q.get("last_etag") or [_etag(value)])[0]
                    timeout = float((q.get("timeout_sec") or ["300"])[0])
                    with server._cond:
                        server._cond.wait_for(lambda: _etag(server._get(name, path) or "") != known, timeout)
                    value = server._get(name, path)
                    if value is None:                       # the instance went away meanwhile
                        return self._send(404, "not found")
                self._send(200, value, _etag(value))

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True

    def _get(self, name: str, path: str) -> str | None:
        return self._instances.get(name, {}).get(path.rstrip("/"))

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "GcpMetadataServer":
        threading.Thread(target=self._server.serve_forever, name="gcp-metadata", daemon=True).start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._instances.clear()
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def base_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/i/{name}"

    # -- instances ---------------------------------------------------------------------------------
    def set_instance(self, name: str, *, instance_id: str, zone: str, ip: str, attributes: dict[str, str],
                     project: str = "proj") -> None:
        values = {"name": name, "id": instance_id, "zone": f"projects/{project}/zones/{zone}",
                  "network-interfaces/0/ip": ip, "preempted": "FALSE"}
        values.update({f"attributes/{k}": v for k, v in attributes.items()})
        with self._cond:
            self._instances[name] = values
            self._cond.notify_all()

    def preempt(self, name: str) -> None:
        """GCP's notice: ``instance/preempted`` turns ``TRUE`` (waiters are answered at once)."""
        with self._cond:
            self._instances[name]["preempted"] = "TRUE"
            self._cond.notify_all()

    def remove(self, name: str) -> None:
        with self._cond:
            self._instances.pop(name, None)
            self._cond.notify_all()
