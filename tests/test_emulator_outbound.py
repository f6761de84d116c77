"""The emulated clouds let a node out only where the real cloud would (issue 48, item 5): a machine
without a public address whose subnet has no route to a NAT gateway (AWS), or whose region has no
Cloud NAT on its network (GCP), cannot fetch the shipped wheel or PyPI packages, so the emulator
never runs its boot and its boot log says why. The emulated environments have NAT where infra/aws,
infra/gcp and infra/azure create it (Azure: a subnet with no NAT gateway, as every VNet made after
2025-09-30 outside infra/azure's locations is). No node is booted here: the machines are launched through spotwise's own
cloud code and handed to the emulator's boot step directly."""

from __future__ import annotations

import re
from pathlib import Path

from emulator.aws import EmulatedAws
from emulator.azure import INFRA_LOCATIONS, EmulatedAzure
from emulator.gcp import EmulatedGcp
from helpers import offer
from spotwise.provisioner.base import LaunchRequest


class _NoLoop:
    def _start_loop(self) -> None:
        pass


class QuietAws(_NoLoop, EmulatedAws):
    pass


class QuietGcp(_NoLoop, EmulatedGcp):
    pass


class QuietAzure(_NoLoop, EmulatedAzure):
    pass


def test_an_emulated_ec2_node_in_a_subnet_without_nat_never_boots_and_its_log_says_why(tmp_path, monkeypatch):
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    with QuietAws(tmp_path / "aws") as emu:
        for k, v in emu.env().items():
            monkeypatch.setenv(k, v)
        # the emulated environment's own subnets route through a NAT gateway, as infra/aws's do
        cloud = AwsCloud()
        assert all(cloud.outbound_problem(r) is None for r in emu.regions), emu.regions
        vpc = emu.ec2.create_vpc(CidrBlock="10.77.0.0/16")["Vpc"]["VpcId"]
        closed = emu.ec2.create_subnet(VpcId=vpc, CidrBlock="10.77.1.0/24", AvailabilityZone="us-east-1a")
        monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", closed["Subnet"]["SubnetId"])
        cloud = AwsCloud()
        assert "NAT" in (cloud.outbound_problem("us-east-1") or "")
        [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                            offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=9.0)))
        [inst] = [dict(i, Region="us-east-1") for i in emu.instances() if i["InstanceId"] == node.instance_id]
        emu._start_node(inst)
        log = (emu.node_dir(node.instance_id) / "boot.out").read_text()
        assert "no outbound access" in log and closed["Subnet"]["SubnetId"] in log
        assert node.instance_id in emu.offline and not (emu.node_dir(node.instance_id) / "state").exists()
        # a machine in the environment's own subnets has its way out
        monkeypatch.setenv("SPOTWISE_AWS_SUBNETS", ",".join(emu.subnets.values()))
        [ok] = AwsCloud().launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                               offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=9.0)))
        assert emu._no_way_out([i for i in emu.instances() if i["InstanceId"] == ok.instance_id][0]) is None


def test_an_emulated_gce_node_in_a_region_without_cloud_nat_never_boots_and_its_log_says_why(tmp_path):
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    with QuietGcp(tmp_path / "gcp") as emu:
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        assert cloud.outbound_problem("us-central1") is None            # infra/gcp's NAT, emulated
        from spotwise.provisioner.sites import default_regions

        assert all(cloud.outbound_problem(r) is None for r in default_regions("gcp"))
        with emu.fake._lock:
            emu.fake.routers = {k: r for k, r in emu.fake.routers.items() if k[1] != "us-central1"}
        assert "Cloud NAT" in (GcpCloud(project=emu.project, credentials=AnonymousCredentials(),
                                        endpoint=emu.fake.endpoint).outbound_problem("us-central1") or "")
        [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                            offer=offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a", usd=1.0)))
        [inst] = [i for i in emu.instances() if i["name"] == node.instance_id]
        emu._start_node(inst)
        log = (emu.node_dir(node.instance_id) / "boot.out").read_text()
        assert "no outbound access" in log and "Cloud NAT" in log and "us-central1" in log
        assert node.instance_id in emu.offline


def test_an_emulated_azure_vm_in_a_subnet_without_a_nat_gateway_never_boots_and_its_log_says_why(tmp_path, monkeypatch):
    from spotwise.provisioner.clouds.azure.cloud import AzureCloud
    from spotwise.provisioner.sites import default_regions

    tf = (Path(__file__).resolve().parents[1] / "infra" / "azure" / "main.tf").read_text()
    m = re.search(r'variable "locations" \{[^}]*default\s*=\s*\[([^\]]*)\]', tf)
    assert m and tuple(re.findall(r'"([^"]+)"', m.group(1))) == INFRA_LOCATIONS == tuple(default_regions("azure"))
    with QuietAzure(tmp_path / "azure", locations=("eastus",)) as emu:
        for k, v in emu.env().items():
            monkeypatch.setenv(k, v)
        cloud = AzureCloud(sleep=lambda s: None)

        def launch(region: str) -> dict:
            [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                                offer=offer("azure", "Standard_ND96asr_v4", region, usd=9.0)))
            [vm] = [v for v in emu.vms() if v["name"] == node.instance_id]
            return vm

        # infra/azure's location: its VNet's subnet has the NAT gateway, the VM has its way out
        assert emu._no_way_out(launch("eastus")) is None
        # elsewhere spotwise made the VNet itself: no NAT gateway, no public address, no way out
        vm = launch("westus2")
        emu._start_node(vm)
        log = (emu.node_dir(vm["name"]) / "boot.out").read_text()
        assert "no outbound access" in log and "NAT gateway" in log and "spotwise-westus2" in log, log
        assert vm["name"] in emu.offline and not (emu.node_dir(vm["name"]) / "state").exists()
