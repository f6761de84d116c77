"""A loopback Azure Blob for tests: Azurite (Microsoft's own emulator, npm package ``azurite``, run
by Node) as a subprocess on a free port with its data in a temporary directory, and the one way to
start it.

Product code reaches it only through ``AZURE_STORAGE_CONNECTION_STRING`` (:meth:`Azurite.env`),
whose ``BlobEndpoint`` names the emulator, so ``az://devstoreaccount1/...`` storage runs the real
azure-storage-blob client over the wire with Azurite's well-known account key.

As strict as Azure where the checkpointer depends on it (tests/runtime/storage/test_azblob.py): every
request must carry a valid Shared Key signature or SAS (a SAS's signature, permissions and expiry
are checked), a missing blob is a 404, container names follow Azure's rules. Started with
``--skipApiVersionCheck`` only so an SDK newer than this Azurite is not refused; no ``--loose``.

With ``https=True`` it serves HTTPS with a self-signed certificate made here (:attr:`Azurite.ca`;
``REQUESTS_CA_BUNDLE`` in :meth:`Azurite.env` makes the SDK trust it) and ``--oauth basic``: it
then also takes OAuth bearer tokens (as Azure takes a managed identity's), which Azurite accepts
only over HTTPS, checking their issuer, audience and lifetime but not their signature.

Installed by ``scripts/install.sh --test`` into ``.venv/tools/azurite``; :func:`azurite_bin` is None
where it is not (the tests then skip and say why).
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from spotwise.utils.net import free_port

ACCOUNT = "devstoreaccount1"
#: Azurite's documented, public development key (not a secret: every Azurite has it)
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_bin() -> str | None:
    """``azurite-blob`` from ``.venv/tools/azurite`` (where scripts/install.sh puts it), else PATH."""
    local = Path(sys.executable).parent.parent / "tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists() and shutil.which("node"):
        return str(local)
    return shutil.which("azurite-blob")


def conn_str(blob_endpoint: str) -> str:
    """A connection string for Azurite's account at ``blob_endpoint`` (``http://host:port/devstoreaccount1``)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={blob_endpoint};")


class Azurite:
    """``azurite-blob`` on ``127.0.0.1:<free port>``, answering when the constructor returns.
    Raises RuntimeError when it is not installed or does not answer within ``timeout_s``."""

    def __init__(self, *, https: bool = False, log: Path | None = None, timeout_s: float = 60.0) -> None:
        exe = azurite_bin()
        if exe is None:
            raise RuntimeError("azurite is not installed (scripts/install.sh --test installs it)")
        self.port = free_port()
        self.endpoint = f"{'https' if https else 'http'}://127.0.0.1:{self.port}"
        self.blob_endpoint = f"{self.endpoint}/{ACCOUNT}"
        self._dir = tempfile.TemporaryDirectory(prefix="azurite-")
        self.ca: str | None = None
        cmd = [exe, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", self._dir.name,
               "--silent", "--skipApiVersionCheck"]
        if https:
            self.ca, key = _self_signed(Path(self._dir.name))
            cmd += ["--cert", self.ca, "--key", key, "--oauth", "basic"]
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        finally:
            if log is not None:
                out.close()   # type: ignore[union-attr]
        self._wait(timeout_s)

    def _wait(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.blob_endpoint}?comp=list", timeout=1, context=self.ssl_context())
                return
            except urllib.error.HTTPError:   # it answered (403: the probe is unsigned): it is up
                return
            except OSError:                  # refused or reset while it starts
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError(f"Azurite on port {self.port} did not start") from None
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        """What azure-storage-blob through spotwise (in this process or a child) needs to reach it
        (over HTTPS also the certificate to trust, through ``requests``' own variable)."""
        return {"AZURE_STORAGE_CONNECTION_STRING": conn_str(self.blob_endpoint),
                **({"REQUESTS_CA_BUNDLE": self.ca} if self.ca else {})}

    def ssl_context(self) -> ssl.SSLContext | None:
        """For a plain ``urllib`` client: trusts the emulator's certificate (None over HTTP)."""
        return ssl.create_default_context(cafile=self.ca) if self.ca else None

    def service(self):
        """A ``BlobServiceClient`` straight to the emulator, for a test's own setup and checks."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(conn_str(self.blob_endpoint),
                                                        connection_verify=self.ca or True)

    def create_container(self, name: str) -> str:
        """Create container ``name``; returns the name."""
        self.service().create_container(name)
        return name

    def close(self) -> None:
        # Azurite answers SIGTERM by waiting for its clients' keep-alive connections to close, which
        # cost 10 s (the whole wait below) at every teardown; it holds nothing worth a graceful stop
        self.proc.terminate()
        try:
            self.proc.wait(1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> "Azurite":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _self_signed(d: Path) -> tuple[str, str]:
    """A throwaway certificate for ``127.0.0.1`` (and its key) in ``d``: ``(cert path, key path)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return str(d / "cert.pem"), str(d / "key.pem")
