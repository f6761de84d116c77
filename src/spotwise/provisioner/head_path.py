"""How the launcher reaches a cloud cluster's head: over ssh to its public address (the default), or
at its private address from inside the cluster's network (``SPOTWISE_HEAD_PATH=private``).

The orchestrator talks to the head over HTTP: the Ray dashboard's Jobs API and the job driver's
control endpoint. Both run code on the cluster, so they listen on the head's private address and
never face the internet; a launcher on a laptop cannot open a connection to that address. So, as
SkyPilot and Ray's cluster launcher do (both reach the head by ssh to its public address, with a key
of their own), the launcher by default:

* makes a key pair for the cluster (:func:`cluster_key`: ed25519, ``$SPOTWISE_HOME/keys/<cluster>``,
  mode 0600), whose public half the head's boot script authorizes for the user :data:`SSH_USER`,
  for port forwarding only (:func:`authorized_key_line`: ``restrict,port-forwarding`` and a
  command that does nothing, so the key opens forwards and no shell);
* gives the head — only the head: workers need no public address — a public IPv4 address, and
  opens its port 22 to the launcher's own address only (:func:`launcher_cidr`:
  ``SPOTWISE_LAUNCHER_CIDR``, else this machine's public IPv4 address as
  ``https://checkip.amazonaws.com`` reports it, ``/32``): the AWS security group, the GCP firewall
  rule, the Azure NSG rule of the cluster;
* reaches the dashboard and control ports through :class:`~spotwise.provisioner.ssh_tunnel.SshTunnel`
  forwards to the head's private address (:func:`ssh_endpoint`), the same supervised tunnel a Slurm
  cluster behind a login host uses;
* deletes the key, and the head's known-hosts file, with the cluster (:func:`delete_cluster_key`,
  from the cloud's ``cleanup_cluster``).

A launcher inside the cluster's network says so with ``SPOTWISE_HEAD_PATH=private`` (every region's
private addresses reach it: a VPN or peering) or ``private:REGION,...`` (only those regions'). The
plan leaves out a region whose head the launcher could not reach (:func:`unreachable`): outside the
named private regions, or, on the ssh path, with no ``ssh`` client on this machine or where the
cloud's configuration gives a head no reachable public address (AWS node subnets behind NAT and no
``SPOTWISE_AWS_HEAD_SUBNETS``: ``head_path_problem``); ``launch
--dry-run`` lists each such site with that reason.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotwise.config import setting, where
from spotwise.errors import InputError, Problem, SpotwiseError


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadEndpoint:
    """How the orchestrator reaches a cluster's head: the Ray dashboard (Jobs API) and the job
    driver's control endpoint, plus the environment a client needs to talk to them."""

    dashboard_url: str
    control_url: str
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)   # e.g. the cluster's Ray auth token
    #: ``HOST:PORT`` the job driver's control endpoint listens on, on the head, when the orchestrator
    #: reaches it elsewhere (a Slurm cluster over ssh: ``control_url`` is a local port forward,
    #: provisioner/ssh_tunnel.py; a cloud's head over ssh: this module's tunnel); None: ``control_url``'s
    #: own host and port
    control_listen: str | None = None


log = logging.getLogger(__name__)

SETTING = "SPOTWISE_HEAD_PATH"
CIDR_SETTING = "SPOTWISE_LAUNCHER_CIDR"
USER_SETTING = "SPOTWISE_HEAD_SSH_USER"
#: the head's user the cluster key logs in as (created by the boot script; forwards only)
SSH_USER = "spotwise"
#: where the launcher's public address is asked when ``SPOTWISE_LAUNCHER_CIDR`` is unset
CHECKIP_URL = "https://checkip.amazonaws.com"
#: how long :func:`ssh_endpoint` keeps trying a head whose sshd is not up yet (it boots meanwhile)
SSH_WAIT_S = 600.0
ALLOWED = ("ssh (the head's public address over ssh: the default) or private[:REGION,...] "
           "(this launcher is inside the cluster's network: every region's, or those named)")


@dataclass(frozen=True, slots=True)
class HeadPath:
    """``mode`` is ``ssh`` or ``private``; ``regions``: the regions whose private addresses this
    launcher reaches (``private:REGION,...``; None: every region)."""

    mode: str
    regions: frozenset[str] | None = None

    @property
    def ssh(self) -> bool:
        return self.mode == "ssh"


def head_path() -> HeadPath:
    """``SPOTWISE_HEAD_PATH`` read (default ``ssh``); anything else is an InputError naming it."""
    raw = (setting(SETTING) or "ssh").strip()
    mode, sep, rest = raw.partition(":")
    regions = frozenset(r.strip() for r in rest.split(",") if r.strip())
    if mode == "ssh" and not sep:
        return HeadPath("ssh")
    if mode == "private" and (not sep or regions):
        return HeadPath("private", regions or None)
    raise InputError(Problem(where(SETTING), raw, ALLOWED), source="head path")


def unreachable(cloud: Any, region: str) -> str | None:
    """Why the launcher could not reach a head of ``cloud`` in ``region`` (None: it can, as far as
    is known before launching). Only clouds whose heads are reached this way (``head_over_ssh``)."""
    if not getattr(cloud, "head_over_ssh", False):
        return None
    path = head_path()
    name = getattr(cloud, "name", "")
    if path.ssh:
        if shutil.which("ssh") is None:
            return (f"{name}/{region}: the launcher reaches a head over ssh ({SETTING}=ssh) and no ssh client is "
                    "installed here (install OpenSSH's client, or set private from inside the network)")
        problem = getattr(cloud, "head_path_problem", None)    # what the cloud's configuration lacks
        return problem(region) if callable(problem) else None
    if path.regions is not None and region not in path.regions:
        return (f"{name}/{region}: {SETTING}={setting(SETTING)} says this launcher reaches private addresses "
                f"only in {', '.join(sorted(path.regions))}, so it could not reach a head here "
                "(name the region too, or use ssh, the default)")
    return None


def ssh_user() -> str:
    """The head's user the launcher logs in as: ``SPOTWISE_HEAD_SSH_USER`` (an image, or the test
    suite's emulated head, whose sshd admits the cluster's key for another user: the node then
    names the file with ``SPOTWISE_AUTHORIZED_KEYS``), else :data:`SSH_USER`, whom the boot script
    creates."""
    import re

    raw = (setting(USER_SETTING) or SSH_USER).strip()
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", raw):
        raise InputError(Problem(where(USER_SETTING), raw, "a Linux user name ([a-z_][a-z0-9_-]*, up to 32)"),
                         source="head path")
    return raw


# -- the cluster's key --------------------------------------------------------------------------------
def keys_dir() -> Path:
    from spotwise.paths import home

    d = home() / "keys"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def key_path(cluster_id: str) -> Path:
    """The cluster's private key (its public half beside it, ``.pub``)."""
    if not cluster_id or "/" in cluster_id or cluster_id.startswith("."):
        raise ValueError(f"cluster id {cluster_id!r} cannot name a key file")
    return keys_dir() / cluster_id


def cluster_key(cluster_id: str) -> Path:
    """The cluster's key pair, made on first use (``ssh-keygen -t ed25519``, no passphrase, 0600)."""
    key = key_path(cluster_id)
    if not (key.exists() and key.with_suffix(".pub").exists()):
        if shutil.which("ssh-keygen") is None:
            raise SpotwiseError("ssh-keygen is not installed: the launcher makes a key per cluster to reach its "
                                f"head over ssh (install OpenSSH's client, or set {SETTING}=private)")
        for p in (key, key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"spotwise-{cluster_id}", "-f", str(key)],
                       check=True, capture_output=True)
        key.chmod(0o600)
    return key


def authorized_key_line(cluster_id: str) -> str:
    """The head's ``authorized_keys`` line for the cluster's key: port forwarding and nothing else."""
    pub = cluster_key(cluster_id).with_suffix(".pub").read_text().strip()
    return f'restrict,port-forwarding,command="/bin/true" {pub}'


def known_hosts(cluster_id: str) -> Path:
    return key_path(cluster_id).with_suffix(".known_hosts")


def cluster_key_files(cluster_id: str) -> list[Path]:
    """The cluster's key pair and known-hosts file that exist on this machine."""
    key = key_path(cluster_id)
    return [p for p in (key, key.with_suffix(".pub"), known_hosts(cluster_id)) if p.exists()]


def delete_cluster_key(cluster_id: str, *, dry_run: bool = False) -> list[str]:
    """Delete the cluster's key pair and known-hosts file (``dry_run``: only name them); what was
    deleted, in words."""
    gone = []
    for p in cluster_key_files(cluster_id):
        if not dry_run:
            p.unlink()
        gone.append(f"ssh key file {p.name}")
    return gone


def keyed_clusters() -> set[str]:
    """The clusters this machine holds a key (or a head's known-hosts file) for."""
    from spotwise.paths import home

    d = home() / "keys"
    out: set[str] = set()
    for p in (d.iterdir() if d.is_dir() else ()):
        name = p.name
        for suffix in (".pub", ".known_hosts"):
            if name.endswith(suffix):
                name = name[:-len(suffix)]
        if name and not name.startswith("."):
            out.add(name)
    return out


# -- the launcher's own address -----------------------------------------------------------------------
_discovered: list[str] = []


def launcher_cidr() -> str:
    """The CIDR a head's port 22 opens to: ``SPOTWISE_LAUNCHER_CIDR`` (checked), else this machine's
    public IPv4 address (:data:`CHECKIP_URL`, asked once per process) as a ``/32``."""
    import ipaddress

    raw = setting(CIDR_SETTING)
    if raw:
        try:
            return str(ipaddress.IPv4Network(raw.strip(), strict=False))
        except ValueError:
            raise InputError(Problem(where(CIDR_SETTING), raw, "an IPv4 address or CIDR, e.g. 203.0.113.7/32"),
                             source="head path") from None
    if not _discovered:
        try:
            with urllib.request.urlopen(CHECKIP_URL, timeout=10) as r:     # noqa: S310 - a fixed https URL
                ip = ipaddress.IPv4Address(r.read().decode().strip())
        except (OSError, ValueError) as e:
            raise InputError(Problem(where(CIDR_SETTING), None,
                                     f"this launcher's public IPv4 address (asking {CHECKIP_URL} failed: {e})"),
                             source="head path") from None
        _discovered.append(f"{ip}/32")
    return _discovered[0]


# -- the endpoint -------------------------------------------------------------------------------------
def ssh_options(cluster_id: str) -> tuple[str, ...]:
    """ssh's options for the cluster's head: its key only, and its host key trusted on first
    connection into a known-hosts file of its own (the head is new; the file dies with it)."""
    return ("-i", str(cluster_key(cluster_id)), "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"UserKnownHostsFile={known_hosts(cluster_id)}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR")


def open_tunnel(cluster_id: str, public: str, remotes: list[tuple[str, int]], *, port: int | None = None,
                user: str = SSH_USER, wait_s: float | None = None, sleep=time.sleep):
    """A started :class:`~spotwise.provisioner.ssh_tunnel.SshTunnel` to ``remotes`` through
    ``SSH_USER@public`` with the cluster's key. The head may still be booting (no sshd, or the key
    not yet authorized): starting is retried every 2 s for ``wait_s`` (:data:`SSH_WAIT_S`), then the
    last ssh error is raised."""
    from spotwise.provisioner.ssh_tunnel import SshTunnel, SshTunnelError
    from spotwise.utils.ssh import SshDestination

    dest = SshDestination(host=public, user=user, port=port,
                          options=ssh_options(cluster_id))
    deadline = time.monotonic() + (SSH_WAIT_S if wait_s is None else wait_s)
    while True:
        try:
            return SshTunnel(dest, remotes, name=cluster_id).start()
        except SshTunnelError as e:
            if time.monotonic() >= deadline:
                raise
            log.info("head of %s not reachable over ssh yet (%s); trying again", cluster_id, e)
            sleep(2.0)


#: each cluster's tunnel to its head, by (cloud, cluster id): started on first use, again for a new head
_TUNNELS: dict[tuple[str, str], Any] = {}


def ssh_endpoint(cloud: Any, cluster_id: str, head: Any):
    """The :class:`HeadEndpoint` of ``head`` (a
    :class:`~spotwise.provisioner.base.Node` whose ``extra["public_address"]`` the cloud filled in)
    through the cluster's tunnel: ``http://127.0.0.1:LOCAL`` for the dashboard and the control
    endpoint, forwarded to the head's private address, where the control endpoint still listens."""
    public = (head.extra or {}).get("public_address")
    if not head.address or not public:
        raise SpotwiseError(f"head {head.instance_id} has no {'public ' if head.address else ''}address yet: the "
                            f"launcher reaches it over ssh ({SETTING}=ssh), which needs one")
    dash, ctrl = int(cloud.dashboard_port), int(cloud.control_port)
    remotes = [(str(head.address), dash), (str(head.address), ctrl)]
    key = (cloud.name, cluster_id)
    tunnel = _TUNNELS.get(key)
    if tunnel is not None and (tunnel.closed or tunnel.remotes != remotes or tunnel.dest.host != public):
        tunnel.close()
        tunnel = None
    if tunnel is None:
        # port 22 as the head's user (SPOTWISE_HEAD_SSH_USER, else spotwise); a test's cloud may name
        # another port and user (a private sshd)
        tunnel = open_tunnel(cluster_id, str(public), remotes, port=getattr(cloud, "head_ssh_port", None),
                             user=getattr(cloud, "head_ssh_user", None) or ssh_user())
        _TUNNELS[key] = tunnel
    return HeadEndpoint(dashboard_url=tunnel.url(dash), control_url=tunnel.url(ctrl), control_listen=f"{head.address}:{ctrl}")


def forget_cluster(cloud_name: str, cluster_id: str) -> list[str]:
    """End the cluster's tunnel and delete its key (its nodes are gone): what was ended, in words."""
    out = []
    tunnel = _TUNNELS.pop((cloud_name, cluster_id), None)
    if tunnel is not None:
        pid = tunnel.pid
        tunnel.close()
        out.append(f"ssh tunnel to {tunnel.dest} (pid {pid})")
    try:
        return out + delete_cluster_key(cluster_id)
    except ValueError:
        return out
