"""The emulated clouds treat a node's own ``shutdown`` as each cloud does (the emulators must be
as strict as the clouds): EC2 per the instance's shutdown behaviour, GCP leaves the VM TERMINATED
with its disk. No node is booted here: the machines are launched through spotwise's own cloud
code, and the guest's ``shutdown`` is the emulator's, run as a node's dead man's switch runs it."""

from __future__ import annotations

import os
import subprocess

from emulator.aws import EmulatedAws
from emulator.gcp import EmulatedGcp
from helpers import offer
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.clouds.local.procs import MARKER_ENV


class _NoBoot:
    """An emulator whose instance loop does not run: nothing boots, the test plays the guest."""

    def _start_loop(self) -> None:
        pass


class QuietAws(_NoBoot, EmulatedAws):
    pass


class QuietGcp(_NoBoot, EmulatedGcp):
    pass


def _guest_runs_shutdown(emu, name: str) -> None:
    """What the dead man's switch runs on a node that is not root, on the node's PATH."""
    emu.nodes[name] = f"emu-{name}"
    env = {**os.environ, MARKER_ENV: f"emu-{name}", "PATH": f"{emu._guest_bin()}:{os.environ['PATH']}"}
    subprocess.run(["sudo", "-n", "shutdown", "-h", "now"], env=env, check=True, timeout=30)
    emu._halts()


def test_an_ec2_guest_shutdown_terminates_per_the_shutdown_behaviour(tmp_path, monkeypatch):
    from spotwise.provisioner.clouds.aws.cloud import AwsCloud

    with QuietAws(tmp_path / "aws") as emu:
        for k, v in emu.env().items():
            monkeypatch.setenv(k, v)
        cloud = AwsCloud()
        [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                            offer=offer("aws", "p4d.24xlarge", "us-east-1", "us-east-1a", usd=9.0)))
        _guest_runs_shutdown(emu, node.instance_id)
        assert emu.halted == [node.instance_id]
        [state] = [i["State"]["Name"] for i in emu.instances(("pending", "running", "shutting-down", "stopping",
                                                              "stopped", "terminated")) if i["InstanceId"] == node.instance_id]
        assert state in ("shutting-down", "terminated")       # spotwise's template: terminate
        # an instance without that behaviour (EC2's default, stop) is only stopped: its disks still bill
        plain = emu.ec2.run_instances(ImageId=emu.ami, MinCount=1, MaxCount=1, InstanceType="m5.large",
                                      TagSpecifications=[{"ResourceType": "instance",
                                                          "Tags": [{"Key": "spotwise-cluster", "Value": "c2"}]}])
        iid = plain["Instances"][0]["InstanceId"]
        _guest_runs_shutdown(emu, iid)
        assert [i["State"]["Name"] for i in emu.instances() if i["InstanceId"] == iid] in (["stopping"], ["stopped"])


def test_a_gcp_guest_shutdown_leaves_the_vm_terminated_with_its_disk(tmp_path, monkeypatch):
    from google.auth.credentials import AnonymousCredentials

    from spotwise.provisioner.clouds.gcp.cloud import GcpCloud

    with QuietGcp(tmp_path / "gcp") as emu:
        cloud = GcpCloud(project=emu.project, credentials=AnonymousCredentials(), endpoint=emu.fake.endpoint)
        [node] = cloud.launch(LaunchRequest(cluster_id="c1", job_id="j1", role="worker",
                                            offer=offer("gcp", "a2-highgpu-1g", "us-central1", "us-central1-a", usd=1.0)))
        _guest_runs_shutdown(emu, node.instance_id)
        assert [i["status"] for i in emu.instances()] == ["TERMINATED"]
        assert emu.leftovers()["instances"] == [node.instance_id]    # still there, with its disk, until deleted
