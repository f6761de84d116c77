"""An emulated GCP for end-to-end runs, offline (test and bench support, never product code).

The fake cloud decides what exists: the wire-level Compute Engine fake
(``tests/provisioner/fakes/gcp_fake.py``) on loopback, which the real ``google-cloud-compute``
client in the ``spotwise launch`` process talks to. The *instance emulator* turns each instance
the fake reports ``RUNNING`` (and labelled by spotwise) into a local node that executes **the
exact ``startup-script`` metadata item spotwise inserted**, with only environment overrides:

* ``SPOTWISE_STATE_DIR`` / ``SPOTWISE_ETC_DIR``: the node's own directories;
* ``SPOTWISE_VENV``: the already-installed venv instead of ``pip install``;
* ``SPOTWISE_METADATA_URL``: the node's own GCP metadata root on loopback
  (:mod:`emulator.gcp_metadata`: name, id, ``network-interfaces/0/ip`` = the private address the
  fake assigned, the instance's attributes, ``preempted`` with ``wait_for_change``), requiring
  ``Metadata-Flavor: Google`` like the real one;
* ``SPOTWISE_GCP_NOTICE_S``: the emulated notice window, so the watcher's drain deadline is the
  one this cloud really keeps (GCP's is 30 s; tests shorten it);
* ``SPOTWISE_RAY_START_ARGS``: free ports for the per-node Ray agents and a small object store;
* the node service account's stand-in for storage: checkpoints go to S3 on a moto server on
  loopback (GCS's XML API is S3-compatible with HMAC keys: the same ``s3://`` code path serves).

The fake's subnetwork is a loopback range (``127.17.0.0/16``), so every instance's private address
is a real, distinct loopback address here: Ray on each node binds to it and workers join the head
at the address the provisioner read from the Compute API — no translation anywhere.

Deleting an instance in the fake ends its node (every process carrying its marker variable). A
preemption is injected the GCP way: ``instance/preempted`` turns ``TRUE`` on the node's metadata
server and the fake records a ``compute.instances.preempted`` operation; after the notice window
the instance is ended as its ``instanceTerminationAction`` says (``DELETE`` for spotwise's Spot
VMs), and its node processes with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3

from emulator.gcp_metadata import GcpMetadataServer
from spotwise.provisioner.local import MARKER_ENV, _kill_until_gone, marked_pids

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "provisioner"))
from fakes.gcp_fake import GcpFake  # noqa: E402

SUBNET = "127.17.0.0/16"
PROJECT = "spotwise-emu"
GCP_NOTICE_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmulatedGcp:
    def __init__(self, workdir: Path, *, region: str = "us-central1", bucket: str = "ckpt",
                 notice_s: float = GCP_NOTICE_S) -> None:
        self.workdir = Path(workdir)
        self.region = region
        self.bucket = bucket
        self.notice_s = notice_s
        self.project = PROJECT
        self.scripts: dict[str, bytes] = {}        # instance name -> the startup-script it executed
        self.nodes: dict[str, str] = {}            # instance name -> marker value
        self.preempted: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._booting: tuple[str, float] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "EmulatedGcp":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.fake = GcpFake(ip_range=SUBNET).start()
        port = free_port()
        log = open(self.workdir / "moto.log", "ab")
        env = dict(os.environ, PYTHONPATH=f"{HERE.parent}:{os.environ.get('PYTHONPATH', '')}")
        self._proc = subprocess.Popen([sys.executable, "-m", "emulator.moto_server", str(port)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.s3_endpoint = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        self.creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.s3_endpoint}
        self.s3 = boto3.client("s3", endpoint_url=self.s3_endpoint, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
        self.s3.create_bucket(Bucket=self.bucket)
        self.md = GcpMetadataServer().start()
        self._thread = threading.Thread(target=self._loop, name="gcp-instance-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for name in list(self.nodes):
            self._end_node(name)
        self.md.stop()
        self.fake.stop()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "EmulatedGcp":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what the orchestrator's environment needs -----------------------------------------------
    def env(self) -> dict[str, str]:
        return {**self.creds, "SPOTWISE_GCP_ENDPOINT": self.fake.endpoint, "SPOTWISE_GCP_PROJECT": self.project,
                "SPOTWISE_GCP_ANONYMOUS": "1", "SPOTWISE_RAY_PORT": str(free_port()),
                "SPOTWISE_RAY_DASHBOARD_PORT": str(free_port()), "SPOTWISE_CONTROL_PORT": str(free_port())}

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

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                live = {i["name"]: i for i in self.instances()}
                for name, inst in live.items():
                    if inst["status"] == "RUNNING" and name not in self.nodes and self._boot_slot_free():
                        self._start_node(inst)
                for name in list(self.nodes):
                    if name not in live or live[name]["status"] != "RUNNING":
                        self._end_node(name)
            except Exception as e:  # noqa: BLE001 - recorded; the test asserts there were none
                self.errors.append(f"{type(e).__name__}: {e}")

    def _boot_slot_free(self, timeout_s: float = 90.0) -> bool:
        """Nodes boot one at a time (two cores host every "machine"; GCP boots them in parallel
        on their own hardware): the next starts once the last one's Ray is up."""
        if self._booting is None:
            return True
        name, t0 = self._booting
        log = self.workdir / "instances" / name / "state" / "ray.log"
        try:
            up = b"Ray runtime started" in log.read_bytes()
        except OSError:
            up = False
        if up or time.time() - t0 > timeout_s or name not in self.nodes:
            self._booting = None
            return True
        return False

    def _start_node(self, inst: dict) -> None:
        name = inst["name"]
        self._booting = (name, time.time())
        attrs = self.fake.metadata(inst)
        script = attrs["startup-script"].encode()
        self.scripts[name] = script
        d = self.workdir / "instances" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "startup-script").write_bytes(script)
        zone = inst["zone"].rsplit("/", 1)[-1]
        self.md.set_instance(name, instance_id=inst["id"], zone=zone, project=self.project,
                             ip=inst["networkInterfaces"][0]["networkIP"], attributes=attrs)
        marker = f"emu-{name}"
        ports = " ".join(f"--{k}={free_port()}" for k in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                          "runtime-env-agent-port", "metrics-export-port"))
        env = dict(os.environ)
        env.update(self.creds)
        env.update({
            "SPOTWISE_STATE_DIR": str(d / "state"), "SPOTWISE_ETC_DIR": str(d / "etc"),
            "SPOTWISE_VENV": sys.prefix, "SPOTWISE_METADATA_URL": self.md.base_url(name),
            "SPOTWISE_GCP_NOTICE_S": str(self.notice_s),
            "SPOTWISE_RAY_START_ARGS": f"{ports} --num-cpus=1 --object-store-memory=100000000",
            "SPOTWISE_HOME": str(self.workdir), MARKER_ENV: marker,
            "GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
        })
        for k in ("RAY_ADDRESS", "SPOTWISE_GCP_ENDPOINT", "SPOTWISE_RAY_PORT"):
            env.pop(k, None)
        with self._lock:
            self.nodes[name] = marker
        log = open(d / "boot.out", "ab")
        subprocess.Popen(["bash", str(d / "startup-script")], env=env, stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _end_node(self, name: str) -> None:
        with self._lock:
            marker = self.nodes.pop(name, None)
        self.md.remove(name)
        if marker:
            _kill_until_gone(lambda: marked_pids(marker))

    # -- faults, the way GCP delivers them -----------------------------------------------------
    def preempt(self, name: str, notice_s: float | None = None) -> None:
        """Spot preemption: ``instance/preempted`` is ``TRUE`` now (and Compute Engine logs a
        ``compute.instances.preempted`` operation); after the notice window the instance is
        ended per its termination action (spotwise's Spot VMs: deleted, with their boot disk)."""
        window = self.notice_s if notice_s is None else notice_s
        inst = next(i for i in self.instances() if i["name"] == name)
        zone = inst["zone"].rsplit("/", 1)[-1]
        self.fake.preempt(zone, name, self.project)
        self.md.preempt(name)
        self.preempted.append(name)

        def reclaim() -> None:
            time.sleep(window)
            try:
                self.fake.reclaim(zone, name, self.project)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"reclaim {name}: {e}")

        threading.Thread(target=reclaim, daemon=True).start()

    # -- what is left -------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """Everything of ours still in the fake cloud: instances, disks, addresses, firewall rules."""
        with self.fake._lock:
            return {"instances": [i["name"] for i in self.instances()],
                    "disks": [k[2] for k in self.fake.disks],
                    "addresses": [k[2] for k in self.fake.addresses],
                    "firewalls": [k[1] for k in self.fake.firewalls]}
