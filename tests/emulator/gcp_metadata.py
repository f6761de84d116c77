"""A loopback stand-in for GCP's metadata server, one root per emulated instance (test support).

Each instance is served under ``http://127.0.0.1:PORT/i/<name>``, so its boot script and its
interruption watcher use the real paths below that root, exactly as on a VM (where the root is
``http://metadata.google.internal``):

* ``computeMetadata/v1/instance/name``, ``.../id``, ``.../zone``, ``.../network-interfaces/0/ip``
* ``computeMetadata/v1/instance/attributes/<key>`` (the instance's metadata items, e.g.
  ``spotwise-head``, ``startup-script``)
* ``computeMetadata/v1/instance/preempted`` -> ``FALSE`` until :meth:`preempt`, then ``TRUE``
* ``computeMetadata/v1/instance/service-accounts/default/token`` and ``.../default/?recursive=true``,
  and the same under the account's email in place of ``default`` (email and scopes; JSON, as google.auth's GCE credentials read them; only for an instance with a
  service account) and ``computeMetadata/v1/project/project-id``
* the root itself (``GET /i/<name>``: 200 with ``Metadata-Flavor: Google``), which google.auth
  pings to decide it runs on GCE (a node points ``GCE_METADATA_HOST``/``GCE_METADATA_IP`` here)

Every token it serves is recorded with the instance's scopes (:meth:`token_scopes`), so another
fake (the Compute API, the GCS front of :mod:`emulator.gcs_auth`) accepts only a token this server
issued, for the scopes that instance's service account has.

As on GCP: every request must carry ``Metadata-Flavor: Google`` (else 403), answers carry that
header and an ``ETag``, an unknown path is 404, and ``?wait_for_change=true`` holds the request
until the value differs from the one the client knows (``last_etag``, else the value at the time
of the request), or ``timeout_sec`` passes — then answers the current value.
"""

from __future__ import annotations

import hashlib
import json
import threading
from urllib.parse import parse_qs

from httpfake import Exchange, LoopbackServer

ROOT = "/computeMetadata/v1/"
PREFIX = ROOT + "instance/"
#: scopes whose token may call the Compute API (a node deleting itself)
COMPUTE_SCOPES = ("https://www.googleapis.com/auth/compute", "https://www.googleapis.com/auth/cloud-platform")
#: values served as JSON (the rest are text, as on GCP)
JSON_SUFFIXES = ("service-accounts/default", "service-accounts/default/token", ".gserviceaccount.com",
                 ".gserviceaccount.com/token")


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


class GcpMetadataServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._cond = threading.Condition()
        self._instances: dict[str, dict[str, str]] = {}     # name -> {path: value}
        self.requests: list[tuple[str, str]] = []           # (instance, path)
        self.refused = 0                                    # requests without Metadata-Flavor
        self._tokens: dict[str, tuple[str, ...]] = {}       # every token served -> its instance's scopes
        self._server = LoopbackServer({"GET": self._handle_get}, host=host, name="gcp-metadata")

    @staticmethod
    def _send(ex: Exchange, code: int, body: str, etag: str | None = None, ctype: str = "application/text") -> None:
        headers = {"Metadata-Flavor": "Google", **({"ETag": etag} if etag else {})}
        ex.send(code, body, ctype, headers)

    def _handle_get(self, ex: Exchange) -> None:
        url = ex.url
        parts = url.path.split("/", 3)
        if len(parts) in (3, 4) and parts[1] == "i" and (len(parts) == 3 or parts[3] == "") \
                and parts[2] in self._instances:        # the root: google.auth's "am I on GCE?" ping
            return self._send(ex, 200, "computeMetadata/\n")
        if len(parts) < 4 or parts[1] != "i" or not ("/" + parts[3]).startswith((PREFIX, ROOT + "project/")):
            return self._send(ex, 404, "not found")
        rel = ("/" + parts[3])[len(ROOT):]
        name, path = parts[2], (rel[len("instance/"):] if rel.startswith("instance/") else "@" + rel)
        if ex.headers.get("Metadata-Flavor") != "Google":
            self.refused += 1
            return self._send(ex, 403, "Missing required header: Metadata-Flavor")
        q = parse_qs(url.query)
        self.requests.append((name, path))
        value = self._get(name, path)
        if value is None:
            return self._send(ex, 404, "not found")
        if (q.get("wait_for_change") or [""])[0].lower() == "true":
            known = (q.get("last_etag") or [_etag(value)])[0]
            timeout = float((q.get("timeout_sec") or ["300"])[0])
            with self._cond:
                self._cond.wait_for(lambda: _etag(self._get(name, path) or "") != known, timeout)
            value = self._get(name, path)
            if value is None:                       # the instance went away meanwhile
                return self._send(ex, 404, "not found")
        ctype = "application/json" if path.rstrip("/").endswith(JSON_SUFFIXES) else "application/text"
        self._send(ex, 200, value, _etag(value), ctype)

    def _get(self, name: str, path: str) -> str | None:
        values = self._instances.get(name, {})
        path = path.rstrip("/")
        email = values.get("service-accounts/default/email")
        if email and path.startswith(f"service-accounts/{email}"):
            # GCP serves each account under its email as well as under ``default`` (google.auth
            # asks by email once it has learnt it, e.g. on a second refresh)
            path = "service-accounts/default" + path[len(f"service-accounts/{email}"):]
        return values.get(path)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "GcpMetadataServer":
        self._server.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._instances.clear()
            self._cond.notify_all()
        self._server.stop()

    def base_url(self, name: str) -> str:
        return f"{self._server.url}/i/{name}"

    # -- instances ---------------------------------------------------------------------------------
    def set_instance(self, name: str, *, instance_id: str, zone: str, ip: str, attributes: dict[str, str],
                     project: str = "proj", scopes: tuple[str, ...] | list[str] = ()) -> None:
        """Serve one instance. ``scopes``: its service account's; a token is served only to an
        instance that has one (as on GCP), and names the instance so a fake API can tell whose."""
        values = {"name": name, "id": instance_id, "zone": f"projects/{project}/zones/{zone}",
                  "network-interfaces/0/ip": ip, "preempted": "FALSE", "@project/project-id": project}
        if scopes:
            token = f"emu-{name}-{'compute' if set(scopes) & set(COMPUTE_SCOPES) else 'storage'}"
            email = f"node@{project}.iam.gserviceaccount.com"
            values["service-accounts/default/scopes"] = "\n".join(scopes)
            values["service-accounts/default/email"] = email
            values["service-accounts/default"] = json.dumps(
                {"aliases": ["default"], "email": email, "scopes": list(scopes)})
            values["service-accounts/default/token"] = json.dumps(
                {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})
            with self._cond:
                self._tokens[token] = tuple(scopes)
        values.update({f"attributes/{k}": v for k, v in attributes.items()})
        with self._cond:
            self._instances[name] = values
            self._cond.notify_all()

    def token_scopes(self, token: str) -> tuple[str, ...] | None:
        """The scopes of the instance this server issued ``token`` to; None: not one of its tokens."""
        with self._cond:
            return self._tokens.get(token)

    def preempt(self, name: str) -> None:
        """GCP's notice: ``instance/preempted`` turns ``TRUE`` (waiters are answered at once)."""
        with self._cond:
            self._instances[name]["preempted"] = "TRUE"
            self._cond.notify_all()

    def remove(self, name: str) -> None:
        with self._cond:
            self._instances.pop(name, None)
            self._cond.notify_all()
