"""The runner's lease on its job (in the database) and the node lease it pushes to its cluster.

Two promises hold when the process that runs a job (``spotwise launch``, or the service's
``python -m spotwise.engine.work.runner``) dies, SIGKILL included:

1. **Nodes end themselves.** While it runs, the runner pushes a *node lease* to the head every
   :data:`RENEW_S` seconds (``POST /v1/lease``); every node's watcher ends its node when the lease
   passes (:mod:`spotwise.runtime.node.deadman`). The lease is
   ``min(now + NODE_LEASE_S, the time the remaining budget runs out at the cluster's burn rate
   - SELF_END_S)``, so a node outlives its runner by at most :data:`NODE_LEASE_S` (+ the time it
   takes to end, :data:`SELF_END_S`) and never past the money.
2. **Someone else can tell, and clean up.** The job row names its owner (host + boot id, pid,
   the pid's start time, so a reused pid is not mistaken for it) and a lease expiry the runner
   renews every :data:`RENEW_S` seconds (:data:`DB_LEASE_S` ahead). :func:`owner_state` says
   whether that owner is alive, dead, or cannot be told; ``gc``, ``serve`` and the next
   ``launch`` reap dead owners' jobs (:func:`spotwise.engine.work.jobs.reconcile`).

The node lease is also written to the job row (``node_deadline``) *before* it is pushed, and
never lower than the last one the nodes acknowledged, so whoever reaps the job knows the latest
time any node may have run to: bills close at ``min(now, node_deadline + SELF_END_S)`` for nodes
already gone, which is within the budget by construction.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sqlalchemy import update

from spotwise.config import setting, where
from spotwise.engine.state import db

log = logging.getLogger("spotwise.lease")

RENEW_S = 5.0            # the runner renews both leases this often
DB_LEASE_S = 30.0        # a runner that has not renewed its job's lease for this long is dead
NODE_LEASE_S = 60.0      # nodes end themselves this long after the last renewal they heard
NODE_LEASE_ENV = "SPOTWISE_NODE_LEASE_S"   # an operator's (or a test's) own term, within the bounds below
NODE_LEASE_BOUNDS_S = (15.0, 3600.0)       # >= 3 renewals (a late renewal must not end a healthy node)
SELF_END_S = 10.0        # allowance for a node to be gone once its lease passes: the watcher knows the
                         # deadline in advance (checks twice a second), then kills its node / shuts down
ROUNDING_S = 2.0         # per-second billing rounds each node's last second up: keep this much in hand


@dataclass(frozen=True, slots=True)
class Owner:
    """A process that can own a job: ``host`` is the hostname plus the kernel's boot id (a
    rebooted machine is another host: nothing of the old boot is alive); ``started`` the pid's
    start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""

    host: str
    pid: int
    started: str | None


def host_id() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


def process_started(pid: int) -> str | None:
    """Start time of ``pid`` (clock ticks since boot), or None when no such live process exists."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":             # dead, waiting to be reaped
        return None
    return fields[19]                # field 22 of stat; fields[0] is field 3


def this_process() -> Owner:
    return Owner(host=host_id(), pid=os.getpid(), started=process_started(os.getpid()))


def owner_state(job: db.Job, now: float | None = None) -> tuple[str, str]:
    """``("alive" | "dead" | "unknown", why)`` for the owner of a pending/running job.

    Dead: its lease has expired, or it ran on this host and its pid is gone (or now belongs to a
    process started at another time). Unknown (treated as alive by every caller): no lease and an
    owner on another host, or no owner recorded at all (a cluster brought up with ``spotwise
    up``). A job recorded before leases existed (pid only) is judged by its pid, as before.
    """
    now = time.time() if now is None else now
    if job.lease_expires_at is not None and now > job.lease_expires_at:
        return "dead", f"its runner's lease expired {now - job.lease_expires_at:.0f} s ago"
    if job.owner_pid and (job.owner_host is None or job.owner_host == host_id()):
        started = process_started(job.owner_pid)
        if started is None:
            return "dead", f"its runner (pid {job.owner_pid}) is no longer running on this host"
        if job.owner_started is not None and started != job.owner_started:
            return "dead", f"its runner (pid {job.owner_pid}) is gone; the pid now belongs to another process"
        return "alive", f"its runner (pid {job.owner_pid}) is running on this host"
    if job.lease_expires_at is not None:
        return "alive", f"its runner on {job.owner_host} renewed its lease until {job.lease_expires_at:.0f}"
    return "unknown", "no lease and no owner on this host"


def node_deadline(now: float, *, spend_usd: float, rate_usd_per_hour: float, budget_usd: float | None,
                  term_s: float = NODE_LEASE_S) -> float:
    """The time the nodes must end by: ``term_s`` from now, but never later than the remaining
    budget lasts at the current burn rate, less the nodes' self-end allowance and a rounding
    margin (so nodes billed up to ``deadline + SELF_END_S`` stay within the budget)."""
    deadline = now + term_s
    if budget_usd is not None and rate_usd_per_hour > 0:
        left_s = (budget_usd - spend_usd) / rate_usd_per_hour * 3600.0
        deadline = min(deadline, now + left_s - SELF_END_S - ROUNDING_S)
    return deadline


def node_lease_s() -> float:
    """The node lease's term: :data:`NODE_LEASE_S`, or ``$SPOTWISE_NODE_LEASE_S`` within
    :data:`NODE_LEASE_BOUNDS_S`. Shorter ends a dead runner's nodes (and their bill) sooner; longer
    rides out a runner that is slow to renew. Anything else is refused, naming the variable."""
    from spotwise.errors import InputError, Problem

    raw = setting(NODE_LEASE_ENV)
    if raw is None or raw == "":
        return NODE_LEASE_S
    lo, hi = NODE_LEASE_BOUNDS_S
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not lo <= v <= hi:                       # NaN fails this too
        raise InputError(Problem(where(NODE_LEASE_ENV), raw, f"seconds from {lo:g} to {hi:g}"), source="environment")
    return v


class RunnerLease:
    """Holds a job's lease for the process that runs it.

    :meth:`claim` records this process as the owner; :meth:`start` renews every ``renew_s`` in a
    daemon thread (so a runner busy provisioning or waiting for a boot still renews — and one that
    is SIGKILLed stops renewing at once). Once :meth:`attach` gives it a way to reach the nodes
    (``push(expires_at)``) and the money (``money() -> (spend_usd, rate_usd_per_hour)``), each
    renewal also computes the node lease (:func:`node_deadline`), records it, then pushes it.
    :meth:`stop` ends the renewals (the job's final status is the caller's to write).

    A push that fails is expected for a while — the job's control endpoint is not up until its
    driver starts, and a migration's new head boots the same way — so it is retried each period
    without a word (logged at debug). Only a streak of failures longer than ``quiet_s`` (half the
    node lease's term: 30 s) says one sentence, once per streak, of what it means for the run:
    when the nodes end themselves unless a push gets through (issue 51).
    """

    def __init__(self, job_id: str, *, budget_usd: float | None = None, renew_s: float = RENEW_S,
                 db_term_s: float = DB_LEASE_S, node_term_s: float = NODE_LEASE_S) -> None:
        self.job_id, self.budget_usd = job_id, budget_usd
        self.renew_s, self.db_term_s, self.node_term_s = renew_s, db_term_s, node_term_s
        self.owner = this_process()
        self._push: Callable[[float], object] | None = None
        self._money: Callable[[], tuple[float, float]] | None = None
        self._acked: float | None = None      # the latest node lease the head accepted
        self.quiet_s = node_term_s / 2         # a push failing longer than this is said, once
        self._heard: float | None = None       # the latest lease this cluster's head accepted (since attach)
        self._failing_since: float | None = None
        self._said = False                     # the current streak of failed pushes was reported
        self._stop = threading.Event()
        self._t: threading.Thread | None = None
        self._lock = threading.Lock()
        self.lost = False                      # the row was reaped (marked lost) while we ran

    def claim(self, now: float | None = None) -> None:
        now = time.time() if now is None else now

        def do(s):
            s.execute(update(db.Job).where(db.Job.id == self.job_id).values(
                owner_host=self.owner.host, owner_pid=self.owner.pid, owner_started=self.owner.started,
                lease_expires_at=now + self.db_term_s))
        db.write(do)

    def attach(self, *, push: Callable[[float], object], money: Callable[[], tuple[float, float]]) -> None:
        with self._lock:
            self._push, self._money = push, money
            self._heard, self._failing_since, self._said = None, None, False   # a new head: it comes up first
        self.renew()      # the nodes hear the real lease at once, not one period later

    def renew(self, now: float | None = None) -> float | None:
        """One renewal: the database lease, then (when attached) the node lease. Returns the node
        lease pushed, or None."""
        with self._lock:
            now = time.time() if now is None else now
            deadline = None
            if self._money is not None:
                spend, rate = self._money()
                deadline = node_deadline(now, spend_usd=spend, rate_usd_per_hour=rate,
                                         budget_usd=self.budget_usd, term_s=self.node_term_s)
            recorded = deadline if self._acked is None or deadline is None else max(deadline, self._acked)

            def do(s):
                values = {"lease_expires_at": now + self.db_term_s}
                if recorded is not None:
                    values["node_deadline"] = recorded
                return s.execute(update(db.Job).where(
                    db.Job.id == self.job_id, db.Job.owner_pid == self.owner.pid,
                    db.Job.owner_host == self.owner.host, db.Job.status.in_(("pending", "running")))
                    .values(**values)).rowcount
            if db.write(do) == 0 and not self.lost:
                self.lost = True
                log.error("job %s is no longer ours (reaped as lost, or finished): not renewing", self.job_id)
            if deadline is None or self._push is None or self.lost:
                return None
            try:
                self._push(deadline)
            except Exception as e:  # noqa: BLE001 - the nodes keep the last lease; retried next period
                self._push_failed(now, e)
                return None
            if self._said and self._failing_since is not None:
                log.warning("the node lease reached the head again after %.0f s", now - self._failing_since)
            self._acked = self._heard = deadline
            self._failing_since, self._said = None, False
            return deadline

    def _push_failed(self, now: float, e: Exception) -> None:
        """Retried next period; said once when the streak passes :attr:`quiet_s`."""
        if self._failing_since is None:
            self._failing_since = now
        streak = now - self._failing_since
        log.debug("could not push the node lease (failing for %.0f s; retried in %.0f s): %s", streak, self.renew_s, e)
        if self._said or streak < self.quiet_s:
            return
        self._said = True
        if self._heard is not None:
            at = time.strftime("%H:%M:%SZ", time.gmtime(self._heard))
            then = (f"the nodes end themselves at {at}, in {max(0.0, self._heard - now):.0f} s, when the last "
                    "lease they heard passes")
        else:
            from spotwise.runtime.node.deadman import BOOT_LEASE_S

            then = (f"the nodes have heard no lease from this run yet and end themselves {BOOT_LEASE_S:.0f} s "
                    "after they booted")
        log.warning("the head has not taken the node lease for %.0f s (%s): unless a push gets through, %s",
                    streak, e, then)

    def start(self) -> "RunnerLease":
        def loop():
            while not self._stop.wait(self.renew_s):
                try:
                    self.renew()
                except Exception:  # noqa: BLE001 - a database hiccup: the next period tries again
                    log.exception("lease renewal failed")

        self._t = threading.Thread(target=loop, name="runner-lease", daemon=True)
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._t is not None and self._t is not threading.current_thread():
            self._t.join(timeout=30)


def bill_end(*, now: float, gone: bool, launched_at: float, node_deadline_at: float | None) -> float:
    """Until when a dead owner's open node is billed: ``now`` when it was still running when
    reaped (it was ended just now); otherwise no later than its lease let it run — the recorded
    node lease, or its boot lease when none was ever recorded — plus the self-end allowance."""
    if not gone:
        return now
    from spotwise.runtime.node.deadman import BOOT_LEASE_S

    limit = node_deadline_at if node_deadline_at is not None else launched_at + BOOT_LEASE_S
    return min(now, limit + SELF_END_S)
