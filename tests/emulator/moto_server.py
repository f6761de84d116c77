"""moto's server on loopback for tests, bench and the emulators — and the one way to start it.

:class:`MotoServer` starts it as a subprocess on a free port (so other processes — nodes, the
``spotwise`` CLI — reach it too), waits until it answers, and stops it. Plain (``patched=False``) it
is moto as shipped; ``patched=True`` runs this module instead, the emulated AWS:

    python -m emulator.moto_server PORT

which adds behaviours moto lacks:

* ``DescribeSpotPriceHistory`` answers real-looking prices (moto's are a fixed 0.00001): per
  instance type and AZ from the JSON file ``$SW_EMU_SPOT_PRICES`` (``{type: {az_name: usd}}``),
  timestamped now, in the API's own shape.
* S3 as strict as a real bucket about presigned URLs (:mod:`emulator.s3_strict`, a layer in front
  of moto's application): SigV2 refused, a SigV4 URL verified (signature, region, expiry).
* EC2 as strict as a real account (:mod:`emulator.ec2_strict`): eventual consistency right after a
  create, ``AuthFailure`` from opt-in regions the account has not enabled, every ``Describe*``
  call counted (``$SW_EMU_CALLS``).
* A fleet's instance whose launch template asks for a public address on its primary interface
  (``NetworkInterfaces[0].AssociatePublicIpAddress``, as spotwise's head does) gets one, with the
  interface's groups, as EC2 gives it: ``PublicIpAddress`` and the interface's ``Association`` in
  ``DescribeInstances`` (moto's fleets drop the template's interfaces: no address, no groups). The
  address comes from :data:`PUBLIC_IPS`, a loopback range no emulated VPC uses, so a connection
  to it reaches only what listens there (the emulated head's sshd); an interface that asked for
  none (a worker) has none. Every address moto gives a public one (a subnet's
  ``MapPublicIpOnLaunch``) comes from that range too.
* ``CreateFleet`` answers ``InsufficientInstanceCapacity`` in its ``Errors`` list — exactly as EC2
  Fleet ``instant`` does — for the overrides whose (AZ, market) the JSON file
  ``$SW_EMU_CAPACITY`` lists under ``"none"`` (``AZ:market``, the AZ a glob: ``us-east-1*:spot``) (re-read on every call, so a test can take capacity
  away and give it back while a run goes on).

Product code is untouched: it only sees the wire.
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from spotwise.utils.net import free_port

TESTS_DIR = Path(__file__).resolve().parents[1]
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
#: the public IPv4 addresses the emulated EC2 gives: loopback, and distinct from every range the
#: emulators use for private addresses (emulator.aws.VPC_CIDRS 127.16/127.19/127.20, the GCP
#: subnet 127.17 and its external addresses 127.19 (only ever a GCP head's), the Azure VNet 127.18)
PUBLIC_IPS = "127.21.0.0/16"


class MotoServer:
    """A moto server subprocess on ``127.0.0.1:<free port>``, answering when the constructor returns.

    ``patched``: the emulated AWS of this module (spot prices and capacity from the ``SW_EMU_*``
    files in ``env``) instead of plain moto; ``log``: append its output there (else discarded).
    Raises RuntimeError when it does not answer within ``timeout_s``.
    """

    def __init__(self, *, patched: bool = False, env: dict[str, str] | None = None, log: Path | None = None,
                 timeout_s: float = 30.0) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        if patched:
            cmd = [sys.executable, "-m", "emulator.moto_server", str(self.port)]
            penv = dict(os.environ, **(env or {}), PYTHONPATH=f"{TESTS_DIR}:{os.environ.get('PYTHONPATH', '')}")
        else:
            exe = Path(sys.executable).with_name("moto_server")
            cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]) + [
                "-H", "127.0.0.1", "-p", str(self.port)]
            penv = dict(os.environ, **(env or {}))
        if log is None:
            self.proc = subprocess.Popen(cmd, env=penv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        else:
            with open(log, "ab") as out:
                self.proc = subprocess.Popen(cmd, env=penv, stdout=out, stderr=subprocess.STDOUT)
        self._wait(timeout_s)

    def _wait(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                return
            except (OSError, http.client.HTTPException):   # refused, reset, half-answered while it starts
                if time.time() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError(f"moto server on port {self.port} did not start") from None
                time.sleep(0.1)

    def env(self, region: str = "us-east-1") -> dict[str, str]:
        """What a boto3 client (or a process) needs to talk to it."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **CREDS, "AWS_DEFAULT_REGION": region}

    def client(self, service: str, region: str = "us-east-1"):
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=region,
                            aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    stop = close

    def __enter__(self) -> "MotoServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(env: str) -> dict:
    path = os.environ.get(env)
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _public_ips():
    """A function giving the next unused address of :data:`PUBLIC_IPS` (or ``$SW_EMU_PUBLIC_IPS``;
    thread-safe; the one moto server serves every region, so no two instances anywhere share one)."""
    import ipaddress
    import threading

    # an emulated AWS in network namespaces hands its own range (emulator.netns's public one)
    hosts, lock = ipaddress.ip_network(os.environ.get("SW_EMU_PUBLIC_IPS") or PUBLIC_IPS).hosts(), threading.Lock()

    def next_ip() -> str:
        with lock:
            return str(next(hosts))

    return next_ip


def _patch() -> None:
    from emulator import ec2_strict
    from moto.core.responses import ActionResult
    from moto.ec2.models import elastic_network_interfaces

    ec2_strict.install()
    elastic_network_interfaces.random_public_ip = _public_ips()   # what an interface gets, from PUBLIC_IPS
    from moto.ec2.responses.fleets import Fleets
    from moto.ec2.responses.spot_instances import SpotInstances

    def describe_spot_price_history(self) -> ActionResult:
        types = self._get_param("InstanceTypes", [])
        prices = self.ec2_backend.describe_spot_price_history(types, self._filters_from_querystring())
        table = _read("SW_EMU_SPOT_PRICES")
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        history = []
        for p in prices:
            usd = table.get(p["InstanceType"], {}).get(p["Location"])
            if usd is None:
                continue
            history.append({"InstanceType": p["InstanceType"], "ProductDescription": "Linux/UNIX",
                            "SpotPrice": f"{usd:.6f}", "AvailabilityZone": p["Location"], "Timestamp": now})
        return ActionResult({"SpotPriceHistory": history})

    original = Fleets.create_fleet

    def with_shutdown_behaviour(self, result: ActionResult) -> ActionResult:
        """Give the fleet's instances what their launch template says and moto leaves out: the
        InstanceInitiatedShutdownBehavior (else EC2's default, ``stop``: what a guest ``shutdown``
        does to them), the IamInstanceProfile (the node's identity; it must exist, as on EC2), and
        the primary interface's public address and groups (``NetworkInterfaces``, DeviceIndex 0)."""
        configs = self._get_param("LaunchTemplateConfigs", []) or []
        data: dict = {}
        for cfg in configs:
            lt_spec = cfg.get("LaunchTemplateSpecification") or {}
            if lt_spec.get("LaunchTemplateId"):
                lt = self.ec2_backend.get_launch_template(lt_spec["LaunchTemplateId"])
                data = lt.get_version(lt.latest_version_number).data
        profile = (data.get("IamInstanceProfile") or {}).get("Name")
        primary = next((n for n in data.get("NetworkInterfaces") or [] if int(n.get("DeviceIndex", 0)) == 0), {})
        for group in result.result.get("Instances") or []:   # type: ignore[attr-defined]
            for iid in group.get("InstanceIds") or []:
                inst = self.ec2_backend.get_instance(iid)
                inst.instance_initiated_shutdown_behavior = data.get("InstanceInitiatedShutdownBehavior") or "stop"
                if primary:
                    _as_the_interface_asks(self.ec2_backend, inst.nics[0], primary)
                if profile:
                    self.ec2_backend.associate_iam_instance_profile(instance_id=iid, iam_instance_profile_name=profile)
        return result

    def create_fleet(self) -> ActionResult:
        none = [(z, m) for z, m in (x.split(":") for x in _read("SW_EMU_CAPACITY").get("none", []))]
        if not none:
            return with_shutdown_behaviour(self, original(self))
        market = (self._get_param("TargetCapacitySpecification", {}) or {}).get("DefaultTargetCapacityType", "on-demand")
        configs = self._get_param("LaunchTemplateConfigs", [])
        errors, kept_any = [], False
        for cfg in configs:
            keep = []
            for ov in cfg.get("Overrides") or []:
                az = self.ec2_backend.get_subnet(ov["SubnetId"]).availability_zone
                if any(m == market and fnmatch.fnmatchcase(az, z) for z, m in none):
                    errors.append({"LaunchTemplateAndOverrides": {
                        "LaunchTemplateSpecification": cfg.get("LaunchTemplateSpecification"), "Overrides": ov},
                        "Lifecycle": market, "ErrorCode": "InsufficientInstanceCapacity",
                        "ErrorMessage": f"There is no {market} capacity for {ov.get('InstanceType')} in {az}."})
                else:
                    keep.append(ov)
            cfg["Overrides"] = keep
            kept_any = kept_any or bool(keep)
        if not kept_any:
            return ActionResult({"FleetId": "fleet-00000000-0000-0000-0000-000000000000", "Instances": [],
                                 "Errors": errors})
        real_get = self._get_param

        def get_param(name, *a, **kw):
            return configs if name == "LaunchTemplateConfigs" else real_get(name, *a, **kw)

        self._get_param = get_param
        try:
            result = original(self)
        finally:
            self._get_param = real_get
        if errors:
            result.result["Errors"] = errors   # type: ignore[attr-defined]
        return with_shutdown_behaviour(self, result)

    SpotInstances.describe_spot_price_history = describe_spot_price_history
    Fleets.create_fleet = create_fleet


def _as_the_interface_asks(backend, nic, spec: dict) -> None:
    """A launched instance's primary interface as its launch template's ``NetworkInterfaces[0]``
    says: the groups, and a public address when ``AssociatePublicIpAddress`` is true (EC2 User
    Guide, "Assign a public IPv4 address during instance launch": it overrides the subnet's
    setting), released at a stop and new at the next start, as EC2 does (moto's auto-assign)."""
    ids = spec.get("Groups") or []
    if isinstance(ids, dict):         # the query protocol's list as moto parsed it ({"1": "sg-..."})
        ids = list(ids.values())
    for gid in ids:
        group = backend.get_security_group_from_id(gid)
        if group is not None and group not in nic._group_set:
            nic._group_set.append(group)
    ask = spec.get("AssociatePublicIpAddress")
    if ask is not None:
        nic.public_ip_auto_assign = str(ask).lower() == "true"
        nic.public_ip = None
        nic.check_auto_public_ip()


def main() -> None:
    """moto's own server (what ``moto.server.main`` runs), its application behind the strict S3
    layer (:mod:`emulator.s3_strict`)."""
    _patch()
    os.environ.setdefault("SW_EMU_EC2_STRICT", "1")   # the emulated AWS is as strict as a real account
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    from emulator.s3_strict import StrictS3

    port = sys.argv[1]
    os.environ.setdefault("MOTO_PORT", port)
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", int(port), StrictS3(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
