"""AWS: a cluster's network on EC2 — the subnets it launches into, its security group, the
interfaces its instances leave behind.

:class:`ClusterNetwork` is a mixin of :class:`~spotwise.provisioner.clouds.aws.cloud.AwsCloud` (split from
``cloud.py``, which launches and ends instances): it implements the ``Cloud`` interface's cluster
lifecycle (:meth:`prepare_cluster`, :meth:`cleanup_cluster`) and the sweeps ``gc`` uses
(:meth:`list_security_groups`, :meth:`delete_security_groups`). What it needs of its host — one
EC2 call with typed errors (``_call``), instances by filter (``_describe``), the regions to scan, the ports and CIDRs to open — is declared below and provided by
``AwsCloud``.

Why a group per cluster: all traffic among the cluster's own nodes (Ray, gloo/NCCL), and the head's
dashboard and control ports open to the VPC (or ``SPOTWISE_AWS_CLIENT_CIDRS``) only, and, on the
default head path (ssh: :mod:`spotwise.provisioner.head_path`), port 22 open to the launcher's own
address only; nothing else is open to the internet. EC2 refuses to delete a group still in use, and an interface a node left
keeps it in use, so cleanup ends those first and retries for a while.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeVar

from spotwise.provisioner import instance_types
from spotwise.errors import Problem
from spotwise.provisioner.base import TAG_CLUSTER, TAG_JOB, Node, ProvisionError, SiteError
from spotwise.provisioner.head_path import forget_cluster, head_path, launcher_cidr
from spotwise.provisioner.sites import AWS_OPT_IN_REGIONS

log = logging.getLogger("spotwise.provisioner.clouds.aws.cloud")

T = TypeVar("T")

CONSISTENCY_WAIT_S = 60.0   # sleep at most this long for EC2 to see what it just created
GROUP_NOT_FOUND = frozenset({"InvalidGroup.NotFound"})
ENABLED = ("opt-in-not-required", "opted-in")
LIVE_STATES = ("pending", "running", "stopping", "stopped")     # an instance in these keeps its group in use
ENDED_STATES = ("shutting-down", "terminated")


def ec2_tags(d: dict[str, str]) -> list[dict[str, str]]:
    """A tag dict as EC2's ``[{Key, Value}]`` list."""
    return [{"Key": k, "Value": v} for k, v in d.items()]


class ClusterNetwork:
    """The cluster's security group and leftover interfaces (a mixin of ``AwsCloud``)."""

    client_cidrs: list[str]
    dashboard_port: int
    control_port: int
    _groups: dict[tuple[str, str], str]          # (cluster id, region) -> its security group id
    _sleep: Callable[[float], None]
    regions: list[str]                           # configured (SPOTWISE_AWS_REGIONS); [] = discover
    skipped_regions: dict[str, str]              # region -> why the last scan could not read it
    _enabled: list[str] | None                   # the account's enabled regions, once asked
    _home_region: str                            # where DescribeRegions is asked
    subnet_ids: list[str]                        # SPOTWISE_AWS_SUBNETS; [] = the default VPC's
    head_subnet_ids: list[str]                   # SPOTWISE_AWS_HEAD_SUBNETS: public, for a head over ssh

    # provided by AwsCloud
    def _call(self, region: str, op: str, **kw: Any) -> dict:
        raise NotImplementedError

    def _describe(self, region: str, ids: list[str] | None = None,
                  filters: list[dict] | None = None) -> list[Node]:
        raise NotImplementedError

    # -- sites the plan leaves out ------------------------------------------------------------------
    opt_in_regions = AWS_OPT_IN_REGIONS

    def site_problem(self, region: str, named: frozenset[str]) -> str | None:
        """An opt-in region (:data:`~spotwise.provisioner.sites.AWS_OPT_IN_REGIONS`) is disabled on
        an account until its owner enables it, and there EC2 answers ``AuthFailure``, which reads as
        bad credentials: the plan ranks one only where the task or ``SPOTWISE_AWS_REGIONS`` names it."""
        if region in self.opt_in_regions and region not in named and region not in set(self.regions or []):
            return (f"aws/{region} is an opt-in region, disabled on an account until enabled: name it in the "
                    "task's resources.regions or in SPOTWISE_AWS_REGIONS once the account has it")
        return None

    # -- subnets ------------------------------------------------------------------------------------
    def head_path_problem(self, region: str) -> str | None:
        """On the ssh head path, a head needs a public subnet (its default route an internet
        gateway: a reply to its public address through a NAT gateway never returns). Configured
        node subnets (infra/aws's are private, behind NAT) need ``SPOTWISE_AWS_HEAD_SUBNETS``;
        the default VPC's subnets are public."""
        if self.subnet_ids and not self.head_subnet_ids:
            return (f"aws/{region}: the launcher reaches the head over ssh, and SPOTWISE_AWS_SUBNETS' subnets route "
                    "through NAT: set SPOTWISE_AWS_HEAD_SUBNETS (infra/aws output head_subnet_ids), or "
                    "SPOTWISE_HEAD_PATH=private from inside the VPC")
        return None

    def outbound_problem(self, region: str) -> str | None:
        """Why the configured node subnets (``SPOTWISE_AWS_SUBNETS``) in ``region`` give a worker no
        way out, or None. A worker has no public address unless its subnet maps one on launch, yet
        fetches the shipped wheel and PyPI packages at boot: its subnet's route table (its explicit
        association, else the VPC's main table; VPC User Guide, "Configure route tables") needs a
        0.0.0.0/0 route that is not a blackhole and is not an internet gateway serving a subnet
        without public addresses (NAT gateway: "NAT gateways", "Example: VPC with servers in private
        subnets and NAT"). Two reads per region (DescribeSubnets, DescribeRouteTables), once per
        cloud object; the default VPC (no subnets configured) is not read: its default subnets are
        public, with a route to its internet gateway (VPC User Guide, "Default VPCs")."""
        if not self.subnet_ids:
            return None
        cache: dict[str, str | None] = self.__dict__.setdefault("_outbound", {})
        if region not in cache:
            cache[region] = self._no_way_out(region)
        return cache[region]

    def _no_way_out(self, region: str) -> str | None:
        try:
            subs = self._subnets(region)        # read once: the launch uses the same answer
        except SiteError:   # none configured here: the launch skips the site saying so
            return None
        tables = self._call(region, "describe_route_tables",
                            Filters=[{"Name": "vpc-id", "Values": sorted({s["VpcId"] for s in subs})}])["RouteTables"]
        self.__dict__.setdefault("_route_tables", {})[region] = tables    # the group's VPC ranges: _vpc_cidrs
        explicit = {a["SubnetId"]: t for t in tables for a in t.get("Associations") or [] if a.get("SubnetId")}
        main = {t["VpcId"]: t for t in tables for a in t.get("Associations") or [] if a.get("Main")}
        closed = []
        for s in subs:
            table = explicit.get(s["SubnetId"]) or main.get(s["VpcId"]) or {}
            ways = [r for r in table.get("Routes") or [] if r.get("DestinationCidrBlock") == "0.0.0.0/0"
                    and r.get("State") != "blackhole"
                    and not (str(r.get("GatewayId", "")).startswith("igw-") and not s.get("MapPublicIpOnLaunch"))]
            if not ways:
                closed.append(s["SubnetId"])
        if not closed:
            return None
        return (f"aws/{region}: no outbound access from node subnet(s) {', '.join(closed)} (no 0.0.0.0/0 route to a "
                "NAT gateway, and workers have no public address), so a worker could not fetch the build or its "
                "packages: route them through a NAT gateway (infra/aws does) or leave them out of SPOTWISE_AWS_SUBNETS")

    def _subnets(self, region: str, *, head: bool = False) -> list[dict]:
        """Subnets to launch into: the configured ones, else the default VPC's default subnets; a
        head reached over ssh, the configured head subnets (``SPOTWISE_AWS_HEAD_SUBNETS``).

        Read once per region per cloud object (a run's): every launch, replacement and the
        security group's VPC lookup asked DescribeSubnets again for the same answer, four of a short
        run's 27 reads (issue 51: ``list_calls_per_min`` ≤ 12, launch included). Configured node
        and head subnets are one DescribeSubnets (the ids of both), not one each. A subnet deleted
        meanwhile fails the launch itself (CreateFleet names it), and the failover goes on."""
        cache: dict[tuple[str, bool], list[dict]] = self.__dict__.setdefault("_subnet_cache", {})
        key = (region, bool(head and self.head_subnet_ids))
        if key not in cache:
            if self.subnet_ids and self.head_subnet_ids:     # both by id: one read for both kinds
                both = self._call(region, "describe_subnets", Filters=[{"Name": "subnet-id", "Values": sorted(
                    {*self.subnet_ids, *self.head_subnet_ids})}])["Subnets"]
                read = {kind: [s for s in both if s["SubnetId"] in ids]
                        for kind, ids in ((False, self.subnet_ids), (True, self.head_subnet_ids))}
            else:
                read = {key[1]: self._read_subnets(region, head=key[1])}
            cache.update({(region, kind): subs for kind, subs in read.items() if subs})   # none: asked again
        return self._found(region, cache.get(key, []), head=key[1])

    def _read_subnets(self, region: str, *, head: bool) -> list[dict]:
        if head:
            flt = {"Name": "subnet-id", "Values": list(self.head_subnet_ids)}
        elif self.subnet_ids:
            # the configured subnets may span regions (a run allowed several): this region's only
            flt = {"Name": "subnet-id", "Values": list(self.subnet_ids)}
        else:
            flt = {"Name": "default-for-az", "Values": ["true"]}
        return self._call(region, "describe_subnets", Filters=[flt])["Subnets"]

    def _found(self, region: str, subs: list[dict], *, head: bool) -> list[dict]:
        """``subs``, or the SiteError naming the setting whose subnets ``region`` lacks."""
        if subs:
            return subs
        if head:
            raise SiteError(Problem("SPOTWISE_AWS_HEAD_SUBNETS", ",".join(self.head_subnet_ids),
                                    f"public subnet ids in {region} for the head (none of those is there)"),
                            cloud="aws", region=region)
        raise SiteError(Problem("SPOTWISE_AWS_SUBNETS", ",".join(self.subnet_ids) or None,
                                f"subnet ids in {region} (none of those is there)" if self.subnet_ids else
                                f"subnet ids in {region} (no default VPC subnets found)"),
                        cloud="aws", region=region)

    # -- regions ------------------------------------------------------------------------------------
    def scan_regions(self) -> list[str]:
        """Regions ``gc``/``down`` look in: the configured ones (``SPOTWISE_AWS_REGIONS``), else every
        region selling a known GPU type **that the account has enabled** (``DescribeRegions``: an
        opt-in region such as ap-southeast-3 answers ``AuthFailure`` until enabled). A run never
        scans: it lists its own regions only."""
        if self.regions:
            return list(self.regions)
        gpu = sorted({r for (cloud, _), it in instance_types.table().items() if cloud == "aws" for r in it.regions})
        if self._enabled is None:
            try:
                rows = self._call(self._home_region, "describe_regions", AllRegions=True)["Regions"]
                self._enabled = [r["RegionName"] for r in rows if r.get("OptInStatus", ENABLED[0]) in ENABLED]
            except ProvisionError as e:   # not allowed to ask: try them all, each_region skips what fails
                log.warning("aws: could not list the account's enabled regions (%s); trying every GPU region", e)
                return gpu
        off = [r for r in gpu if r not in self._enabled]
        for r in off:
            self.skipped_regions[r] = "not enabled for this account (opt-in region)"
        return [r for r in gpu if r in self._enabled]

    def each_region(self, fn: Callable[[str], list[T]]) -> list[T]:
        """``fn(region)`` for every region of :meth:`scan_regions`, concatenated. A region whose call
        fails is skipped and named in :attr:`skipped_regions` with why (until a call there
        succeeds); when every region fails, the first error is raised (an account that cannot be
        read is not an empty one)."""
        regions = self.scan_regions()
        out: list[T] = []
        first: ProvisionError | None = None
        for region in regions:
            try:
                out.extend(fn(region))
                self.skipped_regions.pop(region, None)
            except ProvisionError as e:
                log.warning("aws: skipped %s: %s", region, e)
                self.skipped_regions[region] = str(e)
                first = first or e
        if first is not None and len([r for r in regions if r in self.skipped_regions]) == len(regions):
            raise first
        return out

    def _after_create(self, fn: Callable[[], T], codes: frozenset[str]) -> T:
        """``fn()`` — a read or tag of something just created — retried while EC2 answers one of
        ``codes`` (its typed not-found answers while it is eventually consistent), with backoff
        (0.5 s doubling, at most 8 s a try) for at most :data:`CONSISTENCY_WAIT_S` of sleeping
        in all; then the error is raised."""
        slept, delay = 0.0, 0.5
        while True:
            try:
                return fn()
            except ProvisionError as e:
                if e.code not in codes or slept >= CONSISTENCY_WAIT_S:
                    raise
                wait = min(delay, CONSISTENCY_WAIT_S - slept)
                log.info("aws: %s right after a create; retrying in %.1f s", e.code, wait)
                self._sleep(wait)
                slept, delay = slept + wait, min(8.0, delay * 2)

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """The cluster's security group: all traffic among its own nodes (Ray, gloo/NCCL), and the
        head's dashboard and control ports from the VPC (each of its CIDR blocks: :meth:`_vpc_cidrs`)
        or ``SPOTWISE_AWS_CLIENT_CIDRS`` only; port 22 from the launcher's address only, where the
        launcher reaches the head over ssh."""
        if (cluster_id, region) in self._groups:
            return
        vpc_id = self._subnets(region)[0]["VpcId"]
        cidrs = self.client_cidrs or self._vpc_cidrs(region, vpc_id)
        tags = {TAG_CLUSTER: cluster_id, TAG_JOB: job_id, "Name": f"spotwise-{cluster_id}"}
        gid = self._call(region, "create_security_group", GroupName=f"spotwise-{cluster_id}",
                         Description=f"spotwise cluster {cluster_id} (job {job_id})", VpcId=vpc_id,
                         TagSpecifications=[{"ResourceType": "security-group", "Tags": ec2_tags(tags)}])["GroupId"]
        self._groups[(cluster_id, region)] = gid
        perms: list[dict[str, Any]] = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}]
        for port in (self.dashboard_port, self.control_port):
            perms.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                          "IpRanges": [{"CidrIp": c, "Description": "spotwise orchestrator"} for c in cidrs]})
        if head_path().ssh:     # the launcher's ssh to the head's public address, from its own address only
            perms.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                          "IpRanges": [{"CidrIp": launcher_cidr(), "Description": "spotwise launcher ssh"}]})
        self._after_create(lambda: self._call(region, "authorize_security_group_ingress", GroupId=gid,
                                              IpPermissions=perms), GROUP_NOT_FOUND)

    def _vpc_cidrs(self, region: str, vpc_id: str) -> list[str]:
        """The VPC's IPv4 CIDR blocks (its primary and any it added). Each route table of a VPC
        routes each of them ``local`` (VPC User Guide, "Route tables": the local route), so the
        route tables the plan's NAT check read (:meth:`outbound_problem`) answer it without another
        read (issue 51); else ``DescribeVpcs``."""
        tables = [t for t in self.__dict__.get("_route_tables", {}).get(region, []) if t.get("VpcId") == vpc_id]
        local = sorted({r["DestinationCidrBlock"] for t in tables for r in t.get("Routes") or []
                        if r.get("GatewayId") == "local" and r.get("DestinationCidrBlock")})
        if local:
            return local
        vpc = self._call(region, "describe_vpcs", VpcIds=[vpc_id])["Vpcs"][0]
        return sorted({a["CidrBlock"] for a in vpc.get("CidrBlockAssociationSet") or []
                       if (a.get("CidrBlockState") or {}).get("State") == "associated"}) or [vpc["CidrBlock"]]

    def security_group_rules(self, cluster_id: str, region: str) -> list[dict]:
        """The ingress rules of the cluster's group as EC2 reports them (tests and docs read them)."""
        gid = self._groups[(cluster_id, region)]
        return self._call(region, "describe_security_groups", GroupIds=[gid])["SecurityGroups"][0]["IpPermissions"]

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        """Delete the cluster's leftover network interfaces and its security group, once its
        instances are gone (EC2 refuses to delete a group still in use: retried for a while). The
        groups this process created for it are deleted by id, not listed again (a listing right
        after the create may not show the group yet, and it was one of a short run's reads: issue
        51); a cluster this process did not prepare (``spotwise down``) has its groups listed by its
        tag in every scanned region. A cluster id is one run's alone (a resume gets a new one)."""
        out: list[str] = []
        known = sorted((r, gid, c) for (c, r), gid in self._groups.items() if c == cluster_id)
        for region, gid, cid in known or self.list_security_groups(cluster_id):
            out += self._delete_group(region, gid, cid)
        for key in [k for k in self._groups if k[0] == cluster_id]:
            self._groups.pop(key)
        return out + forget_cluster("aws", cluster_id)      # its ssh tunnel and key, if it had them

    def list_security_groups(self, cluster_id: str | None = None, *,
                             regions: list[str] | None = None) -> list[tuple[str, str, str]]:
        """``(region, group_id, cluster_id)`` of every spotwise security group (in ``regions`` only
        when given)."""
        return self._list_tagged("describe_security_groups", "SecurityGroups", "GroupId", cluster_id, regions)

    def _list_tagged(self, op: str, key: str, id_field: str, cluster_id: str | None,
                     regions: list[str] | None = None) -> list[tuple[str, str, str]]:
        """``(region, id, cluster_id)`` of every resource ``op`` lists that carries our cluster tag
        (one cluster's when ``cluster_id`` is given), in every scanned region (one that cannot be
        read is skipped: :meth:`each_region`)."""
        filters = ([{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}] if cluster_id
                   else [{"Name": "tag-key", "Values": [TAG_CLUSTER]}])

        def one(region: str) -> list[tuple[str, str, str]]:
            return [(region, r[id_field], {x["Key"]: x["Value"] for x in r.get("Tags") or []}.get(TAG_CLUSTER, ""))
                    for r in self._call(region, op, Filters=filters).get(key, [])]

        if regions is not None:
            return [x for region in regions for x in one(region)]
        return self.each_region(one)

    def delete_security_groups(self, groups: list[tuple[str, str, str]]) -> list[str]:
        out: list[str] = []
        for region, gid, cid in groups:
            out += self._delete_group(region, gid, cid)
        return out

    def _leftover_interfaces(self, region: str, gid: str, ended: list[str]) -> list[dict]:
        """Network interfaces the cluster left: in its group, or still attached to one of its
        ``ended`` instances (EC2 deletes a primary interface with its instance; anything else
        stays). One in the group but attached to an instance that is not one of ``ended`` (another
        owner's, or one of ours not listed yet) is left alone: the group's deletion then waits."""
        found: dict[str, dict] = {}
        for flt in ([{"Name": "group-id", "Values": [gid]}],
                    *([[{"Name": "attachment.instance-id", "Values": ended[i:i + 100]}]
                       for i in range(0, len(ended), 100)])):
            for eni in self._call(region, "describe_network_interfaces", Filters=flt)["NetworkInterfaces"]:
                found[eni["NetworkInterfaceId"]] = eni
        return [eni for eni in found.values() if (eni.get("Attachment") or {}).get("InstanceId") in {None, *ended}]

    def _delete_interface(self, region: str, eni: dict) -> bool:
        """Delete one leftover interface (detaching it first if EC2 says it is still in use)."""
        eid = eni["NetworkInterfaceId"]
        for attempt in range(2):
            try:
                self._call(region, "delete_network_interface", NetworkInterfaceId=eid)
                return True
            except ProvisionError as e:
                if e.code == "InvalidNetworkInterfaceID.NotFound":
                    return False
                att = eni.get("Attachment") or {}
                if attempt == 0 and att.get("AttachmentId"):
                    try:
                        self._call(region, "detach_network_interface", AttachmentId=att["AttachmentId"], Force=True)
                        continue
                    except ProvisionError:
                        pass
                log.info("network interface %s not deletable yet: %s", eid, e)
                return False
        return False

    def _delete_group(self, region: str, gid: str, cluster_id: str, timeout_s: float = 120.0) -> list[str]:
        """Delete the group once none of the cluster's instances is live, with the interfaces its
        ended ones left (:meth:`_leftover_interfaces`). Each try reads the cluster's instances once
        (DescribeInstances by its tag, every state: the live ones keep the group in use, the ended
        ones may hold interfaces), where it read them twice and again for the ended ones (issue 51:
        a short run's teardown made 7 of its 27 reads). An instance of another owner in the group
        is not read for: EC2 refuses to delete a group in use (``DependencyViolation``), and that
        refusal is waited out the same way. A group of no known cluster (``gc``) is read for its
        live instances by group."""
        deleted: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            if cluster_id:
                ours = self._describe(region, filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}])
                users = [n for n in ours if n.state in LIVE_STATES]
                ended = [n.instance_id for n in ours if n.state in ENDED_STATES]
            else:
                users = self._describe(region, filters=[{"Name": "instance.group-id", "Values": [gid]},
                                                        {"Name": "instance-state-name", "Values": list(LIVE_STATES)}])
                ended = []
            if not users:
                for eni in self._leftover_interfaces(region, gid, ended):
                    if self._delete_interface(region, eni):
                        deleted.append(f"aws network interface {eni['NetworkInterfaceId']} ({region})")
                try:
                    self._call(region, "delete_security_group", GroupId=gid)
                    return deleted + [f"aws security group {gid} ({region})"]
                except ProvisionError as e:
                    if e.code == "InvalidGroup.NotFound":
                        return deleted
                    if time.monotonic() > deadline:
                        raise
                    log.info("security group %s still in use: %s", gid, e)
            elif time.monotonic() > deadline:
                raise ProvisionError(f"aws security group {gid} still used by {len(users)} instance(s)",
                                     cloud="aws", region=region)
            self._sleep(2)
