"""The runner's lease (database) and the node lease (dead man's switch), piece by piece.

The end-to-end proof — SIGKILL the runner of a real local cluster — is
``tests/e2e/test_kill_runner.py``; these pin down each rule it relies on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from spotwise.runtime.node.deadman import Switch, decode_lease, encode_lease
from spotwise.engine.state import db, lease


def _job(job_id="j1", **kw) -> db.Job:
    return db.Job(id=job_id, name="t", status=kw.pop("status", "running"), cloud="local", cluster_id="swlease0000",
                  spec={}, created_at=time.time(), **kw)


# -- who owns a job, and is it alive ------------------------------------------------------------------
def test_owner_state_tells_dead_from_live():
    me = lease.this_process()
    now = time.time()
    alive = _job(owner_host=me.host, owner_pid=me.pid, owner_started=me.started, lease_expires_at=now + 30)
    assert lease.owner_state(alive, now)[0] == "alive"
    expired = _job(owner_host=me.host, owner_pid=me.pid, owner_started=me.started, lease_expires_at=now - 1)
    assert lease.owner_state(expired, now) == ("dead", "its runner's lease expired 1 s ago")
    # a pid that no longer runs, on this host
    p = subprocess.Popen(["true"])
    p.wait()
    gone = _job(owner_host=me.host, owner_pid=p.pid, owner_started="123", lease_expires_at=now + 30)
    assert lease.owner_state(gone, now)[0] == "dead"
    # our own pid, but started at another time: a reused pid is not the owner
    reused = _job(owner_host=me.host, owner_pid=me.pid, owner_started="1", lease_expires_at=now + 30)
    state, why = lease.owner_state(reused, now)
    assert state == "dead" and "another process" in why
    # another host: only its lease can tell
    elsewhere = _job(owner_host="other/boot", owner_pid=me.pid, owner_started="1", lease_expires_at=now + 30)
    assert lease.owner_state(elsewhere, now)[0] == "alive"
    assert lease.owner_state(_job(owner_host="other/boot", owner_pid=1, lease_expires_at=now - 5), now)[0] == "dead"
    assert lease.owner_state(_job(owner_host="other/boot", owner_pid=1), now)[0] == "unknown"
    # `spotwise up` pseudo-jobs record no owner: never reaped
    assert lease.owner_state(_job(), now)[0] == "unknown"
    # rows from before leases (pid only) are judged by the pid, as `serve` always did
    assert lease.owner_state(_job(owner_pid=p.pid), now)[0] == "dead"
    assert lease.owner_state(_job(owner_pid=me.pid), now)[0] == "alive"


def test_node_deadline_is_the_term_or_the_budget_whichever_comes_first():
    now = 1000.0
    assert lease.node_deadline(now, spend_usd=0, rate_usd_per_hour=3.6, budget_usd=None, term_s=60) == 1060
    assert lease.node_deadline(now, spend_usd=0, rate_usd_per_hour=3.6, budget_usd=100, term_s=60) == 1060
    # $0.10 left at $3.60/h = 100 s of burn; the nodes must be gone (SELF_END_S later) before it runs out
    d = lease.node_deadline(now, spend_usd=0.9, rate_usd_per_hour=3.6, budget_usd=1.0, term_s=600)
    assert d == pytest.approx(now + 100 - lease.SELF_END_S - lease.ROUNDING_S)
    # billed until deadline + SELF_END_S (+ a rounded-up second per node) stays within the budget
    assert 0.9 + (d + lease.SELF_END_S + 1 - now) * 3.6 / 3600 <= 1.0
    # already over: the deadline is in the past, the nodes end at once
    assert lease.node_deadline(now, spend_usd=1.0, rate_usd_per_hour=3.6, budget_usd=1.0) < now


def test_the_node_lease_term_is_60_s_or_the_operators_within_bounds(monkeypatch):
    from spotwise.errors import InputError

    monkeypatch.delenv(lease.NODE_LEASE_ENV, raising=False)
    assert lease.node_lease_s() == lease.NODE_LEASE_S == 60.0
    monkeypatch.setenv(lease.NODE_LEASE_ENV, "20")
    assert lease.node_lease_s() == 20.0
    for bad in ("5", "nan", "inf", "soon", "-30", "7200"):
        monkeypatch.setenv(lease.NODE_LEASE_ENV, bad)
        with pytest.raises(InputError, match="SPOTWISE_NODE_LEASE_S.*seconds from 15 to 3600"):
            lease.node_lease_s()


def test_bill_end_of_a_reaped_node():
    assert lease.bill_end(now=500, gone=False, launched_at=0, node_deadline_at=100) == 500   # ended just now
    assert lease.bill_end(now=500, gone=True, launched_at=0, node_deadline_at=100) == 100 + lease.SELF_END_S
    assert lease.bill_end(now=50, gone=True, launched_at=0, node_deadline_at=100) == 50
    # never told a lease: its boot lease bounds it
    from spotwise.runtime.node.deadman import BOOT_LEASE_S

    assert lease.bill_end(now=10_000, gone=True, launched_at=0, node_deadline_at=None) == BOOT_LEASE_S + lease.SELF_END_S


# -- the runner renews both leases ---------------------------------------------------------------------
def test_runner_lease_claims_renews_and_records_before_pushing(database):
    with db.session() as s:
        s.add(_job(budget_usd=1.0))
        s.commit()
    rl = lease.RunnerLease("j1", budget_usd=1.0, db_term_s=30, node_term_s=60)
    rl.claim(now=1000.0)
    with db.session() as s:
        j = s.get(db.Job, "j1")
        assert (j.owner_pid, j.owner_host, j.owner_started) == (os.getpid(), lease.host_id(), rl.owner.started)
        assert j.lease_expires_at == 1030.0 and j.node_deadline is None
    pushed, seen_in_db = [], []

    def push(expires_at):
        with db.session() as s:                  # recorded before it reaches the nodes
            seen_in_db.append(s.get(db.Job, "j1").node_deadline)
        pushed.append(expires_at)

    rl._push, rl._money = push, lambda: (0.0, 3.6)
    assert rl.renew(now=2000.0) == 2060.0 and pushed == [2060.0] and seen_in_db == [2060.0]

    def refuse(expires_at):
        raise OSError("head unreachable")
    rl._push = refuse
    assert rl.renew(now=1990.0) is None          # the nodes keep 2060: the record must not go below it
    with db.session() as s:
        j = s.get(db.Job, "j1")
        assert j.node_deadline == 2060.0 and j.lease_expires_at == 2020.0
    rl._push = push
    assert rl.renew(now=2100.0) == 2160.0
    with db.session() as s:
        assert s.get(db.Job, "j1").node_deadline == 2160.0


def test_runner_lease_stops_renewing_a_job_that_was_reaped(database):
    with db.session() as s:
        s.add(_job())
        s.commit()
    rl = lease.RunnerLease("j1")
    rl.claim()
    with db.session() as s:
        s.get(db.Job, "j1").status = "lost"
        s.commit()
    rl._push, rl._money = (lambda d: pytest.fail("pushed a lease for a job that is no longer ours")), (lambda: (0, 1))
    assert rl.renew() is None and rl.lost


# -- the node side -------------------------------------------------------------------------------------
def test_switch_fires_on_expiry_or_when_the_head_stops_answering():
    sw = Switch(deadline=1300.0, unreachable_s=60)                  # watcher started at 1000, boot lease to 1300
    assert sw.expired(1030.0) is None
    assert sw.expired(1200.0) is None                                # head still booting: only the boot lease counts
    sw.heard(None, 1250.0)                                          # head up, no lease pushed yet: boot lease holds
    assert sw.expired(1280.0) is None and not sw.leased
    assert "has not answered for 60 s" in Switch(1300.0, 1000.0, 60).expired(1060.0)   # up, then gone
    assert "boot lease" in Switch(1300.0, None, 60).expired(1300.0)  # a head that never came up
    sw = Switch(deadline=1300.0, last_contact=1050.0, unreachable_s=60)
    assert sw.expired(1100.0) is None and not sw.leased
    sw.heard(1120.0, 1100.0)                                        # the runner's lease replaces the boot lease
    assert sw.leased and sw.expired(1119.0) is None
    assert "runner's lease expired" in sw.expired(1120.0)
    sw.heard(1080.0, 1110.0)                                        # the budget tightened: it may move earlier
    assert sw.expired(1090.0)


def test_lease_wire_format_refuses_non_finite_times():
    assert decode_lease(encode_lease(123.5)) == 123.5
    assert decode_lease(None) is None and decode_lease(b"junk") is None and decode_lease(b'{"expires_at": "NaN"}') is None
    with pytest.raises(ValueError, match="expires_at"):
        encode_lease(float("nan"))


def test_control_endpoint_stores_the_lease_for_the_nodes():
    from spotwise.runtime.node.job import ControlClient, ControlServer

    stored = []
    srv = ControlServer(None, host="127.0.0.1", port=0, token="tok", lease_store=stored.append).start()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        assert ControlClient(url, "tok").renew_lease(1234.5) == {"expires_at": 1234.5}
        assert decode_lease(stored[-1]) == 1234.5
        for body in (b'{"expires_at": NaN}', b'{}', b'{"expires_at": "soon"}'):
            req = urllib.request.Request(f"{url}/v1/lease", data=body, method="POST",
                                         headers={"Authorization": "Bearer tok"})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=5)
            assert e.value.code == 400 and b"expires_at" in e.value.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            ControlClient(url, "wrong").renew_lease(1.0)
        assert e.value.code == 401
        assert len(stored) == 1
    finally:
        srv.stop()


def test_watcher_ends_its_local_node_when_the_lease_has_passed(tmp_path):
    """The real watcher process, armed with a lease already past and no head to ask: it ends every
    process of its node (same marker), itself last — and nothing else."""
    marker = f"swlease{os.getpid()}-worker-abc"
    env = dict(os.environ, SPOTWISE_LOCAL_INSTANCE=marker)
    node = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], env=dict(env, SPOTWISE_LOCAL_INSTANCE=marker + "x"),
                             start_new_session=True)
    try:
        w = subprocess.run([sys.executable, "-m", "spotwise.runtime.node.watch", "--cloud", "aws",
                            "--metadata-url", "http://127.0.0.1:9", "--instance-id", marker,
                            "--gcs-address", "127.0.0.1:9", "--lease-deadline", str(time.time() - 1),
                            "--self-end", "local"], env=env, capture_output=True, text=True, timeout=120)
        assert w.returncode == 0, w.stderr[-2000:]
        assert "dead man's switch: ending this node" in w.stderr
        assert node.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None, "a process of another node was ended"
    finally:
        for p in (node, other):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_watcher_refuses_a_non_finite_lease():
    from spotwise.runtime.node.watch import main

    assert main(["--cloud", "aws", "--instance-id", "i", "--gcs-address", "127.0.0.1:9",
                 "--lease-deadline", "nan"]) == 1


def test_a_push_the_head_is_not_up_for_is_retried_silently_and_said_once_past_half_the_term(database, caplog):
    """Issue 51: ``could not push the node lease: <urlopen error [Errno 111] Connection refused>``
    was printed at every renewal while the job's control endpoint came up. Now a failing push is
    retried each period without a word; a streak longer than half the node lease's term (30 s) is
    one sentence — when the nodes end themselves — and its end another."""
    import logging

    with db.session() as s:
        s.add(_job())
        s.commit()
    rl = lease.RunnerLease("j1", node_term_s=60)
    rl.claim(now=1000.0)
    up = {"ok": False}

    def push(expires_at):
        if not up["ok"]:
            raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    rl._push, rl._money = push, lambda: (0.0, 3.6)

    def said(now: float) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="spotwise.lease"):
            rl.renew(now=now)
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    assert [said(1000.0 + 5 * i) for i in range(6)] == [[]] * 6            # 0..25 s: coming up, silent
    [first] = said(1030.0)
    assert "for 30 s" in first and "Connection refused" in first and "heard no lease" in first and "300 s" in first
    assert said(1035.0) == []                                              # once per streak
    up["ok"] = True
    assert said(1040.0) == ["the node lease reached the head again after 40 s"]
    assert said(1045.0) == []                                              # heard: 1105
    up["ok"] = False
    assert [said(1050.0 + 5 * i) for i in range(6)] == [[]] * 6
    [again] = said(1080.0)
    assert "for 30 s" in again and "end themselves at" in again and "in 25 s" in again
    # a new head (a migration): its coming up is expected again, and it has heard no lease yet
    t = time.time()
    rl.attach(push=push, money=lambda: (0.0, 3.6))                         # its first push fails at once
    assert said(t + 29) == []
    [new_head] = said(t + 31)
    assert "heard no lease" in new_head
