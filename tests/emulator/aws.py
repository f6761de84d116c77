"""An emulated AWS for end-to-end runs, offline (test and bench support, never product code).

The fake cloud decides what exists: a moto server on loopback (:mod:`emulator.moto_server`).
The *instance emulator* turns each instance moto reports ``running`` (and tagged by spotwise)
into a local node that executes **the exact user-data spotwise handed EC2**, read back with
``DescribeInstanceAttribute userData``, with only environment overrides:

* ``SPOTWISE_STATE_DIR`` / ``SPOTWISE_ETC_DIR``: the node's own directories;
* ``SPOTWISE_VENV`` / ``SPOTWISE_PYTHON``: an empty venv path and a stock image's Python (torch and
  Ray, no spotwise): the script installs the wheel the launch shipped, as on the cloud;
* ``SPOTWISE_METADATA_URL``: the node's own IMDSv2 endpoint on loopback (token, instance id,
  ``local-ipv4`` = the private address moto assigned, instance tags, ``spot/instance-action``);
* ``SPOTWISE_RAY_START_ARGS``: free ports for the per-node Ray agents (all nodes share one
  machine) and a small object store;
* ``AWS_EC2_METADATA_SERVICE_ENDPOINT``: where boto3 finds the node's IMDS, which serves the
  credentials of the instance profile the launch attached (none without one: such a node cannot
  write its storage), and ``AWS_ENDPOINT_URL`` for S3 on moto. No keys are injected.

The emulated VPC uses a loopback CIDR (``127.16.0.0/16``; with several regions, one VPC per region
from :data:`VPC_CIDRS`), so every instance's private address is a real, distinct loopback address
on this machine: Ray on each node binds to it and workers join the head at the address the
provisioner read from EC2 — no translation anywhere.

With ``head_path="ssh"`` (the default, as spotwise's own) a head launches into a public subnet
of its own per zone (``SPOTWISE_AWS_HEAD_SUBNETS``, as infra/aws's ``head_subnet_ids``: the VPC's
``.240 + i`` /24s) and, since its launch template asks for one, gets a public address from
:data:`~emulator.moto_server.PUBLIC_IPS` (``127.21.0.0/16``: loopback, no VPC's range; workers ask
for none and get none). That address runs a real sshd on port 22 (``tests/sshd.py``, as the test's
user) whose authorized keys are a file of the node's own (``SPOTWISE_AUTHORIZED_KEYS``), filled by
the head's user data, and which admits only the addresses its security groups open port 22 to (as
EC2's rules would: the test's launcher connects from ``127.0.0.1``, so :meth:`EmulatedAws.env`
names that as ``SPOTWISE_LAUNCHER_CIDR``, as the GCP emulator does); the launcher reaches the head
through it (``SPOTWISE_HEAD_PATH=ssh``). The private addresses stay reachable from the launcher
here (loopback) unless ``netns``. ``head_path="private"``: the launcher uses the private
addresses, heads get no public address.

With ``netns=True`` each region's nodes run in a network namespace of their own
(:mod:`emulator.netns`), out of the launcher's direct reach as a VPC is out of a laptop's: each
region's VPC is a ``/22`` of the namespaces' block (:class:`VpcLayout`: the same subnets' roles),
the public addresses come from its public range (moto's ``$SW_EMU_PUBLIC_IPS``), a node's private
address lives on its region's loopback only and a head's public one on its region's end of a veth
link, where its sshd listens; the launcher's connections come from the links' root ends, the CIDR
the port-22 rule opens (``SPOTWISE_LAUNCHER_CIDR``). The node's IMDS and moto (S3) answer inside
every region at the same ``127.0.0.1`` URLs.

Terminating an instance in moto ends its node (every process carrying its marker variable). A
preemption is injected the way EC2 does it: the notice appears on the node's metadata endpoint,
and after the notice window the instance is terminated in moto.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from emulator.base import EmulatedCloud, orchestrator_ports
from emulator.moto_server import PUBLIC_IPS
from emulator.netns import RegionNets
from spotwise.provisioner.clouds.local.metadata import MetadataServer

NODE_PROFILE = "spotwise-node"   # the instance profile nodes carry (infra/aws: the role that may use the bucket)
# what a node must not inherit from the test process: its keys come from its instance profile
NO_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_EC2_METADATA_DISABLED",
           "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE")

HERE = Path(__file__).resolve().parent
VPC_CIDR = "127.16.0.0/16"
VPC_CIDRS = ("127.16", "127.19", "127.20")     # one loopback /16 per emulated region, in order
HEAD_SUBNET = 240              # the head subnets are the VPC's .240+i /24s (infra/aws: cidrsubnet(cidr, 8, 240 + i))
PUBLIC = PUBLIC_IPS            # where the emulated EC2's public addresses come from


@dataclass(frozen=True)
class VpcLayout:
    """An emulated region's VPC as infra/aws lays one out: node subnets per zone (``i``), the NAT
    gateway's public subnet, a head subnet per zone. On loopback a ``/16`` (``127.16``: the
    ``.{i+1}``, ``.200`` and ``.{240+i}`` /24s, as infra/aws's ``cidrsubnet(cidr, 8, ...)``); in a
    network namespace block a ``/22`` of :mod:`emulator.netns` (the ``/26`` number ``i+1``, 7 and
    ``8+i``: the same roles, smaller)."""

    vpc: str

    @classmethod
    def of(cls, prefix_or_cidr: str) -> "VpcLayout":
        return cls(prefix_or_cidr if "/" in prefix_or_cidr else f"{prefix_or_cidr}.0.0/16")

    def _sub(self, n: int) -> str:
        import ipaddress

        net = ipaddress.ip_network(self.vpc)
        if net.prefixlen == 16:
            return str(list(net.subnets(new_prefix=24))[n])
        small = list(net.subnets(new_prefix=26))
        if n >= len(small):
            raise ValueError(f"{self.vpc} holds no subnet {n}")
        return str(small[n])

    @property
    def nat(self) -> str:
        return self._sub(200 if self.vpc.endswith("/16") else 7)

    def nodes(self, i: int) -> str:
        return self._sub(i + 1)

    def heads(self, i: int) -> str:
        return self._sub(HEAD_SUBNET + i if self.vpc.endswith("/16") else 8 + i)

    def build(self, ec2, zones: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """Creates this VPC as infra/aws does, through ``ec2`` (a boto3 client on moto), with a node
        and a head subnet in each of ``zones``: ``({zone: node subnet id}, {zone: head subnet id})``.

        The node subnets are private: their own route table sends ``0.0.0.0/0`` to a NAT gateway in
        a public subnet (the nodes' only way to the wheel's URL and PyPI). The public subnets (the
        NAT gateway's, the heads' of the ssh path) route ``0.0.0.0/0`` to the internet gateway: a
        head with a public address goes out that way."""
        vpc = ec2.create_vpc(CidrBlock=self.vpc)["Vpc"]["VpcId"]
        public = ec2.create_subnet(VpcId=vpc, CidrBlock=self.nat, AvailabilityZone=zones[0])["Subnet"]["SubnetId"]
        igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
        ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
        nat = ec2.create_nat_gateway(SubnetId=public, AllocationId=ec2.allocate_address(Domain="vpc")["AllocationId"])
        private_rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=private_rtb, DestinationCidrBlock="0.0.0.0/0",
                         NatGatewayId=nat["NatGateway"]["NatGatewayId"])
        public_rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.create_route(RouteTableId=public_rtb, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
        ec2.associate_route_table(RouteTableId=public_rtb, SubnetId=public)
        nodes: dict[str, str] = {}
        heads: dict[str, str] = {}
        for i, zone in enumerate(zones):
            for out, cidr, rtb in ((nodes, self.nodes(i), private_rtb), (heads, self.heads(i), public_rtb)):
                sub = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
                ec2.associate_route_table(RouteTableId=rtb, SubnetId=sub)
                out[zone] = sub
        return nodes, heads


class EmulatedAws(EmulatedCloud):
    NODES_DIR = "instances"
    THREAD_NAME = "instance-emulator"

    def __init__(self, workdir: Path, *, region: str = "us-east-1", bucket: str = "ckpt",
                 regions: tuple[str, ...] | None = None, head_path: str = "ssh", netns: bool = False) -> None:
        super().__init__(workdir, bucket=bucket)
        if head_path not in ("ssh", "private"):
            raise ValueError(f"head_path: ssh or private, not {head_path!r}")
        self.head_path = head_path
        self.regions = tuple(regions or (region,))
        if len(self.regions) > len(VPC_CIDRS):
            raise ValueError(f"at most {len(VPC_CIDRS)} emulated regions")
        self.region = self.regions[0]
        self.capacity_file = self.workdir / "capacity.json"
        self.prices_file = self.workdir / "spot_prices.json"
        self._region_of: dict[str, str] = {}       # instance id -> region
        #: a network namespace per region (:mod:`emulator.netns`), made at :meth:`start`
        self.netns = netns

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "EmulatedAws":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.capacity_file.write_text(json.dumps({"none": []}))
        if self.netns:             # the links and public addresses, and a /22 VPC per region
            self.nets = RegionNets(units=4).start()      # 4 /22s: the links and public addresses, 3 VPCs
        moto = self._start_moto({"SW_EMU_CAPACITY": str(self.capacity_file),
                                 "SW_EMU_SPOT_PRICES": str(self.prices_file),
                                 **({"SW_EMU_PUBLIC_IPS": self.nets.public_range} if self.nets else {})})
        self.endpoint = moto.endpoint
        self.creds = moto.env(self.region)
        self.ec2s = {r: self._client("ec2", r) for r in self.regions}
        self.ec2 = self.ec2s[self.region]
        self.subnets: dict[str, str] = {}
        self.head_subnets: dict[str, str] = {}     # AZ -> its public subnet for heads
        self.zone_ids: dict[str, str] = {}
        for j, (prefix, (region, ec2)) in enumerate(zip(VPC_CIDRS, self.ec2s.items())):
            layout = VpcLayout.of(prefix if self.nets is None else self.nets.network(j))
            for dv in ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]:
                # a default VPC routes 0.0.0.0/0 to its internet gateway (VPC User Guide, "Default
                # VPCs"); moto's has no such route
                igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
                ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=dv["VpcId"])
                main = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [dv["VpcId"]]},
                                                          {"Name": "association.main", "Values": ["true"]}])
                ec2.create_route(RouteTableId=main["RouteTables"][0]["RouteTableId"],
                                 DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
            zones = ec2.describe_availability_zones()["AvailabilityZones"]
            nodes, heads = layout.build(ec2, [z["ZoneName"] for z in zones])
            self.subnets.update(nodes)
            self.head_subnets.update(heads)
            self.zone_ids.update({z["ZoneId"]: z["ZoneName"] for z in zones})
        self.prices_file.write_text(json.dumps(self._spot_prices()))
        self.ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]   # moto: same id everywhere
        self._client("s3").create_bucket(Bucket=self.bucket)
        iam = self._client("iam")              # the node identity infra/aws creates
        iam.create_role(RoleName=NODE_PROFILE, AssumeRolePolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "ec2.amazonaws.com"}}]}))
        iam.create_instance_profile(InstanceProfileName=NODE_PROFILE)
        iam.add_role_to_instance_profile(InstanceProfileName=NODE_PROFILE, RoleName=NODE_PROFILE)
        self.imds = MetadataServer().start()
        if self.nets:              # what a node calls: its IMDS, and S3 (and EC2) on moto
            for url in (self.imds.base_url("-"), self.endpoint):
                self.nets.forward(int(urllib.parse.urlsplit(url).port or 80))
        self._start_loop()
        return self

    def stop(self) -> None:
        self._stop_nodes()
        self.imds.stop()
        self._stop_moto()
        if self.nets:
            self.nets.stop()

    def _client(self, service: str, region: str | None = None):
        """A client of the emulated AWS for the emulator itself: its User-Agent says so, so the
        strict EC2's read count (:mod:`emulator.ec2_strict`) holds spotwise's reads only."""
        import boto3
        from botocore.config import Config

        from emulator.ec2_strict import EMULATOR_AGENT
        from emulator.moto_server import CREDS

        assert self.moto is not None
        return boto3.client(service, endpoint_url=self.moto.endpoint, region_name=region or self.region,
                            config=Config(user_agent_extra=EMULATOR_AGENT), **{k.lower(): v for k, v in CREDS.items()})

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
                "SPOTWISE_AWS_INSTANCE_PROFILE": NODE_PROFILE,
                "SPOTWISE_AWS_SUBNETS": ",".join(self.subnets.values()), "SPOTWISE_AWS_AMI": self.ami,
                # ssh: through each head's own sshd at its public address, as the test's user (the
                # emulated head authorizes the key in its sshd's file), port 22 open to the address
                # the test's connections come from; private: at the heads' private addresses
                "SPOTWISE_HEAD_PATH": self.head_path,
                **({"SPOTWISE_AWS_HEAD_SUBNETS": ",".join(self.head_subnets.values()),
                    "SPOTWISE_HEAD_SSH_USER": getpass.getuser(),
                    "SPOTWISE_LAUNCHER_CIDR": self.nets.launcher_cidr if self.nets else "127.0.0.1/32"}
                   if self.head_path == "ssh" else {}),
                **orchestrator_ports()}

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

    def _live(self) -> dict[str, dict]:
        return {i["InstanceId"]: i for i in self.instances()}

    def _is_running(self, machine: dict) -> bool:
        return machine["State"]["Name"] == "running"

    def _start_node(self, inst: dict) -> None:
        iid = inst["InstanceId"]
        self._region_of[iid] = inst["Region"]
        data = self.ec2_of(iid).describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"].get("Value", "")
        script = base64.b64decode(data)
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags") or []}
        # the node's credentials come only from its instance profile, through IMDS, as on EC2
        profile = (inst.get("IamInstanceProfile") or {}).get("Arn", "").rsplit("/", 1)[-1]
        role = None
        if profile:
            roles = self._client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
            role = roles[0]["RoleName"] if roles else None
        keys = {"AccessKeyId": self.creds["AWS_ACCESS_KEY_ID"], "SecretAccessKey": self.creds["AWS_SECRET_ACCESS_KEY"],
                "Token": "emulated-session-token"}
        self.imds.set_instance(iid, local_ipv4=inst["PrivateIpAddress"], tags=tags, role=role,
                               credentials=keys if role else None)
        node_env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": inst["Region"],
                    "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.imds.base_url(iid)}
        public = inst.get("PublicIpAddress")
        # with netns: the node's addresses in its region's namespace, and the node in there
        wrap = self._in_region(iid, inst["Region"], inst["PrivateIpAddress"], public)
        keys = self._head_sshd(iid, public, self._port_22_cidrs(inst), wrap=wrap) if public else {}
        self._boot(iid, script, "user-data", metadata_url=self.imds.base_url(iid), creds={**node_env, **keys},
                   drop_env=("SPOTWISE_AWS_SUBNETS", "SPOTWISE_AWS_HEAD_SUBNETS", *NO_KEYS),
                   no_way_out=self._no_way_out(inst), wrap=wrap)

    def _port_22_cidrs(self, inst: dict) -> list[str]:
        """The CIDRs the instance's security groups (its interfaces') open TCP port 22 to."""
        gids = sorted({g["GroupId"] for eni in inst.get("NetworkInterfaces") or [] for g in eni.get("Groups") or []}
                      | {g["GroupId"] for g in inst.get("SecurityGroups") or []})
        if not gids:
            return []
        out = []
        for g in self.ec2s[inst["Region"]].describe_security_groups(GroupIds=gids)["SecurityGroups"]:
            for perm in g.get("IpPermissions") or []:
                every = perm.get("IpProtocol") == "-1"
                if every or (perm.get("IpProtocol") == "tcp" and perm.get("FromPort", 0) <= 22 <= perm.get("ToPort", -1)):
                    out += [r["CidrIp"] for r in perm.get("IpRanges") or []]
        return sorted(set(out))

    def _no_way_out(self, inst: dict) -> str | None:
        """Why the instance has no outbound access, or None: its subnet's route table (its own, else
        the VPC's main one) needs a 0.0.0.0/0 route to a NAT gateway, or to an internet gateway with
        a public address on the instance (VPC User Guide, "Configure route tables", "NAT gateways")."""
        ec2, sid = self.ec2_of(inst["InstanceId"]), inst.get("SubnetId")
        tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [inst["VpcId"]]}])["RouteTables"]
        table = next((t for t in tables for a in t.get("Associations") or [] if a.get("SubnetId") == sid), None) \
            or next((t for t in tables for a in t.get("Associations") or [] if a.get("Main")), {})
        for r in table.get("Routes") or []:
            if r.get("DestinationCidrBlock") != "0.0.0.0/0" or r.get("State") == "blackhole":
                continue
            if r.get("NatGatewayId") or (str(r.get("GatewayId", "")).startswith("igw-") and inst.get("PublicIpAddress")):
                return None
        return (f"subnet {sid}'s route table {table.get('RouteTableId')} has no 0.0.0.0/0 route to a NAT gateway"
                + ("" if inst.get("PublicIpAddress") else ", and the instance has no public address"))

    def _guest_shutdown(self, iid: str) -> None:
        """EC2: a guest shutdown terminates the instance when its InstanceInitiatedShutdownBehavior
        is ``terminate`` (spotwise's launch template sets it), else stops it (EBS still billed)."""
        ec2 = self.ec2_of(iid)
        how = ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
        if how["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate":
            ec2.terminate_instances(InstanceIds=[iid])
        else:
            ec2.stop_instances(InstanceIds=[iid])

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
                     or e.get("SubnetId") in {*self.subnets.values(), *self.head_subnets.values()}]
        return {"instances": inst, "volumes": vols, "network_interfaces": enis, "security_groups": gids}
