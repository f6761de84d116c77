"""Jobs the service launches: recorded first, then run in a process of their own.

Why a process per job: the orchestrator drives one Ray cluster through the process-global
``ray.init``, blocks for the whole run, and must survive a restart of ``spotwise serve``. So a
launch (:func:`create_job`) writes the job row — id, cluster id, spec, budget, ``owner_pid`` — in
the caller's transaction *before* anything starts, and :class:`ProcessLauncher` then starts
``python -m spotwise.engine.work.runner JOB_ID`` in a new session; the runner takes ownership
(``owner_pid`` = its own pid). A job id exists before its launch, so a restarted scheduler sees the
fire time as handled and never launches it twice. The runner holds a lease on its job
(:mod:`spotwise.engine.state.lease`); :func:`reconcile` — run by ``spotwise gc``, by ``serve`` at start
and every minute, and by every ``spotwise launch`` before it starts — ends the jobs whose owner is
dead (see there).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotwise.errors import InputError, Problem, SpotwiseError
from spotwise.paths import home
from spotwise.engine.state import db
from spotwise.taskspec import TaskSpec, parse_taskspec, task_doc
from spotwise.utils.procs import pid_alive as process_alive

log = logging.getLogger("spotwise.engine.work.jobs")

LIVE = ("pending", "running")
TERMINAL = ("succeeded", "budget_exhausted", "failed", "cancelled", "lost")


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def spec_with(task: dict | TaskSpec, *, budget_usd: float | None = None, deadline_hours: float | None = None,
              source: str = "task") -> TaskSpec:
    """The task with the launch's budget/deadline written into it (they override the file's)."""
    data = task_doc(task) if isinstance(task, TaskSpec) else dict(task)
    if budget_usd is not None:
        data["budget_usd"] = budget_usd
    if deadline_hours is not None:
        data["deadline_hours"] = deadline_hours
    return parse_taskspec(data, source=source)


def create_job(s: Session, spec: TaskSpec, *, owner_pid: int | None = None) -> db.Job:
    """Add a ``pending`` job row to ``s`` (the caller commits, with whatever else it records)."""
    from spotwise.engine.state.lease import this_process

    me = this_process()
    mine = owner_pid is None or owner_pid == me.pid
    job = db.Job(id=new_job_id(spec.name), name=spec.name, status="pending",
                 cloud=",".join(spec.resources.clouds) or "local",
                 cluster_id=f"sw{uuid.uuid4().hex[:10]}", spec=task_doc(spec),
                 budget_usd=spec.budget_usd, deadline_hours=spec.deadline_hours, created_at=time.time(),
                 owner_pid=me.pid if mine else owner_pid, owner_host=me.host,
                 owner_started=me.started if mine else None, steps_completed=0, preemptions=0, resumes=0)
    s.add(job)
    s.flush()
    return job


def submit(spec: TaskSpec, *, budget_id: str | None = None) -> str:
    """Record a ``pending`` job for ``spec`` and return its id (the caller hands it to a launcher).

    With ``budget_id``, the run's cap (``spec.budget_usd``, required then) is reserved against that
    budget in the same transaction as the job row, so a refused reservation
    (:class:`~spotwise.engine.work.budgets.BudgetExceeded`) records no job and a recorded job always
    holds its money."""
    from spotwise.engine.work import budgets

    cap = spec.budget_usd
    if budget_id and cap is None:
        raise InputError(Problem("budget_usd", None, "a per-run cap (here or in the task) when budget_id is given"))
    with db.locked_session() as s:
        res = budgets.reserve_in(s, budget_id, cap) if budget_id and cap is not None else None
        job = create_job(s, spec)
        if res is not None:
            res.job_id = job.id
        return job.id


def log_path(job_id: str) -> Path:
    """Where the job's runner writes its stdout and stderr (:class:`ProcessLauncher`)."""
    return home() / "jobs" / f"{job_id}.log"


def log_tail(job_id: str, lines: int) -> list[str]:
    """The last ``lines`` lines of the runner's log; none when it has not written one."""
    p = log_path(job_id)
    return p.read_text(errors="replace").splitlines()[-lines:] if p.is_file() else []


class ProcessLauncher:
    """Starts each job's runner in a new session; keeps the handles to reap them."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def __call__(self, job_id: str) -> int:
        path = log_path(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as out:
            p = subprocess.Popen([self.python, "-m", "spotwise.engine.work.runner", job_id], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                 env=dict(os.environ))
        with self._lock:
            self._procs[job_id] = p
        return p.pid

    def poll(self) -> dict[str, int]:
        """Reap finished runners; returns {job_id: exit code} of those that ended."""
        done = {}
        with self._lock:
            for jid, p in list(self._procs.items()):
                rc = p.poll()
                if rc is not None:
                    done[jid] = rc
                    del self._procs[jid]
        return done

    def running(self) -> list[str]:
        with self._lock:
            return list(self._procs)


def cancel(job_id: str) -> str:
    """Ask a job to stop: SIGINT to its runner (the orchestrator tears the cluster down and records
    ``cancelled``); a pending job whose runner never started is marked cancelled at once."""
    with db.locked_session() as s:
        job = db.lock_row(s, db.Job, job_id)
        if job is None:
            raise InputError(Problem("job_id", job_id, "the id of an existing job"), source="cancel")
        if job.status not in LIVE:
            raise InputError(Problem("job_id", job_id, f"a pending or running job (this one is {job.status})"),
                             source="cancel")
        pid = job.owner_pid
        runner = pid is not None and pid != os.getpid() and process_alive(pid)
        if not runner:
            job.status, job.message, job.finished_at = "cancelled", "cancelled before it started", time.time()
    if runner:
        os.kill(pid, signal.SIGINT)
        return "stopping"
    from spotwise.engine.work.budgets import settle_job

    settle_job(job_id)
    return "cancelled"


def end_job_resources(job: db.Job, *, now: float | None = None) -> dict:
    """End a dead job's cluster on every cloud it may use and close its open bills, each node once
    (marked terminated in the same transaction as its last ledger row).

    A node still running when found is ended now and billed until now. A node already gone was
    ended by its dead man's switch: it is billed until its lease let it run
    (:func:`spotwise.engine.state.lease.bill_end`), which the runner kept within the budget. Raises
    :class:`SpotwiseError` when a cloud of the job cannot be asked (nothing is billed or marked
    then: the next pass tries again)."""
    from spotwise.provisioner import reconcile as sweeper
    from spotwise.engine.state.lease import bill_end

    now = now or time.time()
    clouds = [c for c in (job.cloud or "local").split(",") if c in sweeper.known_clouds()] or ["local"]
    ended: list = []
    extra: list[str] = []
    if job.cluster_id:
        sweep = sweeper.down(job.cluster_id, clouds=clouds)
        if sweep.skipped:
            raise SpotwiseError(f"job {job.id}: could not ask {', '.join(f'{k} ({v})' for k, v in sweep.skipped.items())}")
        ended, extra = sweep.ended, sweep.extra_deleted
    alive = {n.instance_id for n in ended}

    def bill(s) -> float:
        billed = 0.0
        rows = s.scalars(select(db.NodeRecord).where(db.NodeRecord.job_id == job.id,
                                                     db.NodeRecord.terminated_at.is_(None)).with_for_update()).all()
        for r in rows:
            # what a node carried (``<instance id>/disk``, ``/ipv4``) ends with its node
            end = bill_end(now=now, gone=r.instance_id.split("/")[0] not in alive, launched_at=r.launched_at,
                           node_deadline_at=job.node_deadline)
            secs = max(0, int(-(-(end - r.billed_until) // 1)))
            if secs > 0:
                usd = secs * r.usd_per_hour / 3600.0
                s.add(db.LedgerEntry(job_id=job.id, instance_id=r.instance_id, cloud=r.cloud, market=r.market,
                                     start=r.billed_until, end=r.billed_until + secs, seconds=secs,
                                     usd_per_hour=r.usd_per_hour, usd=usd, price_source=r.price_source,
                                     price_as_of=r.price_as_of))
                billed += usd
                r.billed_until = r.billed_until + secs
            r.terminated_at, r.end_reason = max(r.billed_until, min(end, now)), "reconciled"
        return billed
    billed = db.write(bill)
    return {"nodes_ended": len(ended), "leftovers": extra, "billed_usd": round(billed, 6)}


def reconcile(*, now: float | None = None) -> list[dict]:
    """Jobs marked pending/running whose owner is dead (:func:`spotwise.engine.state.lease.owner_state`:
    lease expired, or the owner process on this host is gone): end their clusters, close their
    bills, mark them ``lost`` (a running job; ``spotwise resume`` continues it from its last
    checkpoint — spotwise does not resume it by itself) or ``failed`` (a pending job that never
    started; a resume that never started goes back to the status it had:
    :func:`spotwise.engine.work.resume.revert`), settle their budgets.
    Jobs whose owner is alive or cannot be told are left alone. Safe to run from several processes
    at once: each node is billed once, each job marked once."""
    from spotwise.engine.work.budgets import settle_job
    from spotwise.engine.state.lease import owner_state

    with db.session() as s:
        jobs = s.scalars(select(db.Job).where(db.Job.status.in_(LIVE))).all()
    out = []
    for job in jobs:
        state, why = owner_state(job, now)
        if state != "dead":
            continue
        try:
            res = end_job_resources(job, now=now)
        except SpotwiseError as e:
            log.warning("job %s is dead (%s) but could not be cleaned up yet: %s", job.id, why, e)
            continue

        def mark(s) -> str | None:
            from spotwise.engine.work import resume

            j = db.lock_row(s, db.Job, job.id)
            if j is None or j.status not in LIVE:
                return None
            if resume.is_resumption(j):
                return resume.revert(s, j, why)
            if j.status == "running":
                j.status = "lost"
                j.message = (f"lost: {why}; its nodes were ended and their bills closed; `spotwise resume {j.id}` "
                             f"continues it from its last checkpoint ({j.final_checkpoint or 'see its storage'})")
            else:
                j.status, j.message = "failed", f"never started: {why}"
            j.finished_at = time.time()
            return j.status
        status = db.write(mark)
        if status is None:
            continue
        settle_job(job.id)
        finish_schedule_runs()
        out.append({"job_id": job.id, "status": status, "why": why, **res})
        log.warning("reconciled job %s: %s", job.id, out[-1])
    return out


def finish_schedule_runs() -> int:
    """Mark ``launched`` schedule runs whose job has ended as ``finished`` and settle budgets."""
    from spotwise.engine.work.budgets import settle_job

    with db.session() as s:
        rows = s.execute(select(db.ScheduleRun.id, db.ScheduleRun.job_id, db.Job.status).join(
            db.Job, db.Job.id == db.ScheduleRun.job_id).where(db.ScheduleRun.status == "launched")).all()
    n = 0
    for run_id, job_id, status in rows:
        if job_id is not None and status in TERMINAL:   # (the inner join already drops runs without a job)
            settle_job(job_id)
            with db.locked_session() as s:
                r = s.get(db.ScheduleRun, run_id)
                if r is not None and r.status == "launched":
                    r.status, r.reason = "finished", f"job {status}"
                    n += 1
    return n


def run_job(job_id: str) -> dict:
    """The runner's body: run a recorded job with the orchestrator, as its owner. A resumed job
    (:mod:`spotwise.engine.work.resume`: pending again after it ran) runs as the same job, its
    ledger and cap carried over; a resume the orchestrator refuses goes back to its earlier status."""
    from spotwise.engine.work.budgets import settle_job
    from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator

    from spotwise.engine.work import resume
    from spotwise.engine.state.lease import DB_LEASE_S, this_process

    me = this_process()

    def take(s):
        job = db.lock_row(s, db.Job, job_id)
        if job is None:
            raise SpotwiseError(f"no job {job_id!r}")
        if job.status != "pending":
            raise SpotwiseError(f"job {job_id} is {job.status}, not pending; not starting it again")
        job.owner_pid, job.owner_host, job.owner_started = me.pid, me.host, me.started
        job.lease_expires_at = time.time() + DB_LEASE_S
        resuming = resume.is_resumption(job)
        job.started_at, job.status = job.started_at or time.time(), "running"
        return parse_taskspec(job.spec, source=f"job {job_id}"), job.budget_usd, job.cluster_id, resuming
    spec, budget, cluster_id, resuming = db.write(take)
    report: dict = {"job_id": job_id, "status": "failed"}
    try:
        # the task's own clouds (a schedule may name any cloud); the local cloud when it names none
        try:
            orch = Orchestrator(spec, LaunchOptions(budget_usd=budget), job_id=job_id, cluster_id=cluster_id,
                                resume=resuming)
        except SpotwiseError as refused:
            if not resuming:
                raise
            why = str(refused).splitlines()[0]
            db.write(lambda s: resume.revert(s, db.lock_row(s, db.Job, job_id), why))
            raise
        report = orch.run()
    except BaseException as e:
        err = e      # the except variable is unbound after the block: the closure keeps its own name

        def fail(s):
            j = db.lock_row(s, db.Job, job_id)
            if j is not None and j.status in LIVE:
                j.status = "cancelled" if isinstance(err, KeyboardInterrupt) else "failed"
                j.message, j.finished_at = str(err) or type(err).__name__, time.time()
        db.write(fail)    # many runners fail at once: this write must not lose the race
        if not isinstance(e, (SpotwiseError, KeyboardInterrupt)):
            raise
    finally:
        settle_job(job_id)
    return report
