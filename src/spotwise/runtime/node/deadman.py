"""Dead man's switch of a node: end this node when its runner stops renewing the run's lease.

The runner (``spotwise launch`` or the service's job runner) pushes the lease to the head's control
endpoint every few seconds (``POST /v1/lease``); the head's job driver stores it in Ray's internal
KV (:data:`KV_KEY`). Every node's watcher (:mod:`spotwise.runtime.node.watch`) reads it from the GCS and
ends its node when

* the lease's ``expires_at`` has passed (the runner stopped renewing, or the budget runs out at the
  cluster's burn rate: the runner never pushes a time past that), or
* the GCS has not answered for ``unreachable_s`` since it last did (the head is gone, or this node
  is cut off: nobody can renew the lease any more).

Before the first lease reaches the KV (the head is booting, the driver is not up yet) the node
holds its *boot lease*: ``--lease-deadline``, :data:`BOOT_LEASE_S` after its watcher started. The
unreachability clock starts at the first answer from the head's GCS, not at the watcher's start: a
cloud boots every node of a launch at once, and a worker whose boot is quicker than its head's must
wait for it (the boot lease bounds that wait), not count the head's boot as the head being gone.

Why in the node and not only in the runner: a SIGKILLed runner ends nothing, and a cloud keeps
billing. The node is the one party that is always there to stop its own bill.

How a node ends itself (``--self-end``): ``shutdown`` runs ``shutdown -h now`` (with ``sudo -n``
when not root) — on a cloud the instance's shutdown behaviour must be *terminate*/*delete* for that
to stop the bill; ``azure`` deletes this VM through Azure Resource Manager with the VM's managed
identity (a token from IMDS, the VM's resource id from IMDS, ``DELETE`` on it) — a guest shutdown
on Azure leaves the VM allocated and billing — and falls back to ``shutdown`` when that fails (no
identity attached, no permission); ``gcp`` likewise deletes this instance through the Compute API
with its service account (a guest shutdown leaves a GCP VM ``TERMINATED`` with its disk billed); ``local`` (the local cloud) SIGKILLs every process carrying this process's
``SPOTWISE_LOCAL_INSTANCE`` marker, i.e. the whole local node, itself last; ``slurm`` runs
``scancel $SLURM_JOB_ID``: its whole job, the unit Slurm bills and the team's price applies to.

The switch's state is plain data (:class:`Switch`) so its rule is unit-tested without a cluster.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("spotwise.deadman")

KV_KEY = b"spotwise-lease"
KV_NAMESPACE = b"spotwise"
BOOT_LEASE_S = 300.0        # a node that never hears a lease ends itself this long after its watcher starts
UNREACHABLE_S = 60.0        # ... or this long after the GCS last answered
READ_INTERVAL_S = 1.0       # how often the watcher reads the lease
MARKER_ENV = "SPOTWISE_LOCAL_INSTANCE"


def encode_lease(expires_at: float) -> bytes:
    if not math.isfinite(expires_at):
        raise ValueError(f"expires_at must be a finite epoch time, got {expires_at!r}")
    return json.dumps({"expires_at": float(expires_at), "pushed_at": time.time()}).encode()


def decode_lease(raw: bytes | None) -> float | None:
    """``expires_at`` of a stored lease, or None when none (or an unreadable one) is stored."""
    if not raw:
        return None
    try:
        v = float(json.loads(raw)["expires_at"])
    except (ValueError, KeyError, TypeError):
        return None
    return v if math.isfinite(v) else None


@dataclass
class Switch:
    """When this node must end itself.

    ``deadline``: the boot lease, then whatever lease the runner last pushed (it may move earlier:
    the budget tightened). ``last_contact``: when the GCS last answered; None until it first does,
    and until then only the boot lease can end the node (a head that never comes up is caught by
    the boot lease, a head that goes away by ``unreachable_s``).
    """

    deadline: float
    last_contact: float | None = None
    unreachable_s: float = UNREACHABLE_S
    leased: bool = False          # a lease from the runner has been read (not only the boot lease)

    def heard(self, expires_at: float | None, now: float) -> None:
        """The GCS answered; ``expires_at`` is the stored lease (None: nothing pushed yet)."""
        self.last_contact = now
        if expires_at is not None:
            self.deadline, self.leased = expires_at, True

    def expired(self, now: float) -> str | None:
        """Why the node must end now, or None."""
        if now >= self.deadline:
            what = "the runner's lease" if self.leased else "the boot lease (no lease from the runner yet)"
            return f"{what} expired at {self.deadline:.3f} (now {now:.3f})"
        if self.last_contact is not None and now - self.last_contact >= self.unreachable_s:
            return f"the head's GCS has not answered for {now - self.last_contact:.0f} s (bound {self.unreachable_s:.0f} s)"
        return None


class LeaseReader:
    """Reads the lease from the GCS in a thread of its own: a GCS that is gone makes each call
    block for seconds (creating a client blocks for ~40 s), and the switch must still fire on time."""

    def __init__(self, gcs_address: str, switch: Switch, interval_s: float = READ_INTERVAL_S) -> None:
        self.gcs_address, self.switch, self.interval_s = gcs_address, switch, interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client: Any = None      # ray._raylet.GcsClient, made on the first read
        self._t = threading.Thread(target=self._loop, name="lease-reader", daemon=True)

    def start(self) -> "LeaseReader":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def expired(self, now: float | None = None) -> str | None:
        with self._lock:
            return self.switch.expired(time.time() if now is None else now)

    def read_once(self) -> None:
        import ray._raylet

        try:
            if self._client is None:
                # compiled (Cython) module whose bundled stub declares nothing
                self._client = ray._raylet.GcsClient(address=self.gcs_address)  # type: ignore[attr-defined]
            raw = self._client.internal_kv_get(KV_KEY, KV_NAMESPACE, timeout=5)
        except Exception as e:  # noqa: BLE001 - unreachable: the switch's clock keeps running
            log.debug("lease read failed: %s", e)
            return
        with self._lock:
            self.switch.heard(decode_lease(raw), time.time())

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.read_once()
            self._stop.wait(self.interval_s)


AZURE_ARM_URL = "https://management.azure.com"
AZURE_IMDS_URL = "http://169.254.169.254"
AZURE_VM_API = "2024-07-01"


def azure_delete_self(metadata_url: str | None = None, arm_url: str | None = None) -> str:
    """Delete this Azure VM through ARM with its managed identity; returns the VM's resource id.

    ``arm_url``: ``SPOTWISE_AZURE_ARM_URL`` else the public ARM endpoint (tests: the local fake).
    Raises ``OSError`` when IMDS or ARM refuses (no identity, no permission)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    md = (metadata_url or AZURE_IMDS_URL).rstrip("/")
    arm = (arm_url or os.environ.get("SPOTWISE_AZURE_ARM_URL") or AZURE_ARM_URL).rstrip("/")

    def imds(path: str) -> bytes:
        req = urllib.request.Request(f"{md}{path}", headers={"Metadata": "true"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.read()

    try:
        resource = urllib.parse.quote(arm + "/", safe="")
        token = json.loads(imds(f"/metadata/identity/oauth2/token?api-version=2018-02-01&resource={resource}"))
        vm_id = imds("/metadata/instance/compute/resourceId?api-version=2021-02-01&format=text").decode().strip()
        req = urllib.request.Request(f"{arm}{vm_id}?api-version={AZURE_VM_API}&forceDeletion=true", method="DELETE",
                                     headers={"Authorization": f"Bearer {token['access_token']}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            if r.status not in (200, 202, 204):
                raise OSError(f"ARM answered {r.status} to deleting {vm_id}")
    except (urllib.error.URLError, KeyError, ValueError) as e:
        raise OSError(f"could not delete this VM through ARM: {e}") from e
    return vm_id


GCP_COMPUTE_URL = "https://compute.googleapis.com"
GCP_METADATA_URL = "http://metadata.google.internal"


def gcp_delete_self(metadata_url: str | None = None, compute_url: str | None = None) -> str:
    """Delete this GCP instance through the Compute API with its service account; returns
    ``project/zone/name``. A guest shutdown would leave the VM ``TERMINATED`` with its boot disk
    (and any address) still billed, so a node that ends itself deletes itself.

    The token, project, zone and name come from the metadata server; ``compute_url``:
    ``SPOTWISE_GCP_COMPUTE_URL`` else the public endpoint (tests: the local fake). Needs the
    ``compute`` scope and ``compute.instances.delete`` on the node's service account (infra/gcp).
    Raises ``OSError`` when the metadata server or the API refuses."""
    import urllib.error
    import urllib.request

    md = (metadata_url or GCP_METADATA_URL).rstrip("/") + "/computeMetadata/v1/"
    api = (compute_url or os.environ.get("SPOTWISE_GCP_COMPUTE_URL") or GCP_COMPUTE_URL).rstrip("/")

    def meta(path: str) -> str:
        req = urllib.request.Request(md + path, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.read().decode().strip()

    try:
        token = json.loads(meta("instance/service-accounts/default/token"))["access_token"]
        project, zone, name = meta("project/project-id"), meta("instance/zone").rsplit("/", 1)[-1], meta("instance/name")
        req = urllib.request.Request(f"{api}/compute/v1/projects/{project}/zones/{zone}/instances/{name}",
                                     method="DELETE", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            if r.status not in (200, 202, 204):
                raise OSError(f"the Compute API answered {r.status} to deleting {name}")
    except (urllib.error.URLError, KeyError, ValueError) as e:
        raise OSError(f"could not delete this instance through the Compute API: {e}") from e
    return f"{project}/{zone}/{name}"


def end_self(mode: str, reason: str, *, metadata_url: str | None = None) -> None:
    """End this node (see the module doc). Returns only if ending failed (logged)."""
    log.error("dead man's switch: ending this node: %s", reason)
    if mode in ("azure", "gcp"):
        try:
            what = azure_delete_self(metadata_url) if mode == "azure" else gcp_delete_self(metadata_url)
            log.error("dead man's switch: asked the cloud to delete %s", what)
            return
        except OSError as e:
            log.error("%s; shutting down instead (the instance stays, billed, until gc)", e)
            mode = "shutdown"
    if mode == "shutdown":
        cmd = ["shutdown", "-h", "now"] if os.geteuid() == 0 else ["sudo", "-n", "shutdown", "-h", "now"]
        try:
            subprocess.run(cmd, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            log.error("could not shut this node down (%s): %s", " ".join(cmd), e)
        return
    if mode == "local":
        marker = os.environ.get(MARKER_ENV)
        if not marker:
            log.error("--self-end local needs %s in the environment", MARKER_ENV)
            return
        kill_marked(MARKER_ENV, marker)
        os._exit(0)
    if mode == "slurm":
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            log.error("--self-end slurm needs SLURM_JOB_ID in the environment (run inside the job)")
            return
        try:      # the whole job: every node of it, billed by Slurm's clock, ends with it
            subprocess.run(["scancel", job], check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            log.error("could not scancel job %s: %s", job, e)
        return
    raise ValueError(f"--self-end: got {mode!r}; allowed: shutdown, azure, gcp, local, slurm")


def marked(marker: str, name: str = MARKER_ENV) -> list[int]:
    """Live processes whose environment carries ``NAME=marker`` (default ``SPOTWISE_LOCAL_INSTANCE``)."""
    want = f"{name}={marker}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if want in (d / "environ").read_bytes().split(b"\0"):
                out.append(int(d.name))
        except (OSError, IndexError):
            continue
    return out


def kill_marked(name: str, marker: str, timeout: float = 5.0) -> set[int]:
    """SIGKILL every other process whose environment carries ``NAME=marker``, again until none is
    left (:func:`spotwise.utils.procs.kill_until_gone`: Ray may fork between a scan and the kill).
    A local node's dead man's switch ends its node so; a Slurm node's ``SIGTERM`` trap
    (``python -m spotwise.runtime.node.deadman --kill-marked NAME=VALUE``) ends its Ray at once."""
    from spotwise.utils.procs import kill_until_gone

    me = os.getpid()
    return kill_until_gone(lambda: [p for p in marked(marker, name) if p != me], timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    """``python -m spotwise.runtime.node.deadman --kill-marked NAME=VALUE``: :func:`kill_marked`."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--kill-marked" or "=" not in args[1] or args[1].startswith("="):
        print("usage: python -m spotwise.runtime.node.deadman --kill-marked NAME=VALUE", file=sys.stderr)
        return 2
    name, value = args[1].split("=", 1)
    kill_marked(name, value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
