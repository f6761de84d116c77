"""The runner SIGKILLed mid-run on an emulated cloud, shared by the tests that do it: every instance
gone from the cloud within the documented bound, ended by its own node, then ``spotwise gc``.

Issue 29 asks a node's own way of ending itself to reach the fake cloud as it reaches the real one:
an EC2 node's ``shutdown -h now`` terminates it (the shutdown behaviour spotwise sets), a GCP or
Azure node deletes its own instance through its identity (a guest shutdown would leave a GCP VM
``TERMINATED`` with its disk, and an Azure VM allocated, both still billed). Here the real chain
runs: ``spotwise launch`` boots a cluster from the stock image on the emulator, pushes its node
lease, trains until a checkpoint is committed in the cloud's own store, and is SIGKILLed; the
nodes' watchers (:mod:`spotwise.runtime.node.deadman`) see the lease pass and end their instances. The
bound is the lease's term after the kill (15 s here, the shortest an operator may set through
``SPOTWISE_NODE_LEASE_S``) plus :data:`~spotwise.engine.state.lease.SELF_END_S`; the wait polls with
slack, no timing is asserted tightly. ``spotwise gc`` then only marks the job ``lost`` (once), with
the gone nodes billed no later than their lease let them run, and deletes what outlives an instance
by design (firewall rules, security groups, a network security group): nothing of ours is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from e2e.helpers import job_row, launch_env, wait_for
from spotwise.engine.state.lease import SELF_END_S

NODE_LEASE_S = 15.0      # the shortest term an operator may set (NODE_LEASE_BOUNDS_S): the bound below
SLACK_S = 120.0          # a loaded 2-core machine: generous, and only an upper bound


@dataclass
class Killed:
    """What the kill left: the environment its commands ran with, the run's home and its job row
    (``lost``), and the machines the cluster had."""

    env: dict
    home: Path
    job: dict
    machines: set[str]


def sigkill_runner_mid_run(emu: Any, cloud: str, tmp_path: Path, task: Path, storage: str,
                           committed: Callable[[], bool], kind: str, machines: int, cap_usd: float) -> Killed:
    """``spotwise launch task`` on ``emu`` until ``committed()``, SIGKILL it (its whole session), and
    hold what the module docstring says; ``kind`` is the emulator's leftovers key of its machines
    (``instances``, ``vms``), ``machines`` how many the cluster has (head and workers)."""
    home = tmp_path / "home"
    env = dict(launch_env(emu, tmp_path), SPOTWISE_NODE_LEASE_S=str(NODE_LEASE_S))
    with open(tmp_path / "launch.err", "w") as err, open(tmp_path / "launch.out", "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                              "--storage", storage], env=env, stdout=out, stderr=err,
                             start_new_session=True)
    try:
        wait_for(lambda: committed() or p.poll() is not None, 600, "the first committed checkpoint")
        assert p.poll() is None, (f"launch exited {p.returncode} before the kill: "
                                  + (tmp_path / "launch.out").read_text()[-3000:]
                                  + (tmp_path / "launch.err").read_text()[-3000:])
        wait_for(lambda: job_row(home)["node_deadline"], 60, "a node lease pushed to the head")
        names = set(emu.nodes)
        assert len(names) == machines, names
        assert len(emu.leftovers()[kind]) == machines, emu.leftovers()
        os.killpg(p.pid, signal.SIGKILL)                       # the runner, and nothing of the nodes'
        killed_at = time.time()
        p.wait()
        assert job_row(home)["status"] == "running"               # nobody has told the database
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)

    bound = NODE_LEASE_S + SELF_END_S
    wait_for(lambda: not emu.leftovers()[kind], bound + SLACK_S,
             f"every {kind[:-1]} gone from the cloud (bound {bound:.0f} s after the kill + slack)")
    gone_after = time.time() - killed_at
    for m in names:
        log = (emu.workdir / emu.NODES_DIR / m / "state" / "watch.log").read_text()
        assert "dead man's switch: ending this node" in log, log[-2000:]
    assert not emu.errors, emu.errors
    print(f"{cloud}: every instance gone {gone_after:.0f} s after SIGKILL (bound {bound:.0f} s + slack)")

    # gc only tells the database and removes what outlives an instance by design
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "gc", "--cloud", cloud, "--format", "json"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    sweep = json.loads(r.stdout)
    job = job_row(home)
    assert [j["job_id"] for j in sweep["jobs"]] == [job["id"]]
    assert job["status"] == "lost" and job["open_nodes"] == 0
    assert 0 < job["spend"] <= cap_usd
    # gone nodes are billed no later than their lease let them run
    assert job["ledger_end"] <= job["node_deadline"] + SELF_END_S + 1
    assert all(not v for v in emu.leftovers().values()), emu.leftovers()
    # nor on this machine: the killed launcher's ssh key for its cluster (the GCP and AWS runs' head path)
    assert not list((home / "keys").glob("*")) if (home / "keys").is_dir() else True, list((home / "keys").iterdir())
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "gc", "--cloud", cloud, "--format", "json"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout)["jobs"] == [], r.stdout   # once only
    return Killed(env=env, home=home, job=job, machines=names)
