"""Resuming a stopped job: ``spotwise resume JOB`` and ``POST /api/v1/jobs/{id}/resume``.

A run that ended ``budget_exhausted``, ``cancelled`` or ``lost`` (or ``failed`` because its cloud
interrupted it: its head or too many workers lost; the report's ``interrupted``) continues from
its last committed checkpoint. What makes the resume exact: it is the **same job** — the same job
id, which is the runtime's run name, and the same checkpoint storage, so the runtime finds the
run's checkpoints (``<storage>/<job id>/checkpoints``, :func:`spotwise.runtime.checkpoint.checkpointer.latest_committed`)
and restores model, optimizer, step and RNG from the newest committed one; and the same task as
stored with the job (a ``spotwise launch`` stores the storage, clouds and simulated market it
actually ran with: :func:`spotwise.engine.plan.options.task_as_run`).

Money: ``budget_usd`` is *added* to what the job has already spent: the cap the purse enforces
for the new leg is ``spent + budget_usd``, and the leg's ledger starts from the job's earlier
rows (:meth:`~spotwise.engine.state.ledger.Ledger.carry_over`), so spend is never counted twice and
the cap covers the whole job. Without ``budget_usd`` the job's own cap applies, and a job with
nothing left of it (a ``budget_exhausted`` job, by definition) is refused with a reason that
says to add money. A job whose earlier leg reserved money against a budget (``budget_id``, a
schedule's monthly budget) reserves what the new leg may spend against the same budget first.

Concurrency: :func:`prepare` checks the job's status and flips it to ``pending`` in one
transaction that holds the row (``SELECT ... FOR UPDATE`` on PostgreSQL, the write lock on
SQLite), so of two resumes at once exactly one gets the job; the other is refused because the job
is pending. A ``resumed`` event records the leg (from which status and step, the cap, the spend
before it); the report's ``resumed`` lists them. A resume that never got to start (the process
died, the orchestrator refused the task) goes back to the status it came from
(:func:`abandon`, and :func:`spotwise.engine.work.jobs.reconcile` for a dead owner).

Every refusal is a :class:`ResumeRefused`: one line, exit code 2 in the CLI, 404 (unknown job)
or 409 (a job that cannot be resumed now) in the API.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from spotwise.engine.work import budgets
from spotwise.engine.state import db
from spotwise.engine.run.journal import RESUMED
from spotwise.errors import InputError, Problem, SpotwiseError
from spotwise.taskspec import TaskSpec, parse_taskspec, task_doc

RESUMABLE = ("budget_exhausted", "cancelled", "lost")
EVENT = RESUMED


class ResumeRefused(SpotwiseError):
    """The job cannot be resumed; ``reason`` is one line. Exit code 2 (like bad input): nothing
    ran. ``http_status``: 404 for an unknown job, 409 for one that cannot be resumed now."""

    exit_code = 2

    def __init__(self, job_id: str, reason: str, *, http_status: int = 409, no_checkpoint: bool = False) -> None:
        self.job_id, self.reason, self.http_status = job_id, reason, http_status
        self.no_checkpoint = no_checkpoint     # nothing committed to resume from (a schedule starts over)
        super().__init__(f"cannot resume job {job_id}: {reason}")


@dataclass(frozen=True, kw_only=True)
class Resumption:
    """A resume that took the job (it is ``pending`` again and owned by the caller)."""

    job_id: str
    spec: TaskSpec              # the stored task, with the new cap and deadline
    cluster_id: str             # a fresh cluster for this leg
    budget_usd: float | None    # the cap for the whole job: spent + what was added (None: no cap)
    spent_usd: float            # what the job's earlier legs spent (the ledger's rows)
    from_status: str
    from_step: int
    checkpoint: str


def _check_money(job_id: str, field: str, value: float | None, maximum: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 < value <= maximum):
        raise InputError(Problem(field, value, f"a finite number > 0 and <= {maximum:g}"), source="resume")
    return float(value)


def refusal(job: db.Job | None, job_id: str) -> ResumeRefused | None:
    """Why ``job`` cannot be resumed from its status, or None when its status allows it."""
    if job is None:
        return ResumeRefused(job_id, "no such job (see `spotwise status`)", http_status=404)
    st = job.status
    if st == "succeeded":
        return ResumeRefused(job_id, f"it succeeded: nothing is left to train (final checkpoint "
                                     f"{job.final_checkpoint or 'none'})")
    if st in ("pending", "running"):
        return ResumeRefused(job_id, f"it is {st}: a job runs one runner at a time (if its runner died, "
                                     "`spotwise gc` marks it lost first)")
    if st == "failed":
        if (job.report or {}).get("interrupted"):
            return None
        why = (job.message or "no reason recorded").splitlines()[0][:300]
        return ResumeRefused(job_id, f"it failed ({why}); only a run stopped by its budget, cancelled, lost "
                                     "with its runner or interrupted by its cloud resumes: fix the cause and "
                                     "launch the task again")
    if st not in RESUMABLE:
        return ResumeRefused(job_id, f"its status {st!r} is not one a job resumes from ({', '.join(RESUMABLE)})")
    return None


def latest_checkpoint(job_id: str, spec: TaskSpec):
    """The newest committed checkpoint of the job's run in its storage (None when there is none),
    and the storage URI it looked in: of a run with a store per cloud
    (:mod:`spotwise.engine.run.run_stores`), the newest in any of them and the store that holds it
    (the resume copies it to the cloud it lands on), or all of them, comma-separated, when none does."""
    from spotwise.engine.plan.options import LaunchOptions, parse_clouds
    from spotwise.engine.run.run_stores import run_stores
    from spotwise.runtime.checkpoint.layout import latest_committed, run_storage

    stores = run_stores(spec, LaunchOptions(), parse_clouds(None, spec))
    looked = ", ".join(stores.uris)
    try:
        found = stores.newest(job_id)
        if found is None:
            return None, looked
        return latest_committed(run_storage(found[0], job_id)), found[0]
    except Exception as e:  # noqa: BLE001 - storage unreachable: said as the reason, never a traceback
        raise ResumeRefused(job_id, f"could not read its checkpoints in {looked}: {e}") from None


def prepare(job_id: str, *, budget_usd: float | None = None, deadline_hours: float | None = None,
            now: float | None = None, check: Callable[[TaskSpec], object] | None = None,
            s: Session | None = None) -> Resumption:
    """Check that ``job_id`` can be resumed and take it: status ``pending``, owned by this
    process, a fresh cluster id, the new cap and deadline, a ``resumed`` event, and the money
    reserved against the job's budgets — all in one transaction (see the module's docstring).
    Raises :class:`ResumeRefused` (or :class:`InputError` for a bad number) without changing
    anything. ``check(spec)``: the caller's own test of the stored task, before anything changes
    (the API's trust boundary: a token holder resumes only what it could have launched). ``s``: a
    write transaction the caller holds (the scheduler's, with its schedule row locked), in which the
    job is taken; its commit is the caller's."""
    from spotwise.engine.state.lease import this_process

    added = _check_money(job_id, "--budget", budget_usd, 1e7)
    deadline = _check_money(job_id, "--deadline-hours", deadline_hours, 1e5)
    now = time.time() if now is None else now
    if s is not None:
        job = s.get(db.Job, job_id)
    else:
        with db.session() as rs:
            job = rs.get(db.Job, job_id)
    if (no := refusal(job, job_id)) is not None:
        raise no
    assert job is not None
    spec = parse_taskspec(job.spec, source=f"job {job_id}")
    if check is not None:
        check(spec)
    ck, storage = latest_checkpoint(job_id, spec)
    if ck is None:
        raise ResumeRefused(job_id, f"nothing to resume from: no committed checkpoint of run {job_id} in "
                                    f"{storage}; launch the task again with `spotwise launch`", no_checkpoint=True)
    me = this_process()

    def take(s: Session) -> Resumption:
        j = db.lock_row(s, db.Job, job_id)
        if (no := refusal(j, job_id)) is not None:      # again, holding the row: a concurrent resume lost
            raise no
        spent = db.job_spend(s, job_id)
        if added is not None:
            cap: float | None = spent + added
        else:
            cap = j.budget_usd
            if cap is not None and (j.status == "budget_exhausted" or cap - spent <= budgets.EPS):
                raise ResumeRefused(job_id, f"it has spent ${spent:.4f} of its ${cap:.4f} budget, too little "
                                            "is left for another billing minute; add money on top of what it "
                                            "spent with --budget USD (API: budget_usd)")
        # the stored task with the new cap and deadline written in (as jobs.spec_with does for a launch;
        # not called from here: jobs imports this module)
        doc = dict(j.spec)
        doc.update({k: v for k, v in (("budget_usd", cap), ("deadline_hours", deadline)) if v is not None})
        leg = parse_taskspec(doc, source=f"job {job_id}")
        _reserve(s, job_id, None if cap is None else cap - spent, now)
        # a scheduled run is the schedule's again while it runs: its overlap rule sees it, and
        # finish_schedule_runs settles and finishes it once more when it ends
        s.execute(update(db.ScheduleRun).where(db.ScheduleRun.job_id == job_id, db.ScheduleRun.status == "finished")
                  .values(status="launched", reason=f"resumed from step {ck.step}"))
        from_status = j.status
        cluster_id = f"sw{uuid.uuid4().hex[:10]}"
        s.add(db.Event(job_id=job_id, t=now, kind=EVENT, detail={
            "from_status": from_status, "from_step": ck.step, "checkpoint": ck.uri, "spent_usd": round(spent, 6),
            "budget_usd": cap, "added_usd": added, "deadline_hours": leg.deadline_hours,
            "previous_cluster_id": j.cluster_id, "message": j.message}))
        j.status, j.message = "pending", f"resuming from step {ck.step} (was {from_status})"
        j.finished_at, j.lease_expires_at, j.node_deadline = None, None, None
        j.owner_pid, j.owner_host, j.owner_started = me.pid, me.host, me.started
        j.cluster_id, j.budget_usd, j.deadline_hours, j.spec = cluster_id, cap, leg.deadline_hours, task_doc(leg)
        return Resumption(job_id=job_id, spec=leg, cluster_id=cluster_id, budget_usd=cap, spent_usd=spent,
                          from_status=from_status, from_step=ck.step, checkpoint=ck.uri)
    return take(s) if s is not None else db.write(take)


def _reserve(s: Session, job_id: str, amount: float | None, now: float) -> None:
    """Reserve what the new leg may spend against every budget the job reserved against before
    (a ``budget_id`` launch, a schedule's month); a budget that cannot hold it refuses the resume."""
    R = db.BudgetReservation
    ids = sorted(set(s.scalars(select(R.budget_id).where(R.job_id == job_id))))
    if not ids:
        return
    if amount is None or amount <= 0:
        raise ResumeRefused(job_id, f"it spends against budget(s) {', '.join(ids)}, so it needs a cap: pass "
                                    "--budget USD (API: budget_usd)")
    for bid in ids:
        try:
            budgets.reserve_in(s, bid, amount, job_id=job_id, at=now)
        except budgets.BudgetExceeded as e:
            raise ResumeRefused(job_id, str(e)) from None


def is_resumption(job: db.Job) -> bool:
    """A ``pending`` job that has run before is a resume waiting for its runner: a new job gets
    ``started_at`` only when its runner takes it, and a resume keeps the first one."""
    return job.status == "pending" and job.started_at is not None


def previous(s: Session, job_id: str) -> dict | None:
    """The detail of the job's latest ``resumed`` event (what it was before its latest resume)."""
    ev = s.scalars(select(db.Event).where(db.Event.job_id == job_id, db.Event.kind == EVENT)
                   .order_by(db.Event.id.desc()).limit(1)).first()
    return dict(ev.detail or {}) if ev is not None else None


def revert(s: Session, job: db.Job, why: str) -> str:
    """Put a resume that never started back to the status it came from (in ``s``); returns it."""
    before = previous(s, job.id) or {}
    job.status = str(before.get("from_status") or "lost")
    job.message = f"resume did not start ({why}); still resumable from step {before.get('from_step', '?')}"
    job.finished_at = time.time()
    return job.status


def abandon(job_id: str, why: str) -> None:
    """The resume of ``job_id`` could not start (the orchestrator refused the task, the process
    is going away): back to its earlier status, its new reservations settled at what it spent."""
    def do(s: Session) -> None:
        j = db.lock_row(s, db.Job, job_id)
        if j is not None and is_resumption(j):
            revert(s, j, why)
    db.write(do)
    budgets.settle_job(job_id)
