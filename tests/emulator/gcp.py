"""An emulated GCP for end-to-end runs, offline (test and bench support, never product code).

The fake cloud decides what exists: the wire-level Compute Engine fake
(``tests/provisioner/fakes/gcp_fake.py``) on loopback, which the real ``google-cloud-compute``
client in the ``spotwise launch`` process talks to. The *instance emulator* turns each instance
the fake reports ``RUNNING`` (and labelled by spotwise) into a local node that executes **the
exact ``startup-script`` metadata item spotwise inserted**, with only environment overrides:

* ``SPOTWISE_STATE_DIR`` / ``SPOTWISE_ETC_DIR``: the node's own directories;
* ``SPOTWISE_VENV``: an empty venv path; the node's image is GCP's default DL image as it matters
  here (:mod:`emulator.images`: ``python3`` is 3.10, apt has empty package lists and first-boot
  locks), so the script installs a python3.11 (the stock image's Python: torch and Ray, no
  spotwise), then the wheel the launch shipped, as on the cloud;
* ``SPOTWISE_METADATA_URL``: the node's own GCP metadata root on loopback
  (:mod:`emulator.gcp_metadata`: name, id, ``network-interfaces/0/ip`` = the private address the
  fake assigned, the instance's attributes, ``preempted`` with ``wait_for_change``), requiring
  ``Metadata-Flavor: Google`` like the real one;
* ``SPOTWISE_GCP_NOTICE_S``: the emulated notice window, so the watcher's drain deadline is the
  one this cloud really keeps (GCP's is 30 s; tests shorten it);
* ``SPOTWISE_RAY_START_ARGS``: free ports for the per-node Ray agents and a small object store;
* ``GCE_METADATA_HOST`` / ``GCE_METADATA_IP``: the same root, where google.auth's GCE credentials
  find the node's service-account token (as on a VM), and ``SPOTWISE_GCS_ENDPOINT``: the loopback
  GCS behind its authenticating front (:mod:`emulator.gcs_auth`), which accepts only a token the
  metadata server issued to an instance whose scopes include storage. No storage key reaches any
  node: a node launched without a service account or a storage scope cannot read its wheel or
  write its checkpoints. The launcher gets its own identity (a service-account key file whose
  token endpoint is the front: :meth:`EmulatedGcp.env`), as a user has ADC.

The fake's subnetwork is a loopback range (``127.17.0.0/16``), so every instance's private address
is a real, distinct loopback address here: Ray on each node binds to it and workers join the head
at the address the provisioner read from the Compute API — no translation anywhere.

With ``head_path="ssh"`` a head's external address (an ephemeral one the fake gives from
``127.19.0.0/16``) runs a real sshd on port 22 (``tests/sshd.py``, as the test's user) whose
authorized keys are a file of the node's own (``SPOTWISE_AUTHORIZED_KEYS``), filled by the head's
startup-script; the launcher reaches the head through it (``SPOTWISE_HEAD_PATH=ssh``). Without
``netns`` the private addresses stay reachable from the launcher (loopback).

With ``netns=True`` each region's nodes run in a network namespace of their own
(:mod:`emulator.netns`), as a VPC's machines are out of a laptop's reach: the fake's subnetwork and
external ranges are the namespaces' block's (``198.18.0.0/15``), a node's private address lives on
its region's loopback only, a head's external address on its region's end of a veth link, where its
sshd listens, and the launcher's connections come from the links' root ends
(``SPOTWISE_LAUNCHER_CIDR``). A direct connection from the launcher to a private address fails (no
route); the metadata server, the GCS front and the Compute fake answer inside every region at the
same ``127.0.0.1`` URLs the nodes are handed. The nodes of one region share its namespace (Ray and
gloo between them as on one VPC).

Deleting an instance in the fake ends its node (every process carrying its marker variable). A
preemption is injected the GCP way: ``instance/preempted`` turns ``TRUE`` on the node's metadata
server, the fake records a ``compute.instances.preempted`` operation, and the guest shuts down at
once (the ACPI soft off: the instance's ``shutdown-script`` runs, then SIGTERM to every process of
the node: :meth:`EmulatedGcp.soft_off`); after the notice window the instance is ended as its
``instanceTerminationAction`` says (``DELETE`` for spotwise's Spot VMs), and its node processes
with it.
"""

from __future__ import annotations

import getpass
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from emulator.base import EmulatedCloud, orchestrator_ports
from emulator.gcp_metadata import GcpMetadataServer
from emulator.gcs_auth import GcsAuthFront
from emulator.gcs_server import GcsEmulator
from emulator.images import UBUNTU_2204_PY310
from emulator.netns import RegionNets

HERE = Path(__file__).resolve().parent
if str(HERE.parent / "provisioner") not in sys.path:      # the Compute fake lives with the provisioner tests
    sys.path.insert(0, str(HERE.parent / "provisioner"))
from fakes.gcp_fake import GcpFake  # noqa: E402

SUBNET = "127.17.0.0/16"
#: the external addresses GCE gives (an ephemeral one per access config): loopback too, but not the
#: private range, so a connection to one reaches only what listens there (a head's sshd)
EXTERNAL = "127.19.0.0/16"
#: credentials of the test process a node must not inherit: its identity is its service account only
NOT_ON_A_NODE = ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_PROFILE")
PROJECT = "spotwise-emu"
GCP_NOTICE_S = 30.0


class EmulatedGcp(EmulatedCloud):
    NODES_DIR = "instances"
    THREAD_NAME = "gcp-instance-emulator"
    IMAGE = UBUNTU_2204_PY310      # GCP's default DL image: Python 3.10, empty apt lists, first-boot locks

    def __init__(self, workdir: Path, *, region: str = "us-central1", bucket: str = "ckpt",
                 notice_s: float = GCP_NOTICE_S, head_path: str = "private", netns: bool = False) -> None:
        super().__init__(workdir, bucket=bucket)
        self.region = region
        self.notice_s = notice_s
        self.project = PROJECT
        self.shutdown_scripts: dict[str, int | None] = {}   # machine -> its shutdown-script's status
        self.sigtermed: list[str] = []                       # machines whose guest shutdown sent SIGTERM
        #: "ssh": a head's external address (from :data:`EXTERNAL`, loopback) runs a real sshd on
        #: port 22 whose authorized keys the head's boot script fills, and the launcher reaches the
        #: head through it (SPOTWISE_HEAD_PATH=ssh); "private": the launcher uses private addresses
        self.head_path = head_path
        #: a network namespace per region (:mod:`emulator.netns`), made at :meth:`start`
        self.netns = netns

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "EmulatedGcp":
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.netns:
            self.nets = RegionNets().start()
        ranges = (self.nets.private_range, self.nets.public_range) if self.nets else (SUBNET, EXTERNAL)
        self.fake = GcpFake(ip_range=ranges[0], external_range=ranges[1]).start()
        from spotwise.provisioner.sites import default_regions

        for region in default_regions("gcp"):      # infra/gcp: a router and Cloud NAT in each of var.regions
            self.fake.add_router(self.project, region)
        self.md = GcpMetadataServer().start()
        self.gcs = GcsEmulator(log=self.workdir / "gcs.log")
        self.gcs.create_bucket(self.bucket)
        self.front = GcsAuthFront(self.gcs.endpoint, self.md.token_scopes).start()
        self.launcher_key = self.front.launcher_credentials_file(self.workdir / "launcher-key.json")
        if self.nets:              # what a node calls: its metadata server, storage, the Compute API
            for url in (self.md.base_url("-"), self.front.endpoint, self.fake.endpoint):
                self.nets.forward(int(urllib.parse.urlsplit(url).port or 80))
        self._start_loop()
        return self

    def stop(self) -> None:
        self._stop_nodes()
        self.md.stop()
        self.fake.stop()
        self.front.stop()
        self.gcs.close()
        if self.nets:
            self.nets.stop()

    def objects(self, prefix: str = "") -> list[str]:
        """Every object name under ``prefix`` of the bucket, read straight from the emulator (the
        test's own view, past the front)."""
        import json
        import urllib.parse
        import urllib.request

        url = f"{self.gcs.endpoint}/storage/v1/b/{self.bucket}/o?prefix={urllib.parse.quote(prefix)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return [o["name"] for o in json.load(r).get("items", [])]

    # -- what the orchestrator's environment needs -----------------------------------------------
    def env(self) -> dict[str, str]:
        return {"SPOTWISE_GCP_ENDPOINT": self.fake.endpoint, "SPOTWISE_GCP_PROJECT": self.project,
                "SPOTWISE_GCP_ANONYMOUS": "1",       # the Compute fake; storage uses the key below
                "GOOGLE_APPLICATION_CREDENTIALS": str(self.launcher_key),
                "SPOTWISE_GCS_ENDPOINT": self.front.endpoint,
                "SPOTWISE_GCP_SERVICE_ACCOUNT": f"spotwise-node@{self.project}.iam.gserviceaccount.com",
                # private: the launcher reaches the emulated heads at their private addresses
                # (loopback here); ssh: through each head's own sshd at its external address, as
                # the test's user (the emulated head authorizes the key in its sshd's file)
                "SPOTWISE_HEAD_PATH": self.head_path,
                **({"SPOTWISE_HEAD_SSH_USER": getpass.getuser(),
                    "SPOTWISE_LAUNCHER_CIDR": self.nets.launcher_cidr if self.nets else "127.0.0.1/32"}
                   if self.head_path == "ssh" else {}),
                **orchestrator_ports()}

    def set_no_capacity(self, pairs: list[str]) -> None:
        """``["us-central1-a:SPOT", "*:SPOT", "us-central1-b"]``: inserts there answer
        ``ZONE_RESOURCE_POOL_EXHAUSTED`` (re-read on every insert; ``[]`` gives capacity back)."""
        self.fake.set_no_capacity(pairs)

    # -- the instance emulator ----------------------------------------------------------------
    def instances(self, statuses=("PROVISIONING", "STAGING", "RUNNING", "STOPPING", "TERMINATED")) -> list[dict]:
        with self.fake._lock:
            return [dict(i) for (p, _, _), i in self.fake.instances.items()
                    if p == self.project and "spotwise-cluster" in (i.get("labels") or {})
                    and i["status"] in statuses]

    def _live(self) -> dict[str, dict]:
        return {i["name"]: i for i in self.instances()}

    def _is_running(self, machine: dict) -> bool:
        return machine["status"] == "RUNNING"

    def _start_node(self, inst: dict) -> None:
        name = inst["name"]
        attrs = self.fake.metadata(inst)
        script = attrs["startup-script"].encode()
        zone = inst["zone"].rsplit("/", 1)[-1]
        scopes = [sc for sa in inst.get("serviceAccounts") or [] for sc in sa.get("scopes") or []]
        self.md.set_instance(name, instance_id=inst["id"], zone=zone, project=self.project,
                             ip=inst["networkInterfaces"][0]["networkIP"], attributes=attrs, scopes=scopes)
        md_host = self.md.base_url(name).split("://", 1)[1]
        nat = [ac.get("natIP") for ac in inst["networkInterfaces"][0].get("accessConfigs") or [] if ac.get("natIP")]
        # with netns: the node's addresses in its region's namespace, and the node in there
        wrap = self._in_region(name, zone.rsplit("-", 1)[0], inst["networkInterfaces"][0]["networkIP"],
                               nat[0] if nat else None)
        keys = self._head_sshd(name, nat[0] if nat else None, wrap=wrap)
        # a VM without an external address reaches PyPI only through Cloud NAT in its region
        no_way_out = None if nat or self.fake.has_nat(self.project, zone.rsplit("-", 1)[0]) else (
            f"no external address and no Cloud NAT in {zone.rsplit('-', 1)[0]} on {self.fake.network}")
        self._boot(name, script, "startup-script", metadata_url=self.md.base_url(name), creds={}, no_way_out=no_way_out,
                   extra_env={"SPOTWISE_GCP_NOTICE_S": str(self.notice_s),
                              "SPOTWISE_GCP_COMPUTE_URL": self.fake.endpoint,   # where "compute.googleapis.com" is
                              "SPOTWISE_GCS_ENDPOINT": self.front.endpoint,     # where "storage.googleapis.com" is
                              "GCE_METADATA_HOST": md_host, "GCE_METADATA_IP": md_host,
                              # google.auth gives a metadata server 3 s to answer its "on GCE?" ping; a
                              # loaded 2-core test machine's loopback server can miss that, a VM's does not
                              "GCE_METADATA_TIMEOUT": "30", **keys},
                   drop_env=("SPOTWISE_GCP_ENDPOINT", *NOT_ON_A_NODE), wrap=wrap)

    def _end_node(self, name: str) -> None:
        self.md.remove(name)
        super()._end_node(name)

    def _guest_shutdown(self, name: str) -> None:
        """GCP: a guest shutdown leaves the VM ``TERMINATED``, its boot disk kept (and billed)."""
        with self.fake._lock:
            for (p, _, n), inst in self.fake.instances.items():
                if p == self.project and n == name:
                    inst["status"] = "TERMINATED"

    # -- faults, the way GCP delivers them -----------------------------------------------------
    def preempt(self, name: str, notice_s: float | None = None) -> None:
        """Spot preemption, as GCE does it: ``instance/preempted`` is ``TRUE`` now (and Compute
        Engine logs a ``compute.instances.preempted`` operation) and the guest gets an ACPI soft
        off, which shuts it down (:meth:`soft_off`); after the notice window, the hard off: the
        instance is ended per its termination action (spotwise's Spot VMs: deleted, with their
        boot disk), its node's processes killed. Source: "Preemption process",
        cloud.google.com/compute/docs/instances/spot#preemption-process (ACPI G2 soft off, then G3
        mechanical off 30 s later)."""
        window = self.notice_s if notice_s is None else notice_s
        inst = next(i for i in self.instances() if i["name"] == name)
        zone = inst["zone"].rsplit("/", 1)[-1]
        self.fake.preempt(zone, name, self.project)
        self.md.preempt(name)
        self.preempted.append(name)
        start = time.monotonic()

        def soft_then_hard_off() -> None:
            try:
                self.soft_off(name, inst, window)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"soft off {name}: {e}")
            time.sleep(max(0.0, window - (time.monotonic() - start)))
            try:
                self.fake.reclaim(zone, name, self.project)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"reclaim {name}: {e}")

        threading.Thread(target=soft_then_hard_off, daemon=True).start()

    def soft_off(self, name: str, inst: dict, window: float) -> None:
        """The guest's shutdown at an ACPI soft off: the guest agent runs the instance's
        ``shutdown-script`` metadata item (``google-shutdown-scripts.service``'s ``ExecStop``) with
        the node's environment, cut off at the hard off; then everything still running gets
        SIGTERM (what the startup script left running is stopped only in systemd's final kill).
        Without a shutdown-script the node's processes get SIGTERM at the notice. Records the
        script's exit status in :attr:`shutdown_scripts` (None: cut off)."""
        import subprocess

        script = self.fake.metadata(inst).get("shutdown-script")
        env = self.envs.get(name)
        if script and env is not None:
            d = self.node_dir(name)
            d.mkdir(parents=True, exist_ok=True)
            (d / "shutdown-script").write_text(script)
            with open(d / "shutdown.out", "ab") as out:
                try:
                    rc: int | None = subprocess.run([*self.wraps.get(name, []), "bash", str(d / "shutdown-script")],
                                                    env=env, stdout=out,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    timeout=window).returncode
                except subprocess.TimeoutExpired:
                    rc = None
            self.shutdown_scripts[name] = rc
        self.sigtermed.append(name)
        self._sigterm_node(name)

    # -- what is left -------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """Everything of ours still in the fake cloud: instances, disks, addresses, firewall rules."""
        with self.fake._lock:
            return {"instances": [i["name"] for i in self.instances()],
                    "disks": [k[2] for k in self.fake.disks],
                    "addresses": [k[2] for k in self.fake.addresses],
                    "firewalls": [k[1] for k in self.fake.firewalls]}
