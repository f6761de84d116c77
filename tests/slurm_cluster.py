"""A real two-node Slurm cluster on 127.0.0.1 for the tests: munged, slurmctld and two slurmd.

Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (``scripts/install.sh --test``
installs them) run as root from a generated ``slurm.conf``; everything they write (munge key and
socket, state, spool, logs, pid files, the files standing in for GPUs) lives under one temporary
directory, and every port is one of our own, so the cluster touches nothing of the machine's own
Slurm or munge. :meth:`TestCluster.stop` cancels every job and ends every daemon by its pid file.

The layout is the one the Slurm issue (36) asks for: nodes ``n1`` and ``n2`` (one ``slurmd -N nK``
each, on distinct ports, ``SlurmdSpoolDir``/``SlurmdPidFile`` with ``%n``), each declaring
``Gres=gpu:h100:8`` over plain files (``gres.conf`` ``File=``: slurmd warns, the node comes up
``idle``), and two partitions over both nodes: ``preemptible`` (``PriorityTier=1
PreemptMode=REQUEUE GraceTime=20``) and ``priority`` (tier 10), with ``PreemptType=
preempt/partition_prio`` and ``SlurmctldParameters=preempt_send_user_signal``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "squeue", "scancel")
GRACE_S = 20
GPUS_PER_NODE = 8


def missing() -> str | None:
    """Why a test cluster cannot run here (None: it can)."""
    gone = [b for b in BINARIES if shutil.which(b, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None]
    if gone:
        return (f"Slurm/munge not installed ({', '.join(gone)} missing): scripts/install.sh --test installs "
                "Debian's slurmctld slurmd slurm-client munge where it can")
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root (SlurmUser=root); not root here"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") or name


@dataclass
class TestCluster:
    """One test cluster under ``root``; :meth:`start` brings it up, :meth:`stop` ends all of it."""

    __test__ = False      # not a pytest test class

    root: Path
    name: str = "swtest"
    nodes: tuple[str, ...] = ("n1", "n2")
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment every client command needs (``SLURM_CONF``)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout)

    # -- configuration ---------------------------------------------------------------------------
    def write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "log", "gres", *(f"spool/{n}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for i in range(GPUS_PER_NODE):
            (r / "gres" / f"gpu{i}").touch()
        self.ports = {"ctld": _free_port(), **{n: _free_port() for n in self.nodes}}
        host = socket.gethostname().split(".")[0]
        node_lines = "\n".join(
            f"NodeName={n} NodeAddr=127.0.0.1 Port={self.ports[n]} CPUs=2 RealMemory=2000 "
            f"Gres=gpu:h100:{GPUS_PER_NODE} State=UNKNOWN" for n in self.nodes)
        names = ",".join(self.nodes)
        self.conf.write_text(f"""\
ClusterName={self.name}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ports['ctld']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
# Ray's `ray start --block` takes its time over a SIGTERM; Slurm's SIGKILL follows after KillWait
# (30 s by default): 5 s keeps a cancelled job from lingering as COMPLETING in the tests
KillWait=5
SchedulerParameters=bf_interval=5
MpiDefault=none
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
{node_lines}
PartitionName=preemptible Nodes={names} Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_S} MaxTime=02:00:00 DefaultTime=00:30:00 State=UP
PartitionName=priority Nodes={names} PriorityTier=10 PreemptMode=OFF MaxTime=1-00:00:00 State=UP
""")
        (r / "gres.conf").write_text(
            f"NodeName={names} Name=gpu Type=h100 File={r}/gres/gpu[0-{GPUS_PER_NODE - 1}]\n")

    # -- life ------------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> "TestCluster":
        self.write_config()
        r = self.root
        # root's munged: --force, since the key and socket live under a tmp dir it would refuse
        subprocess.run([_sbin("munged"), "--force", f"--key-file={r}/munge/munge.key",
                        f"--socket={r}/munge/munge.sock", f"--pid-file={r}/munge/munged.pid",
                        f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/seed"],
                       check=True, capture_output=True, timeout=30)
        subprocess.run([_sbin("slurmctld"), "-f", str(self.conf)], env=self.env, check=True,
                       capture_output=True, timeout=30)
        for n in self.nodes:
            subprocess.run([_sbin("slurmd"), "-N", n, "-f", str(self.conf)], env=self.env, check=True,
                           capture_output=True, timeout=30)
        self.wait_idle(timeout)
        return self

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, timeout: float = 60) -> None:
        """Until ``sinfo`` says every node is ``idle`` (what the controller knows, polled)."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if set(states) == set(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"test Slurm nodes not idle within {timeout:.0f} s: {states}; logs in {self.root}/log")

    def jobs(self) -> list[str]:
        """Every job the controller still has pending, running or completing (ids)."""
        out = self.run("squeue", "-h", "-o", "%i", check=False)
        return out.stdout.split()

    def cancel_all(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.jobs() and time.monotonic() < deadline:
            self.run("scancel", "--full", "--signal=KILL", *self.jobs(), check=False)
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel every job, then end slurmd, slurmctld and munged by their pid files."""
        try:
            self.cancel_all()
        finally:
            r = self.root
            pidfiles = [r / f"slurmd-{n}.pid" for n in self.nodes] + [r / "slurmctld.pid", r / "munge" / "munged.pid"]
            for p in pidfiles:
                _end(p)


def _end(pidfile: Path, timeout: float = 15) -> None:
    """SIGTERM the process of ``pidfile`` and wait for it to go (SIGKILL after ``timeout``)."""
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def cluster_fixture(tmp_path_factory):
    """The body of the ``slurm_cluster`` session fixture (tests/provisioner/clouds/slurm and tests/e2e register it):
    the cluster, started; skipped, saying why, where Slurm or root is missing; stopped after."""
    import pytest

    why = missing()
    if why:
        pytest.skip(why)
    cluster = TestCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


_INSTALLED = re.compile(r"spotwise build ([0-9a-f]{16}) installed from \S+ sha256 ([0-9a-f]{64})")
_REPORTED = re.compile(r"spotwise build ([0-9a-f]{16}) (?:installed from|already installed in)")


def nodes_from_wheel(node_dir: Path) -> dict[str, tuple[str, str]]:
    """Slurm node -> (build id, wheel sha256) that its install logs (``SPOTWISE_SLURM_NODE_DIR``,
    :mod:`spotwise.provisioner.clouds.slurm.script`) say it installed from the wheel its launch shipped."""
    out = {}
    for log in sorted(node_dir.glob("*/log/*.log")):
        if m := _INSTALLED.search(log.read_text(errors="replace")):
            out[log.parent.parent.name] = (m.group(1), m.group(2))
    return out


def jobs_builds(node_dir: Path) -> dict[str, list[str]]:
    """``NODE/CLUSTER-JOB`` -> the build ids its install log reports (installed now, or already):
    one entry per node of every job that ran."""
    return {f"{log.parent.parent.name}/{log.stem}": _REPORTED.findall(log.read_text(errors="replace"))
            for log in sorted(node_dir.glob("*/log/*.log"))}
