"""An authenticating front for the loopback GCS (test support): as strict about *who* asks as GCS.

``gcp-storage-emulator`` (:mod:`emulator.gcs_server`) accepts any request, with or without
credentials; GCS refuses a request without a valid OAuth token (401) and one whose token lacks a
storage scope (403). The emulated GCP's nodes and its launcher reach storage only through this
front, so a node without a service account, or whose service account has no storage scope, cannot
read or write its checkpoints, and no key is handed to any node:

* a **node** presents the token its metadata server issued it (:mod:`emulator.gcp_metadata`,
  fetched by google.auth's GCE credentials or by the boot script): valid only if that server
  issued it, to an instance whose scopes include ``devstorage.read_write``, ``full_control`` or
  ``cloud-platform`` (``devstorage.read_only``: reads only);
* the **launcher** (the test process, or ``spotwise launch`` under it) uses a service-account key
  file (``GOOGLE_APPLICATION_CREDENTIALS``, :meth:`GcsAuthFront.launcher_credentials_file`), as a
  user's ADC would be: google.auth signs a JWT with the key and trades it at this front's
  ``/token`` (the file's ``token_uri``); the front checks the JWT's signature and audience before
  issuing a token.

Everything else is forwarded byte for byte to the emulator; a resumable upload's ``Location`` is
rewritten to point back at the front, so no request reaches the emulator unchecked.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urlparse

from httpfake import Exchange, LoopbackServer

STORAGE_SCOPES = frozenset({"https://www.googleapis.com/auth/devstorage.read_write",
                            "https://www.googleapis.com/auth/devstorage.full_control",
                            "https://www.googleapis.com/auth/cloud-platform"})
READ_SCOPES = STORAGE_SCOPES | {"https://www.googleapis.com/auth/devstorage.read_only"}
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"   # the audience google.auth signs for, as Google expects
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


class GcsAuthFront:
    """Serves ``http://127.0.0.1:PORT``: ``/token`` for the launcher's key, the rest of GCS's JSON
    API forwarded to ``upstream`` once the bearer token passes. ``node_scopes(token)``: the scopes
    of the instance a token was issued to (None: not a node token), e.g. the metadata server's
    :meth:`~emulator.gcp_metadata.GcpMetadataServer.token_scopes`."""

    def __init__(self, upstream: str, node_scopes: Callable[[str], tuple[str, ...] | None]) -> None:
        self.upstream = urlparse(upstream)
        self._node_scopes = node_scopes
        self._lock = threading.Lock()
        self._launcher_tokens: set[str] = set()
        self._seq = itertools.count(1)
        self._key_pem: bytes | None = None
        self.refused: list[tuple[int, str, str]] = []      # (status, method, path) of each refusal
        self.allowed: list[tuple[str, str, str]] = []      # (who, method, path) of each forwarded request
        methods = ("GET", "PUT", "POST", "DELETE", "HEAD", "PATCH")
        self._server = LoopbackServer({m: self._handle for m in methods}, name="gcs-auth", http11=True,
                                      quiet_errors=True)

    @property
    def endpoint(self) -> str:
        return self._server.url

    def start(self) -> "GcsAuthFront":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    # -- the launcher's identity ------------------------------------------------------------------
    def launcher_credentials_file(self, path: Path, email: str = "launcher@spotwise-emu.iam.gserviceaccount.com") -> Path:
        """Write a service-account key file whose ``token_uri`` is this front (what
        ``GOOGLE_APPLICATION_CREDENTIALS`` names); its public key is the one ``/token`` checks."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        self._key_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)
        path.write_text(json.dumps({
            "type": "service_account", "project_id": "spotwise-emu", "private_key_id": "emu-launcher",
            "private_key": pem.decode(), "client_email": email, "client_id": "1",
            "token_uri": f"{self.endpoint}/token"}))
        path.chmod(0o600)
        return path

    def _token(self, ex: Exchange) -> None:
        from google.auth import exceptions, jwt

        form = {k: v[0] for k, v in parse_qs(ex.read_body().decode()).items()}
        if form.get("grant_type") != JWT_BEARER or self._key_pem is None:
            return ex.send_json(400, {"error": "unsupported_grant_type"})
        try:
            jwt.decode(form.get("assertion", ""), certs=self._key_pem, audience=[GOOGLE_TOKEN_URI, f"{self.endpoint}/token"])
        except (ValueError, exceptions.GoogleAuthError):
            return ex.send_json(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        token = f"launcher-{next(self._seq)}"
        with self._lock:
            self._launcher_tokens.add(token)
        ex.send_json(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    # -- every other request ----------------------------------------------------------------------
    def _who(self, ex: Exchange) -> tuple[int, str]:
        """(0, who) for a request this front lets through, else (status, why)."""
        auth = ex.headers.get("Authorization") or ""
        if not auth.startswith("Bearer "):
            return 401, "Anonymous caller does not have storage.objects access."
        token = auth[len("Bearer "):]
        with self._lock:
            if token in self._launcher_tokens:
                return 0, "launcher"
        scopes = self._node_scopes(token)
        if scopes is None:
            return 401, "Invalid Credentials"
        allowed = READ_SCOPES if ex.command in ("GET", "HEAD") else STORAGE_SCOPES
        if not set(scopes) & allowed:
            return 403, "Provided scope(s) are not authorized"
        return 0, f"node:{token}"

    def _handle(self, ex: Exchange) -> None:
        if ex.command == "POST" and ex.url.path == "/token":
            return self._token(ex)
        status, who = self._who(ex)
        if status:
            ex.read_body()
            self.refused.append((status, ex.command, ex.url.path))
            return ex.send_json(status, {"error": {"code": status, "message": who, "errors": [
                {"message": who, "domain": "global", "reason": "required" if status == 401 else "insufficientPermissions"}]}})
        self.allowed.append((who, ex.command, ex.url.path))
        body = ex.read_body()
        headers = {k: v for k, v in ex.headers.items() if k.lower() not in _HOP | {"host", "authorization"}}
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            conn.request(ex.command, ex.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP | {"content-type"}}
            if "Location" in out:
                out["Location"] = out["Location"].replace(f"{self.upstream.scheme}://{self.upstream.netloc}",
                                                          self.endpoint)
            ex.send(resp.status, data if ex.command != "HEAD" else b"",
                    resp.getheader("Content-Type") or "application/octet-stream", out)
        finally:
            conn.close()

    def __enter__(self) -> "GcsAuthFront":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
