"""AWS: a cluster's network on EC2 — its security group, the interfaces its instances leave behind.

:class:`ClusterNetwork` is a mixin of :class:`~spotwise.provisioner.aws.AwsCloud` (split from
``aws.py``, which launches and ends instances): it implements the ``Cloud`` interface's cluster
lifecycle (:meth:`prepare_cluster`, :meth:`cleanup_cluster`) and the sweeps ``gc`` uses
(:meth:`list_security_groups`, :meth:`delete_security_groups`). What it needs of its host — one
EC2 call with typed errors (``_call``), instances by filter (``_describe``), the subnets of a
region, the regions to scan, the ports and CIDRs to open — is declared below and provided by
``AwsCloud``.

Why a group per cluster: all traffic among the cluster's own nodes (Ray, gloo/NCCL), and the head's
dashboard and control ports open to the VPC (or ``SPOTWISE_AWS_CLIENT_CIDRS``) only; nothing is
open to the internet. EC2 refuses to delete a group still in use, and an interface a node left
keeps it in use, so cleanup ends those first and retries for a while.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from spotwise.provisioner.base import TAG_CLUSTER, TAG_JOB, Node, ProvisionError

log = logging.getLogger("spotwise.provisioner.aws")


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

    # provided by AwsCloud
    def _call(self, region: str, op: str, **kw: Any) -> dict:
        raise NotImplementedError

    def _describe(self, region: str, ids: list[str] | None = None,
                  filters: list[dict] | None = None) -> list[Node]:
        raise NotImplementedError

    def _subnets(self, region: str) -> list[dict]:
        raise NotImplementedError

    def scan_regions(self) -> list[str]:
        raise NotImplementedError

    def prepare_cluster(self, cluster_id: str, job_id: str, region: str) -> None:
        """The cluster's security group: all traffic among its own nodes (Ray, gloo/NCCL), and the
        head's dashboard and control ports from the VPC (or ``SPOTWISE_AWS_CLIENT_CIDRS``) only.
        No port is open to the internet."""
        if (cluster_id, region) in self._groups:
            return
        vpc_id = self._subnets(region)[0]["VpcId"]
        vpc = self._call(region, "describe_vpcs", VpcIds=[vpc_id])["Vpcs"][0]
        cidrs = self.client_cidrs or [vpc["CidrBlock"]]
        tags = {TAG_CLUSTER: cluster_id, TAG_JOB: job_id, "Name": f"spotwise-{cluster_id}"}
        gid = self._call(region, "create_security_group", GroupName=f"spotwise-{cluster_id}",
                         Description=f"spotwise cluster {cluster_id} (job {job_id})", VpcId=vpc_id,
                         TagSpecifications=[{"ResourceType": "security-group", "Tags": ec2_tags(tags)}])["GroupId"]
        self._groups[(cluster_id, region)] = gid
        perms: list[dict[str, Any]] = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}]
        for port in (self.dashboard_port, self.control_port):
            perms.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                          "IpRanges": [{"CidrIp": c, "Description": "spotwise orchestrator"} for c in cidrs]})
        self._call(region, "authorize_security_group_ingress", GroupId=gid, IpPermissions=perms)

    def security_group_rules(self, cluster_id: str, region: str) -> list[dict]:
        """The ingress rules of the cluster's group as EC2 reports them (tests and docs read them)."""
        gid = self._groups[(cluster_id, region)]
        return self._call(region, "describe_security_groups", GroupIds=[gid])["SecurityGroups"][0]["IpPermissions"]

    def cleanup_cluster(self, cluster_id: str) -> list[str]:
        """Delete the cluster's leftover network interfaces and its security group, once its
        instances are gone (EC2 refuses to delete a group still in use: retried for a while)."""
        out: list[str] = []
        for region, gid, cid in self.list_security_groups(cluster_id):
            out += self._delete_group(region, gid, cid)
        for key in [k for k in self._groups if k[0] == cluster_id]:
            self._groups.pop(key)
        return out

    def list_security_groups(self, cluster_id: str | None = None) -> list[tuple[str, str, str]]:
        """``(region, group_id, cluster_id)`` of every spotwise security group."""
        return self._list_tagged("describe_security_groups", "SecurityGroups", "GroupId", cluster_id)

    def _list_tagged(self, op: str, key: str, id_field: str, cluster_id: str | None) -> list[tuple[str, str, str]]:
        """``(region, id, cluster_id)`` of every resource ``op`` lists that carries our cluster tag
        (one cluster's when ``cluster_id`` is given), in every scanned region."""
        filters = ([{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}] if cluster_id
                   else [{"Name": "tag-key", "Values": [TAG_CLUSTER]}])
        out = []
        for region in self.scan_regions():
            for r in self._call(region, op, Filters=filters).get(key, []):
                tags = {x["Key"]: x["Value"] for x in r.get("Tags") or []}
                out.append((region, r[id_field], tags.get(TAG_CLUSTER, "")))
        return out

    def delete_security_groups(self, groups: list[tuple[str, str, str]]) -> list[str]:
        out: list[str] = []
        for region, gid, cid in groups:
            out += self._delete_group(region, gid, cid)
        return out

    def _leftover_interfaces(self, region: str, gid: str, cluster_id: str) -> list[dict]:
        """Network interfaces the cluster left: in its group, or still attached to one of its
        ended instances (EC2 deletes a primary interface with its instance; anything else stays)."""
        ended = [n.instance_id for n in self._describe(region, filters=[
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]},
            {"Name": "instance-state-name", "Values": ["shutting-down", "terminated"]}])] if cluster_id else []
        found: dict[str, dict] = {}
        for flt in ([{"Name": "group-id", "Values": [gid]}],
                    *([[{"Name": "attachment.instance-id", "Values": ended[i:i + 100]}]
                       for i in range(0, len(ended), 100)])):
            for eni in self._call(region, "describe_network_interfaces", Filters=flt)["NetworkInterfaces"]:
                found[eni["NetworkInterfaceId"]] = eni
        return list(found.values())

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
        deleted: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            users = self._describe(region, filters=[{"Name": "instance.group-id", "Values": [gid]},
                                                    {"Name": "instance-state-name",
                                                     "Values": ["pending", "running", "stopping", "stopped"]}])
            if cluster_id:
                users += self._describe(region, filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]},
                                                         {"Name": "instance-state-name",
                                                          "Values": ["pending", "running", "stopping", "stopped"]}])
            if not users:
                for eni in self._leftover_interfaces(region, gid, cluster_id):
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
