"""An emulated AWS for end-to-end runs, offline (test and bench support, never product code).

The fake cloud decides what exists: a moto server on loopback (:mod:`emulator.moto_server`).
The *instance emulator* turns each instance moto reports ``running`` (and tagged by spotwise)
into a local node that executes **the exact user-data spotwise handed EC2**, read back with
``DescribeInstanceAttribute userData``, with only environment overrides:

* ``SPOTWISE_STATE_DIR`` / ``SPOTWISE_ETC_DIR``: the node's own directories;
* ``SPOTWISE_VENV``: the already-installed venv instead of ``pip install``;
* ``SPOTWISE_METADATA_URL``: the node's own IMDSv2 endpoint on loopback (token, instance id,
  ``local-ipv4`` = the private address moto assigned, instance tags, ``spot/instance-action``);
* ``SPOTWISE_RAY_START_ARGS``: free ports for the per-node Ray agents (all nodes share one
  machine) and a small object store;
* the instance role's stand-in: fake credentials and ``AWS_ENDPOINT_URL`` for S3 on moto.

The emulated VPC uses a loopback CIDR (``127.16.0.0/16``; with several regions, one VPC per region
from :data:`VPC_CIDRS`), so every instance's private address is a real, distinct loopback address
on this machine: Ray on each node binds to it and workers join the head at the address the
provisioner read from EC2 — no translation anywhere.

Terminating an instance in moto ends its node (every process carrying its marker variable). A
preemption is injected the way EC2 does it: the notice appears on the node's metadata endpoint,
and after the notice window the instance is terminated in moto.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3

from spotwise.provisioner.local import MARKER_ENV, _kill_until_gone, marked_pids
from spotwise.provisioner.local_metadata import MetadataServer

HERE = Path(__file__).resolve().parent
VPC_CIDR = "127.16.0.0/16"
VPC_CIDRS = ("127.16", "127.19", "127.20")     # one loopback /16 per emulated region, in order


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmulatedAws:
    def __init__(self, workdir: Path, *, region: str = "us-east-1", bucket: str = "ckpt",
                 regions: tuple[str, ...] | None = None) -> None:
        self.workdir = Path(workdir)
        self.regions = tuple(regions or (region,))
        if len(self.regions) > len(VPC_CIDRS):
            raise ValueError(f"at most {len(VPC_CIDRS)} emulated regions")
        self.region = self.regions[0]
        self.bucket = bucket
        self.capacity_file = self.workdir / "capacity.json"
        self.prices_file = self.workdir / "spot_prices.json"
        self.scripts: dict[str, bytes] = {}        # instance id -> the user-data it executed
        self.nodes: dict[str, str] = {}            # instance id -> marker value
        self.preempted: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._booting: tuple[str, float] | None = None
        self._region_of: dict[str, str] = {}       # instance id -> region
        self.errors: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "EmulatedAws":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.capacity_file.write_text(json.dumps({"none": []}))
        port = free_port()
        env = dict(os.environ, SW_EMU_CAPACITY=str(self.capacity_file), SW_EMU_SPOT_PRICES=str(self.prices_file),
                   PYTHONPATH=f"{HERE.parent}:{os.environ.get('PYTHONPATH', '')}")
        log = open(self.workdir / "moto.log", "ab")
        self._proc = subprocess.Popen([sys.executable, "-m", "emulator.moto_server", str(port)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.endpoint = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        self.creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      "AWS_DEFAULT_REGION": self.region, "AWS_ENDPOINT_URL": self.endpoint}
        self.ec2s = {r: self._client("ec2", r) for r in self.regions}
        self.ec2 = self.ec2s[self.region]
        self.subnets: dict[str, str] = {}
        self.zone_ids: dict[str, str] = {}
        for prefix, (region, ec2) in zip(VPC_CIDRS, self.ec2s.items()):
            vpc = ec2.create_vpc(CidrBlock=f"{prefix}.0.0/16")["Vpc"]["VpcId"]
            zones = ec2.describe_availability_zones()["AvailabilityZones"]
            for i, z in enumerate(zones):
                sub = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{prefix}.{i + 1}.0/24", AvailabilityZone=z["ZoneName"])
                self.subnets[z["ZoneName"]] = sub["Subnet"]["SubnetId"]
            self.zone_ids.update({z["ZoneId"]: z["ZoneName"] for z in zones})
        self.prices_file.write_text(json.dumps(self._spot_prices()))
        self.ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]   # moto: same id everywhere
        self._client("s3").create_bucket(Bucket=self.bucket)
        self.imds = MetadataServer().start()
        self._thread = threading.Thread(target=self._loop, name="instance-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for iid in list(self.nodes):
            self._end_node(iid)
        self.imds.stop()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "EmulatedAws":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _client(self, service: str, region: str | None = None):
        return boto3.client(service, endpoint_url=self.endpoint, region_name=region or self.region,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def _spot_prices(self) -> dict:
        """Spot prices per type and AZ name: the catalog's per-AZ spot rows (AZ ids mapped to moto's names)."""
        from spotwise.pricing.catalog import find_offers

        names = getattr(self, "zone_ids", {})
        out: dict[str, dict[str, float]] = {}
        for o in find_offers({"A100": 8}, clouds=["aws"], regions=list(self.regions), market="spot"):
            out.setdefault(o.instance_type, {})[names.get(o.zone, o.zone)] = o.usd_per_hour
        return out

    # -- what the orchestrator's environment needs -----------------------------------------------
    def env(self) -> dict[str, str]:
        return {**self.creds, "AWS_EC2_METADATA_DISABLED": "true", "SPOTWISE_AWS_REGIONS": ",".join(self.regions),
                "SPOTWISE_AWS_SUBNETS": ",".join(self.subnets.values()), "SPOTWISE_AWS_AMI": self.ami,
                "SPOTWISE_RAY_PORT": str(free_port()), "SPOTWISE_RAY_DASHBOARD_PORT": str(free_port()),
                "SPOTWISE_CONTROL_PORT": str(free_port())}

    def set_no_capacity(self, pairs: list[str]) -> None:
        """``["us-east-1a:spot", "*:spot"]``: those (AZ, market) answer InsufficientInstanceCapacity."""
        tmp = self.capacity_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"none": pairs}))
        os.replace(tmp, self.capacity_file)

    # -- the instance emulator ----------------------------------------------------------------
    def instances(self, states=("pending", "running", "shutting-down", "stopping", "stopped")) -> list[dict]:
        """Our instances in every emulated region (each dict gains ``"Region"``)."""
        out = []
        for region, ec2 in self.ec2s.items():
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "tag-key", "Values": ["spotwise-cluster"]},
                         {"Name": "instance-state-name", "Values": list(states)}])
            for page in pages:
                for r in page["Reservations"]:
                    out += [dict(i, Region=region) for i in r["Instances"]]
        return out

    def ec2_of(self, iid: str):
        """The EC2 client of the region instance ``iid`` lives in."""
        return self.ec2s[self._region_of.get(iid, self.region)]

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                live = {i["InstanceId"]: i for i in self.instances()}
                for iid, inst in live.items():
                    if inst["State"]["Name"] == "running" and iid not in self.nodes and self._boot_slot_free():
                        self._start_node(inst)
                for iid in list(self.nodes):
                    if iid not in live or live[iid]["State"]["Name"] != "running":
                        self._end_node(iid)
            except Exception as e:  # noqa: BLE001 - recorded; the test asserts there were none
                self.errors.append(f"{type(e).__name__}: {e}")

    def _boot_slot_free(self, timeout_s: float = 90.0) -> bool:
        """Nodes boot one at a time (two cores host every "machine"; a real cloud boots them in
        parallel on their own hardware): the next starts once the last one's Ray is up."""
        if self._booting is None:
            return True
        iid, t0 = self._booting
        log = self.workdir / "instances" / iid / "state" / "ray.log"
        try:
            up = b"Ray runtime started" in log.read_bytes()
        except OSError:
            up = False
        if up or time.time() - t0 > timeout_s or iid not in self.nodes:
            self._booting = None
            return True
        return False

    def _start_node(self, inst: dict) -> None:
        iid = inst["InstanceId"]
        self._booting = (iid, time.time())
        self._region_of[iid] = inst["Region"]
        data = self.ec2_of(iid).describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"].get("Value", "")
        script = base64.b64decode(data)
        self.scripts[iid] = script
        d = self.workdir / "instances" / iid
        d.mkdir(parents=True, exist_ok=True)
        (d / "user-data").write_bytes(script)
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags") or []}
        self.imds.set_instance(iid, local_ipv4=inst["PrivateIpAddress"], tags=tags)
        marker = f"emu-{iid}"
        ports = " ".join(f"--{k}={free_port()}" for k in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                          "runtime-env-agent-port", "metrics-export-port"))
        env = dict(os.environ)
        env.update(self.creds)
        env.update({
            "SPOTWISE_STATE_DIR": str(d / "state"), "SPOTWISE_ETC_DIR": str(d / "etc"),
            "SPOTWISE_VENV": sys.prefix, "SPOTWISE_METADATA_URL": self.imds.base_url(iid),
            "SPOTWISE_RAY_START_ARGS": f"{ports} --num-cpus=1 --object-store-memory=100000000",
            "SPOTWISE_HOME": str(self.workdir), MARKER_ENV: marker,
            "GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
        })
        for k in ("RAY_ADDRESS", "SPOTWISE_AWS_SUBNETS", "SPOTWISE_RAY_PORT"):
            env.pop(k, None)
        with self._lock:
            self.nodes[iid] = marker
        log = open(d / "boot.out", "ab")
        subprocess.Popen(["bash", str(d / "user-data")], env=env, stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _end_node(self, iid: str) -> None:
        with self._lock:
            marker = self.nodes.pop(iid, None)
        if marker:
            _kill_until_gone(lambda: marked_pids(marker))

    # -- faults, the way EC2 delivers them ---------------------------------------------------------
    def preempt(self, iid: str, notice_s: float = 10.0) -> None:
        """Spot interruption: ``spot/instance-action`` now, the instance terminated after ``notice_s``."""
        self.imds.post_notice(iid, action="terminate", at=time.time() + notice_s)
        self.preempted.append(iid)

        def reclaim() -> None:
            time.sleep(notice_s)
            try:
                self.ec2_of(iid).terminate_instances(InstanceIds=[iid])
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"reclaim {iid}: {e}")

        threading.Thread(target=reclaim, daemon=True).start()

    # -- what is left -------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """Everything of ours still in the fake cloud: instances, volumes, ENIs, security groups."""
        tag = [{"Name": "tag-key", "Values": ["spotwise-cluster"]}]
        inst = [i["InstanceId"] for i in self.instances()]
        vols, gids, enis = [], [], []
        for ec2 in self.ec2s.values():
            vols += [v["VolumeId"] for v in ec2.describe_volumes(Filters=tag)["Volumes"]]
            here = [g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
            gids += here
            enis += [e["NetworkInterfaceId"] for e in ec2.describe_network_interfaces()["NetworkInterfaces"]
                     if any(g["GroupId"] in here for g in e.get("Groups", []))
                     or e.get("SubnetId") in self.subnets.values()]
        return {"instances": inst, "volumes": vols, "network_interfaces": enis, "security_groups": gids}
