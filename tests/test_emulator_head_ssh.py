"""The launcher reaches an emulated head through ssh, as from a laptop (issue 48 item 3), on GCP, AWS
and Azure: the head gets a public (GCP: external) address, loopback here, the emulator runs a real sshd
there, port 22, whose authorized keys the head's real boot script (startup-script, user data) fills
with the cluster's key, and spotwise's own endpoint code forwards the dashboard port through it to
the head's private address. On AWS the emulated EC2 gives the address only to an instance whose
launch template's interface asks for one (the head; a worker gets none), and the head's sshd admits
only the addresses its security group opens port 22 to, as EC2's rules would: a launcher outside
that rule is refused. On Azure the head's NIC carries a Standard public IP and its sshd admits only
what the cluster's NSG opens port 22 to.

Each test runs twice: on loopback, and (``[netns]``) with the emulator's ``netns=True``
(:mod:`emulator.netns`), where the head lives in its region's network namespace and its private
address is out of the launcher's reach: a direct connection fails (no route) while the same
forward through its sshd reaches the dashboard there. On loopback the private addresses are
loopback addresses of this machine, reachable by anyone here. The dashboard is a stand-in HTTP server on the head's private address (no node build is shipped,
so the boot ends after authorizing the key, before Ray), which keeps this test fast."""

from __future__ import annotations

import ipaddress
import socket
import time
import urllib.request

import pytest
from httpfake import LoopbackServer

import sshd as test_sshd
from emulator import netns
from emulator.gcp import EmulatedGcp
from helpers import offer
from spotwise.provisioner import head_path as hp
from spotwise.provisioner.base import LaunchRequest
from spotwise.utils.net import service_port


@pytest.fixture
def dashboard_port(monkeypatch):
    port = service_port()
    monkeypatch.setenv("SPOTWISE_RAY_DASHBOARD_PORT", str(port))
    return port


def stand_in_dashboard(head, port: int, ns: str | None = None) -> LoopbackServer:
    """The head's Ray dashboard, standing in on its private address (``ns``: made inside the head's
    region's network namespace, where that address is)."""
    def make() -> LoopbackServer:
        return LoopbackServer({"GET": lambda ex: ex.send(200, f"dashboard of {head.instance_id}")},
                              host=head.address, port=port)

    return (make() if ns is None else netns.inside(ns, make)).start()


def reached_through_its_sshd(emu, cloud, head, dashboard_port: int) -> None:
    """The launcher's endpoint for cluster ``c1``'s ``head`` (it waits for the head's sshd and key, as
    for a booting head) forwards the dashboard through that sshd to the head's private address, and
    the key in the sshd's file is the cluster's, written by the head's real boot script."""
    nets = getattr(emu, "nets", None)
    ns = None
    if nets:                    # the head's private address exists in its namespace once its node boots
        deadline = time.monotonic() + 60
        while head.instance_id not in emu.nodes:
            assert time.monotonic() < deadline, "the emulator did not boot the head"
            time.sleep(0.2)
        ns = nets.region(head.region).ns
    server = stand_in_dashboard(head, dashboard_port, ns)
    try:
        ep = cloud.endpoint("c1", head)
        assert ep.dashboard_url.startswith("http://127.0.0.1:") and ep.control_listen.startswith(head.address)
        with urllib.request.urlopen(ep.dashboard_url, timeout=10) as r:
            assert r.read().decode() == f"dashboard of {head.instance_id}"
        keys = emu.sshds[head.instance_id].root / "authorized_keys"
        assert keys.read_text() == hp.authorized_key_line("c1") + "\n"
    finally:
        server.stop()


def direct_connection_fails(nets, head, port: int) -> None:
    """The dashboard the forward reached is on the head's private address, and this process (the
    launcher) cannot open a connection there itself: no route, not a refusal."""
    server = stand_in_dashboard(head, port, nets.regions[head.region].ns)
    try:
        assert netns.connect_from(nets.regions[head.region].ns, head.address, port) == "connected"
        with pytest.raises(OSError) as direct:
            socket.create_connection((head.address, port), timeout=3)
        assert not isinstance(direct.value, (ConnectionRefusedError, TimeoutError)), direct.value
    finally:
        server.stop()


@pytest.mark.parametrize("in_netns", [False, True], ids=["loopback", "netns"])
def test_the_launcher_reaches_an_emulated_gcp_head_only_through_its_sshd(tmp_path, monkeypatch, dashboard_port,
                                                                         in_netns):
    why = test_sshd.missing() or (netns.missing() if in_netns else None)
    if why:
        pytest.skip(why)
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    with EmulatedGcp(tmp_path / "gcp", head_path="ssh", netns=in_netns) as emu:
        for k, v in emu.env().items():
            if k != "SPOTWISE_RAY_DASHBOARD_PORT":
                monkeypatch.setenv(k, v)
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        cloud.prepare_cluster("c1", "j1", "us-central1")
        [head] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="head",
                                            offer=offer("gcp", "n2-standard-2", "us-central1", "us-central1-a",
                                                        market="on-demand")))
        if not in_netns:
            assert head.extra["public_address"].startswith("127.19.") and head.address.startswith("127.17.")
            reached_through_its_sshd(emu, cloud, head, dashboard_port)
        else:
            assert emu.nets is not None
            assert ipaddress.ip_address(head.extra["public_address"]) in ipaddress.ip_network(emu.nets.public_range)
            assert ipaddress.ip_address(head.address) in ipaddress.ip_network(emu.nets.private_range)
            assert emu.env()["SPOTWISE_LAUNCHER_CIDR"] == emu.nets.launcher_cidr
            reached_through_its_sshd(emu, cloud, head, dashboard_port)
            direct_connection_fails(emu.nets, head, dashboard_port)
        cloud.terminate([head])
        gone = cloud.cleanup_cluster("c1")
        assert any(g.startswith("ssh tunnel to ") for g in gone) and not hp.key_path("c1").exists()


@pytest.mark.parametrize("in_netns", [False, True], ids=["loopback", "netns"])
def test_the_launcher_reaches_an_emulated_aws_head_only_through_its_sshd_from_the_port_22_rules_address(
        tmp_path, monkeypatch, dashboard_port, in_netns):
    """The emulated EC2 gives the head (its template's interface asks) a public address from its
    own loopback range, in DescribeInstances as EC2 answers it, and the worker none; the head's
    sshd admits the launcher the cluster's port-22 rule names (the emulator's: 127.0.0.1/32, where
    a loopback connection comes from) and refuses one it does not (the suite's TEST-NET-3)."""
    why = test_sshd.missing() or (netns.missing() if in_netns else None)
    if why:
        pytest.skip(why)
    from emulator.aws import PUBLIC, VPC_CIDRS, EmulatedAws
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud
    from spotwise.provisioner.ssh_tunnel import SshTunnelError

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    public = PUBLIC.split(".0.0/")[0] + "."
    assert public not in [f"{p}." for p in VPC_CIDRS]
    with EmulatedAws(tmp_path / "aws", netns=in_netns) as emu:
        for k, v in emu.env().items():
            if k != "SPOTWISE_RAY_DASHBOARD_PORT":
                monkeypatch.setenv(k, v)
        assert emu.env()["SPOTWISE_HEAD_PATH"] == "ssh"
        cloud = AwsCloud()
        o = offer("aws", "m6i.large", emu.region, None, usd=0.1, market="on-demand")
        cloud.prepare_cluster("c1", "j1", emu.region)
        [head] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="head", offer=o))
        [worker] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker", offer=o,
                                              head_address=f"{head.address}:6379"))
        described = {i["InstanceId"]: i for i in emu.instances()}
        h, w = described[head.instance_id], described[worker.instance_id]
        if emu.nets is None:
            assert h["PublicIpAddress"].startswith(public) and h["PrivateIpAddress"].startswith(VPC_CIDRS[0] + ".")
        else:
            assert ipaddress.ip_address(h["PublicIpAddress"]) in ipaddress.ip_network(emu.nets.public_range)
            assert ipaddress.ip_address(h["PrivateIpAddress"]) in ipaddress.ip_network(emu.nets.network(0))
        assert h["NetworkInterfaces"][0]["Association"]["PublicIp"] == h["PublicIpAddress"]
        assert h["SubnetId"] in emu.head_subnets.values() and w["SubnetId"] in emu.subnets.values()
        assert "PublicIpAddress" not in w and not w["NetworkInterfaces"][0].get("Association")   # moto: {}
        assert head.extra["public_address"] == h["PublicIpAddress"] and "public_address" not in worker.extra

        reached_through_its_sshd(emu, cloud, head, dashboard_port)
        launcher = emu.nets.launcher_cidr if emu.nets else "127.0.0.1/32"
        assert emu.sshds[head.instance_id].allow_from == (launcher,)  # type: ignore[attr-defined]  # port-22 rule
        if emu.nets is not None:
            direct_connection_fails(emu.nets, head, dashboard_port)
        assert worker.instance_id not in emu.sshds
        cloud.terminate([head, worker])
        gone = cloud.cleanup_cluster("c1")
        assert any(g.startswith("ssh tunnel to ") for g in gone) and not hp.key_path("c1").exists()

        # a cluster whose port 22 opens to another address (the suite's TEST-NET-3): its head's
        # sshd refuses this launcher, as EC2's rule would drop its packets
        monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "203.0.113.7/32")
        cloud.prepare_cluster("c2", "j2", emu.region)
        [head] = cloud.launch(LaunchRequest(cluster_id="c2", job_id="j2", role="head", offer=o))
        deadline = time.monotonic() + 60
        while head.instance_id not in emu.sshds or "spotwise-c2" not in (
                emu.sshds[head.instance_id].root / "authorized_keys").read_text():   # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the head's user data did not authorize the cluster's key"
            time.sleep(0.5)
        assert emu.sshds[head.instance_id].allow_from == ("203.0.113.7/32",)    # type: ignore[attr-defined]
        with pytest.raises(SshTunnelError):
            hp.open_tunnel("c2", head.extra["public_address"], [(head.address, dashboard_port)],
                           user=hp.ssh_user(), wait_s=0)
        log = (emu.sshds[head.instance_id].root / "sshd.log").read_text()    # type: ignore[attr-defined]
        assert "not listed in AllowUsers" in log, log
        cloud.terminate([head])
        cloud.cleanup_cluster("c2")
        assert emu.leftovers()["instances"] == []


def test_the_launcher_reaches_an_emulated_azure_head_only_through_its_sshd_from_the_nsgs_address(
        tmp_path, monkeypatch, dashboard_port):
    """The emulated Azure gives the head's NIC a Standard public IP from its own loopback range
    (the worker none), and the head's sshd admits only the source prefixes the cluster's NSG opens
    port 22 to (the launcher's: 127.0.0.1/32 here)."""
    why = test_sshd.missing()
    if why:
        pytest.skip(why)
    from emulator.azure import PUBLIC_RANGE, VNET_CIDR, EmulatedAzure
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    with EmulatedAzure(tmp_path / "azure") as emu:
        for k, v in emu.env().items():
            if k != "SPOTWISE_RAY_DASHBOARD_PORT":
                monkeypatch.setenv(k, v)
        assert emu.env()["SPOTWISE_HEAD_PATH"] == "ssh"
        cloud = AzureCloud(sleep=lambda s: None)
        o = offer("azure", "Standard_D2s_v5", "eastus", usd=0.1, market="on-demand")
        cloud.prepare_cluster("c1", "j1", "eastus")
        [head] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="head", offer=o))
        [worker] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker", offer=o,
                                              head_address=f"{head.address}:6379"))
        public = PUBLIC_RANGE.split(".0.0/")[0] + "."
        assert head.extra["public_address"].startswith(public) and head.address.startswith(VNET_CIDR.split(".0.0/")[0])
        assert "public_address" not in worker.extra

        reached_through_its_sshd(emu, cloud, head, dashboard_port)
        # the NSG's rules: the launcher's port 22, and every port from the cluster's own subnet
        assert emu.sshds[head.instance_id].allow_from == ("127.0.0.1/32", cloud.subnet_cidr)  # type: ignore[attr-defined]
        assert worker.instance_id not in emu.sshds
        cloud.terminate([head, worker])
        gone = cloud.cleanup_cluster("c1")
        assert any(g.startswith("ssh tunnel to ") for g in gone) and not hp.key_path("c1").exists()
        assert emu.leftovers()["vms"] == [] and emu.leftovers()["public_ips"] == []
