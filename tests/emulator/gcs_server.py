"""A loopback GCS for tests: the ``gcp-storage-emulator`` package (a Python stub of the GCS JSON
API) as a subprocess on a free port, and the one way to start it.

Product code reaches it only through ``STORAGE_EMULATOR_HOST`` (:meth:`GcsEmulator.env`), the
variable google-cloud-storage itself honours (anonymous credentials, no project needed), so
``gs://`` storage runs the real client library over the wire.

Checked against GCS where the checkpointer depends on it (tests/runtime/storage/test_gcs.py): a missing
object is a 404, listing by prefix, an overwrite without a generation precondition replaces the
object. Known gaps (kinder than GCS): it accepts any credentials or none (the emulated GCP puts
:mod:`emulator.gcs_auth` in front of it, which refuses what GCS would), and does not check a
signed URL's signature or expiry; bucket names are not validated (spotwise's own
:func:`~spotwise.runtime.storage.base.check_uri` refuses a bad name before launch).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from spotwise.utils.net import free_port


class GcsEmulator:
    """``gcp-storage-emulator`` on ``127.0.0.1:<free port>``, in memory, answering when the
    constructor returns. Raises RuntimeError when it does not answer within ``timeout_s``."""

    def __init__(self, *, log: Path | None = None, timeout_s: float = 30.0) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("gcp-storage-emulator")
        cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "gcp_storage_emulator"]) + [
            "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "--quiet"]
        if log is None:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                         env=dict(os.environ))
        else:
            with open(log, "ab") as out:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        self._wait(timeout_s)

    def _wait(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1)
                return
            except (OSError, http.client.HTTPException):   # refused, reset, half-answered while it starts
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError(f"GCS emulator on port {self.port} did not start") from None
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        """What google-cloud-storage (in this process or a child) needs to talk to it."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (JSON API ``buckets.insert``); returns the name."""
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test", method="POST",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10):
            return name

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "GcsEmulator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
