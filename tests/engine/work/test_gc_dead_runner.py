"""``spotwise gc`` after a runner died: it tells the dead owner from a live one, ends the dead
one's nodes and strays, closes its bills within the lease, marks it ``lost`` and settles its budget
— and touches nothing of a live job or of another ``SPOTWISE_HOME``.

Local "instances" here are plain ``sleep`` processes carrying a node's marker and recorded where
the local cloud records its instances: the local cloud cannot tell them from ``ray start``
(ending a node is ending its marked processes), and the test needs no Ray cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from spotwise.cli import main
from spotwise.provisioner.base import Node
from spotwise.provisioner.clouds.local.cloud import LocalCloud
from spotwise.engine.work import budgets
from spotwise.engine.state import db, lease

DEAD, LIVE = "swgcdead0001", "swgclive0001"
# Both database cases use these cluster ids (and their /tmp/sw-<id> folders) and gc ends what it
# finds by cluster id: they must never run at once (`make test` distributes by file, so one xdist
# worker runs this module's tests one after the other).


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def spawn(instance_id: str, home: Path) -> subprocess.Popen:
        env = dict(os.environ, SPOTWISE_LOCAL_INSTANCE=instance_id, SPOTWISE_HOME=str(home))
        p = subprocess.Popen(["sleep", "600"], env=env, start_new_session=True)
        started.append(p)
        return p
    yield spawn
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _record(instance_id: str, cluster: str, pid: int, launched_at: float) -> None:
    LocalCloud()._write(Node(cloud="local", instance_id=instance_id, instance_type="local.cpu", region="local",
                             zone="local-a", market="spot", usd_per_hour=3.6, cluster_id=cluster, job_id=cluster,
                             role="worker", launched_at=launched_at, extra={"pgid": pid}))


def _node_row(s, instance_id: str, job_id: str, cluster: str, launched_at: float, billed_until: float,
              market: str = "spot") -> None:
    s.add(db.NodeRecord(instance_id=instance_id, job_id=job_id, cluster_id=cluster, cloud="local",
                        instance_type="local.cpu", region="local", zone="local-a", market=market, role="worker",
                        usd_per_hour=3.6, price_source="t", price_as_of="t", launched_at=launched_at,
                        billed_until=billed_until))


def test_gc_reaps_the_dead_runners_job_and_spares_the_live_one(database, home, procs, tmp_path):
    now = time.time()
    me = lease.this_process()
    gone = subprocess.Popen(["true"])
    gone.wait()
    # the dead job: its runner exited; its nodes were told to end 100 s ago
    survivor = procs(f"{DEAD}-head-bbbbbb", home)             # switch failed: still running
    _record(f"{DEAD}-head-bbbbbb", DEAD, survivor.pid, now - 300)
    stray = procs(f"{DEAD}-worker-cccccc", home)               # a `ray start` whose launch was cut short: no record
    # the live job: owned by this very process, lease valid
    live_node = procs(f"{LIVE}-worker-dddddd", home)
    _record(f"{LIVE}-worker-dddddd", LIVE, live_node.pid, now - 50)
    live_stray = procs(f"{LIVE}-worker-eeeeee", home)
    # someone else's node of a cluster with the same id, in another SPOTWISE_HOME
    foreign = procs(f"{DEAD}-worker-ffffff", tmp_path / "elsewhere")
    tmp_dead, tmp_live = Path(LocalCloud.temp_dir_of(DEAD)), Path(LocalCloud.temp_dir_of(LIVE))
    for d in (tmp_dead, tmp_live):
        d.mkdir(exist_ok=True)
    budgets.create_budget("b", cap_usd=10.0, period="total")
    with db.locked_session() as s:
        s.add(db.Job(id="dead", name="d", status="running", cloud="local", cluster_id=DEAD, spec={},
                     created_at=now - 400, owner_pid=gone.pid, owner_host=me.host, owner_started="1",
                     lease_expires_at=now + 10, node_deadline=now - 100, budget_usd=1.0))
        s.add(db.Job(id="live", name="l", status="running", cloud="local", cluster_id=LIVE, spec={},
                     created_at=now - 60, owner_pid=me.pid, owner_host=me.host, owner_started=me.started,
                     lease_expires_at=now + 30, budget_usd=1.0))
        s.flush()
        _node_row(s, f"{DEAD}-worker-aaaaaa", "dead", DEAD, now - 300, now - 200)    # ended itself
        _node_row(s, f"{DEAD}-head-bbbbbb", "dead", DEAD, now - 300, now - 200)      # still running
        for iid in (f"{DEAD}-worker-aaaaaa", f"{DEAD}-head-bbbbbb"):                  # the disks they carry
            _node_row(s, f"{iid}/disk", "dead", DEAD, now - 300, now - 200, market="disk")
        budgets.reserve_in(s, "b", 1.0, job_id="dead")
    try:
        assert main(["gc", "--cloud", "local", "--format", "json"]) == 0
        with db.session() as s:
            dead, live = s.get(db.Job, "dead"), s.get(db.Job, "live")
            assert dead.status == "lost" and "no longer running" in dead.message
            assert live.status == "running"
            rows = {r.instance_id: r for r in s.query(db.NodeRecord)}
            assert all(r.terminated_at is not None for r in rows.values())
            # the node that ended itself: billed until its lease + the self-end allowance, not until now
            assert rows[f"{DEAD}-worker-aaaaaa"].billed_until == pytest.approx(now - 100 + lease.SELF_END_S, abs=1)
            # the one still running when found: until gc ended it
            assert rows[f"{DEAD}-head-bbbbbb"].billed_until >= now
            # what a node carries is billed as long as its node, not as a node of its own
            assert rows[f"{DEAD}-worker-aaaaaa/disk"].billed_until == rows[f"{DEAD}-worker-aaaaaa"].billed_until
            assert rows[f"{DEAD}-head-bbbbbb/disk"].billed_until >= now
            spend = db.job_spend(s, "dead")
            r = s.query(db.BudgetReservation).one()
            assert r.state == "committed" and r.actual_usd == pytest.approx(spend) and spend <= r.amount_usd
        for p in (survivor, stray):
            p.wait(timeout=30)                 # ended (gc may have reaped our child itself: any status)
        assert not tmp_dead.exists()
        assert live_node.poll() is None and live_stray.poll() is None and tmp_live.exists()
        assert foreign.poll() is None, "gc ended a process of another SPOTWISE_HOME"
        assert main(["gc", "--cloud", "local", "--format", "json"]) == 0           # once only: nothing more billed
        with db.session() as s:
            assert db.job_spend(s, "dead") == pytest.approx(spend)
    finally:
        for d in (tmp_dead, tmp_live):
            if d.exists():
                d.rmdir()


def test_gc_dry_run_names_dead_jobs_and_changes_nothing(database, home, capsys):
    now = time.time()
    with db.session() as s:
        s.add(db.Job(id="dead", name="d", status="running", cloud="local", cluster_id=DEAD, spec={},
                     created_at=now, owner_pid=1, owner_host="other/boot", lease_expires_at=now - 1))
        s.commit()
    assert main(["gc", "--cloud", "local", "--dry-run", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [j["job_id"] for j in out["jobs"]] == ["dead"]
    with db.session() as s:
        assert s.get(db.Job, "dead").status == "running"
