"""Running Slurm's commands: a cluster that cannot be asked is told apart from a refusal, here and
over ssh."""

from __future__ import annotations

import pytest

from slurm_cluster import missing
from spotwise.provisioner.clouds.slurm.cli import SlurmRunner, SlurmUnreachable
from spotwise.utils.ssh import parse_destination


def test_over_ssh_the_same_command_runs_quoted_with_the_clusters_slurm_conf():
    r = SlurmRunner(ssh="alice@login.lab", slurm_conf="/etc/slurm lab/slurm.conf")
    assert r.argv(["squeue", "-o", "%i %T"]) == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "alice@login.lab",
        "SLURM_CONF='/etc/slurm lab/slurm.conf' squeue -o '%i %T'"]
    assert r.env().get("SLURM_CONF") != "/etc/slurm lab/slurm.conf"     # the remote side's, not ours
    here = SlurmRunner(slurm_conf="/x/slurm.conf")
    assert here.argv(["sinfo"]) == ["sinfo"] and here.env()["SLURM_CONF"] == "/x/slurm.conf"


@pytest.mark.parametrize("text,argv", [
    ("login", ["login"]),                                       # an alias of ~/.ssh/config: its user, its port
    ("alice@login.lab", ["alice@login.lab"]),
    ("ssh://alice@login.lab:2222", ["-p", "2222", "alice@login.lab"]),
    ("ssh://login.lab", ["login.lab"]),
    ("ssh://bob@[fd00::1]:22", ["-p", "22", "bob@fd00::1"]),
])
def test_ssh_destinations_as_openssh_spells_them(text, argv):
    assert parse_destination(text).argv() == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *argv]
    assert SlurmRunner(ssh=text).argv(["sinfo"]) == [*parse_destination(text).argv(), "sinfo"]


def test_a_missing_command_is_unreachable():
    with pytest.raises(SlurmUnreachable, match="spotwise-no-such-scontrol is not installed on this machine"):
        SlurmRunner().run("spotwise-no-such-scontrol", "show", "partition")


def test_an_ssh_host_that_refuses_is_unreachable():
    # no sshd here (connection refused), or one that refuses a key-less BatchMode login: either way
    # ssh itself fails (255), so the site is skipped, not the request blamed
    with pytest.raises(SlurmUnreachable, match="ssh to nobody@127.0.0.1 failed"):
        SlurmRunner(ssh="nobody@127.0.0.1").run("scontrol", "show", "partition")


def test_a_controller_that_does_not_answer_is_unreachable(tmp_path):
    why = missing()
    if why and "not installed" in why:
        pytest.skip(why)
    conf = tmp_path / "slurm.conf"
    # a controller on a port nobody listens on (the client retries for about 9 s, then gives up)
    conf.write_text("ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n"
                    "AuthType=auth/none\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    with pytest.raises(SlurmUnreachable, match="does not answer on this machine"):
        SlurmRunner(slurm_conf=str(conf)).run("scontrol", "show", "partition", "-o")
