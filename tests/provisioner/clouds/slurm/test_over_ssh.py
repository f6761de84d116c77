"""A Slurm cluster driven from a machine that reaches only its login host (``ssh:`` in the config):
the real test cluster (tests/slurm_cluster.py) behind a private sshd on 127.0.0.1 (tests/sshd.py).
Slurm's commands run over ssh, the batch script goes over ssh's stdin, and the head's endpoint is
reached through the cluster's ssh port forwards, which end with the head."""

from __future__ import annotations

import urllib.request

import pytest
from httpfake import LoopbackServer

from spotwise.config import SlurmClusterConfig
from spotwise.provisioner.base import Node
from spotwise.provisioner.clouds.slurm.cloud import SlurmCloud
from spotwise.provisioner.clouds.slurm.cli import SlurmRunner
from spotwise.provisioner.clouds.slurm.discovery import discover
from spotwise.provisioner.clouds.slurm.jobs import comment, list_jobs, sbatch_args, submit
from spotwise.provisioner.clouds.slurm.launch import ended_state
from spotwise.utils.procs import pid_alive


@pytest.fixture
def over_ssh(sshd, slurm_cluster, monkeypatch):
    """This process's ``ssh`` logs in to the test sshd; the test cluster is behind it."""
    monkeypatch.setenv("PATH", sshd.env["PATH"])
    monkeypatch.delenv("SLURM_CONF", raising=False)     # the remote side gets the config's slurm_conf
    return sshd


@pytest.fixture
def head_ports():
    """Two HTTP servers standing in for the head's dashboard and control endpoint."""
    def answer(ex) -> None:
        ex.send(200, f"port {ex.server.server_address[1]}")

    with LoopbackServer({"GET": answer}) as a, LoopbackServer({"GET": answer}) as b:
        yield [a.port, b.port]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _sleeper(runner: SlurmRunner, cluster_id: str) -> str:
    """One of our jobs (a head's shape: one CPU, no GPU), submitted over ssh with its script on stdin."""
    args = sbatch_args(partition="priority", nodes=1, gres=None, time_limit_s=600, name=f"sw-{cluster_id}-head",
                       tags=comment(cluster_id, "j1", "head", "on-demand"), grace_s=10, cpus=1)
    return submit(runner, args, "#!/bin/bash\nexec sleep 600\n")


def test_a_cluster_behind_ssh_is_discovered_and_its_head_reached_through_the_login_host(
        over_ssh, slurm_cluster, head_ports):
    conf = str(slurm_cluster.conf)
    # the ssh:// spelling (the port in the URI), then an alias of the user's ssh config
    for dest in (over_ssh.uri, "lab-login"):
        info = discover(SlurmRunner(ssh=f"{over_ssh.user}@lab-login" if dest == "lab-login" else dest,
                                    slurm_conf=conf))
        assert {"preemptible", "priority"} <= set(info.partitions)
    cloud = SlurmCloud([SlurmClusterConfig.model_validate({
        "name": "lab", "slurm_conf": conf, "ssh": over_ssh.destination,
        "partitions": {"preemptible": {"price_per_gpu_hour": 0.4}, "priority": {"price_per_gpu_hour": 1.6}}})])
    runner = cloud.runner("lab")
    job_id = _sleeper(runner, "sshc1")
    try:
        assert [j.job_id for j in list_jobs(runner, "sshc1")] == [job_id]
        dash, ctrl = head_ports
        head = Node(cloud="slurm", instance_id=f"{job_id}/n1", instance_type="ray-head", region="lab",
                    zone="priority", market="on-demand", usd_per_hour=0.0, cluster_id="sshc1", job_id="j1",
                    role="head", address="127.0.0.1",
                    extra={"slurm_job": job_id, "dashboard_port": dash, "control_port": ctrl, "auth_token": "t"})
        ep = cloud.endpoint("sshc1", head)
        # the engine gets local URLs; the job driver on the head still binds the head's own address
        assert ep.dashboard_url.startswith("http://127.0.0.1:") and not ep.dashboard_url.endswith(f":{dash}")
        assert _get(ep.dashboard_url) == f"port {dash}" and _get(ep.control_url) == f"port {ctrl}"
        assert ep.control_listen == f"127.0.0.1:{ctrl}"
        tunnel = cloud._tunnels["sshc1"]
        pid = tunnel.pid
        assert pid and cloud.endpoint("sshc1", head).dashboard_url == ep.dashboard_url and tunnel.pid == pid
        cloud.terminate([head])              # scancel over ssh; the forwards to the head end with it
        assert "sshc1" not in cloud._tunnels and tunnel.closed and not pid_alive(pid)
        assert ended_state(runner, job_id) == "CANCELLED"
        assert cloud.cleanup_cluster("sshc1") == []
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
