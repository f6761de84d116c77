"""How the launcher reaches a cloud's head (provisioner/head_path.py): the setting, the plan's
reasons, the cluster's key, and the ssh path itself against a real sshd on 127.0.0.1
(tests/sshd.py) standing in for a head whose boot script authorized the cluster's key."""

from __future__ import annotations

import stat
import subprocess
import urllib.request
from types import SimpleNamespace

import pytest
from httpfake import LoopbackServer

from spotwise.errors import InputError
from spotwise.provisioner import head_path as hp
from spotwise.provisioner.ssh_tunnel import SshTunnelError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPOTWISE_HEAD_PATH", raising=False)
    monkeypatch.delenv("SPOTWISE_LAUNCHER_CIDR", raising=False)
    return tmp_path / "home"


AWS = SimpleNamespace(name="aws", head_over_ssh=True)


@pytest.mark.parametrize("raw,want", [
    (None, hp.HeadPath("ssh")), ("ssh", hp.HeadPath("ssh")), ("private", hp.HeadPath("private")),
    ("private:us-east-1, us-west-2", hp.HeadPath("private", frozenset({"us-east-1", "us-west-2"})))])
def test_head_path_setting(monkeypatch, raw, want):
    if raw is not None:
        monkeypatch.setenv("SPOTWISE_HEAD_PATH", raw)
    assert hp.head_path() == want


@pytest.mark.parametrize("raw", ["public", "ssh:us-east-1", "private:", "PRIVATE"])
def test_a_bad_head_path_names_the_setting_and_what_is_allowed(monkeypatch, raw):
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", raw)
    with pytest.raises(InputError) as e:
        hp.head_path()
    assert "SPOTWISE_HEAD_PATH" in str(e.value) and "private[:REGION,...]" in str(e.value)


def test_a_region_outside_the_named_private_networks_is_unreachable(monkeypatch):
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private:us-east-1")
    assert hp.unreachable(AWS, "us-east-1") is None
    why = hp.unreachable(AWS, "eu-west-1")
    assert why is not None and why.startswith("aws/eu-west-1:") and "us-east-1" in why
    # a cloud whose heads are not reached this way (local, slurm) is never excluded by it
    assert hp.unreachable(SimpleNamespace(name="slurm"), "eu-west-1") is None
    monkeypatch.setenv("SPOTWISE_HEAD_PATH", "private")
    assert hp.unreachable(AWS, "eu-west-1") is None


def test_the_ssh_path_without_an_ssh_client_is_unreachable(monkeypatch, tmp_path):
    assert hp.unreachable(AWS, "us-east-1") is None
    monkeypatch.setenv("PATH", str(tmp_path))       # no ssh on it
    why = hp.unreachable(AWS, "us-east-1")
    assert why is not None and "no ssh client" in why


def test_the_cluster_key_lives_in_the_home_and_dies_with_the_cluster(home):
    key = hp.cluster_key("c1")
    assert key.parent == home / "keys" and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert hp.cluster_key("c1") == key and key.with_suffix(".pub").exists()      # made once
    line = hp.authorized_key_line("c1")
    assert line.startswith('restrict,port-forwarding,command="/bin/true" ssh-ed25519 ') and line.endswith("spotwise-c1")
    hp.known_hosts("c1").write_text("")
    assert len(hp.delete_cluster_key("c1")) == 3
    assert list((home / "keys").iterdir()) == [] and hp.delete_cluster_key("c1") == []
    with pytest.raises(ValueError):
        hp.key_path("../x")


def test_the_launcher_cidr_setting(monkeypatch):
    monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "203.0.113.7")
    assert hp.launcher_cidr() == "203.0.113.7/32"
    monkeypatch.setenv("SPOTWISE_LAUNCHER_CIDR", "not-an-address")
    with pytest.raises(InputError, match="SPOTWISE_LAUNCHER_CIDR"):
        hp.launcher_cidr()


@pytest.fixture
def web():
    """The head's dashboard stand-in on 127.0.0.1."""
    with LoopbackServer({"GET": lambda ex: ex.send(200, "jobs api")}) as server:
        yield server.port


@pytest.fixture
def head_sshd(sshd):
    """The test sshd with the authorized keys it started with restored after the test."""
    keys = sshd.root / "authorized_keys"
    before = keys.read_text()
    yield sshd
    keys.write_text(before)


def test_the_head_is_reached_through_ssh_with_the_cluster_key_only(head_sshd, web):
    """The machine's own ssh (not the test server's client setup: its key is not used) logs in with
    the cluster's key once the "boot script" authorized it, and forwards to the dashboard; before
    that, and with another cluster's key, it is refused."""
    with pytest.raises(SshTunnelError, match="Permission denied"):
        hp.open_tunnel("c1", "127.0.0.1", [("127.0.0.1", web)], port=head_sshd.port, user=head_sshd.user, wait_s=0)
    with (head_sshd.root / "authorized_keys").open("a") as f:
        f.write(hp.authorized_key_line("c1") + "\n")
    tunnel = hp.open_tunnel("c1", "127.0.0.1", [("127.0.0.1", web)], port=head_sshd.port, user=head_sshd.user,
                            wait_s=0)
    try:
        with urllib.request.urlopen(tunnel.url(web), timeout=10) as r:
            assert r.read() == b"jobs api"
        host_key = (head_sshd.root / "host_key.pub").read_text().split()[1]
        assert host_key in hp.known_hosts("c1").read_text()      # trusted on first use, in the cluster's file
    finally:
        tunnel.close()
    # the key opens forwards, never a shell: the forced command runs instead of the one asked
    out = subprocess.run(["ssh", "-o", "BatchMode=yes", *hp.ssh_options("c1"), "-p", str(head_sshd.port),
                          f"{head_sshd.user}@127.0.0.1", "echo", "shell"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "shell" not in out.stdout
    with pytest.raises(SshTunnelError, match="Permission denied"):
        hp.open_tunnel("c2", "127.0.0.1", [("127.0.0.1", web)], port=head_sshd.port, user=head_sshd.user, wait_s=0)


def test_the_endpoint_of_a_head_over_ssh_and_its_end(head_sshd, web, home):
    """A cloud's head endpoint on the ssh path: both ports through one tunnel to the head's private
    address, the control endpoint still listening there; the cluster's end closes the tunnel and
    deletes its key."""
    from spotwise.provisioner.base import Node

    cloud = SimpleNamespace(name="aws", head_over_ssh=True, dashboard_port=web, control_port=web,
                            head_ssh_port=head_sshd.port, head_ssh_user=head_sshd.user)
    head = Node(cloud="aws", instance_id="i-1", instance_type="m6i.large", region="us-east-1", zone="us-east-1a",
                market="on-demand", usd_per_hour=0.1, cluster_id="c9", job_id="j", role="head", address="127.0.0.1")
    with pytest.raises(Exception, match="no public address"):
        hp.ssh_endpoint(cloud, "c9", head)
    head.extra["public_address"] = "127.0.0.1"
    with (head_sshd.root / "authorized_keys").open("a") as f:
        f.write(hp.authorized_key_line("c9") + "\n")
    ep = hp.ssh_endpoint(cloud, "c9", head)
    assert ep.dashboard_url.startswith("http://127.0.0.1:") and ep.control_listen == f"127.0.0.1:{web}"
    with urllib.request.urlopen(ep.dashboard_url, timeout=10) as r:
        assert r.read() == b"jobs api"
    assert hp.ssh_endpoint(cloud, "c9", head).dashboard_url == ep.dashboard_url      # one tunnel per cluster
    gone = hp.forget_cluster("aws", "c9")
    assert gone[0].startswith("ssh tunnel to ") and not hp.key_path("c9").exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(ep.dashboard_url, timeout=5)


def test_gc_deletes_the_keys_of_clusters_no_live_job_owns_and_down_its_clusters(home):
    """A launcher killed before its teardown leaves its cluster's key pair in the home: gc (and
    down, for its cluster) deletes it, keeps a live job's, and a dry run only names them."""
    from spotwise.provisioner.reconcile import down, gc

    for cid in ("dead", "live", "downed"):
        hp.cluster_key(cid)
    hp.known_hosts("dead").write_text("")
    assert hp.keyed_clusters() == {"dead", "live", "downed"}
    dry = gc(clouds=[], live={"live"}, dry_run=True)
    assert "ssh key file dead.known_hosts (dead)" in dry.extra_deleted and hp.keyed_clusters() == {"dead", "live",
                                                                                                  "downed"}
    assert down("downed", clouds=[]).extra_deleted == ["ssh key file downed (downed)",
                                                       "ssh key file downed.pub (downed)"]
    swept = gc(clouds=[], live={"live"})
    assert sorted(swept.extra_deleted) == ["ssh key file dead (dead)", "ssh key file dead.known_hosts (dead)",
                                           "ssh key file dead.pub (dead)"]
    assert hp.keyed_clusters() == {"live"}
