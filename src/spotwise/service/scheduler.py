"""The scheduler: decides which schedule runs are due and launches them within their budgets.

:meth:`Scheduler.tick` is the whole algorithm (the ``serve`` loop calls it every few seconds):

1. finish the runs whose job has ended (settle their budget reservations from the ledger);
2. for each unpaused schedule, in a transaction that locks the schedule's row — so two
   schedulers sharing a PostgreSQL database handle each fire time once — take the fire times in
   ``(last_fire_at, now]``. Catch-up rule: only the newest runs; older ones are recorded as one
   ``skipped`` run. Then, for the newest: if a run of this schedule is still going, ``skip`` it
   (or ``queue`` it, at most one queued); otherwise launch it — unless its budget says no, in
   which case it is recorded as ``refused`` with the reason. With ``unfinished: resume`` the
   launch continues the previous run when it ended unfinished (:meth:`Scheduler._resume`). ``last_fire_at`` moves to it in
   the same transaction as the job row, the run record and the budget reservation;
3. start a queued run once its schedule has nothing running;
4. only after that transaction commits, hand each new job id to the launcher.

Budget rule per launch: the run's cap is ``budget_per_run`` (or the task file's ``budget_usd``);
with a ``budget_per_month``, that cap — or, without a per-run cap, whatever the month has left —
is reserved against the month first, so the month can never be overspent.

The clock is injectable (``clock() -> epoch seconds``), so tests can move time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import select

from spotwise.errors import SpotwiseError
from spotwise.engine.work import budgets, jobs, schedules
from spotwise.engine.state import db
from spotwise.taskspec import TaskSpec

log = logging.getLogger("spotwise.scheduler")


@dataclass(frozen=True, slots=True)
class Action:
    schedule: str
    fire_at: float
    status: str            # launched|skipped|queued|refused
    reason: str | None = None
    job_id: str | None = None


class _Refused(Exception):
    pass


class Scheduler:
    def __init__(self, *, clock: Callable[[], float] = time.time,
                 launcher: Callable[[str], object] | None = None,
                 reap: Callable[[], object] | None = None) -> None:
        """``launcher(job_id)`` starts a recorded job (default: a runner process per job, see
        :class:`~spotwise.engine.work.jobs.ProcessLauncher`); ``reap()`` is called first on every tick
        to collect launched runners that ended (default: the process launcher's ``poll``, or
        nothing for a launcher passed in without one)."""
        self.clock = clock
        if launcher is None:
            procs = jobs.ProcessLauncher()
            launcher, reap = procs, reap or procs.poll
        self.launcher = launcher
        self._reap: Callable[[], object] = reap or (lambda: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one pass ------------------------------------------------------------------------------
    def tick(self) -> list[Action]:
        now = self.clock()
        self._reap()
        jobs.finish_schedule_runs()
        with db.session() as s:
            ids = list(s.scalars(select(db.Schedule.id).where(db.Schedule.paused.is_(False))
                                 .order_by(db.Schedule.name)))
        actions: list[Action] = []
        for sid in ids:
            actions += self._tick_schedule(sid, now)
        for a in actions:
            if a.status == "launched" and a.job_id:
                self.start_job(a.job_id)
        return actions

    def _tick_schedule(self, sid: str, now: float) -> list[Action]:
        out: list[Action] = []
        with db.locked_session() as s:
            sch = db.lock_row(s, db.Schedule, sid)
            if sch is None or sch.paused:
                return out
            active = self._active(s, sid)
            queued = s.scalars(select(db.ScheduleRun).where(db.ScheduleRun.schedule_id == sid,
                                                            db.ScheduleRun.status == "queued")
                               .order_by(db.ScheduleRun.fire_at)).first()
            if queued is not None and not active:
                out.append(self._launch_or_refuse(s, sch, queued.fire_at, now, run=queued))
                active = out[-1].status == "launched"
            fires = schedules.fire_times_after(sch.cron, sch.timezone, sch.last_fire_at or sch.created_at, now)
            if not fires:
                return out
            latest = fires[-1]
            if len(fires) > 1:
                reason = (f"{len(fires) - 1} fire time(s) passed while nothing was scheduling; catch-up runs only "
                          f"the newest")
                s.add(db.ScheduleRun(schedule_id=sid, fire_at=fires[0], status="skipped", reason=reason,
                                     created_at=now))
                out.append(Action(sch.name, fires[0], "skipped", reason))
            if active:
                if sch.overlap == "queue" and queued is None:
                    reason = "previous run still running (overlap=queue): starts when it ends"
                    status = "queued"
                else:
                    reason = ("previous run still running (overlap=skip)" if sch.overlap == "skip" else
                              "previous run still running and one run is already queued (overlap=queue)")
                    status = "skipped"
                s.add(db.ScheduleRun(schedule_id=sid, fire_at=latest, status=status, reason=reason, created_at=now))
                out.append(Action(sch.name, latest, status, reason))
            else:
                out.append(self._launch_or_refuse(s, sch, latest, now))
            sch.last_fire_at = latest
        return out

    @staticmethod
    def _active(s, sid: str) -> bool:
        return s.scalar(select(db.ScheduleRun.id).join(db.Job, db.Job.id == db.ScheduleRun.job_id).where(
            db.ScheduleRun.schedule_id == sid, db.ScheduleRun.status == "launched",
            db.Job.status.in_(jobs.LIVE)).limit(1)) is not None

    def _launch_or_refuse(self, s, sch: db.Schedule, fire_at: float, now: float,
                          run: db.ScheduleRun | None = None) -> Action:
        job_id: str | None
        reason: str | None
        try:
            resumed = self._resume(s, sch, now) if sch.unfinished == "resume" else None
            if isinstance(resumed, tuple):
                (job_id, reason), rid = resumed, None
            else:
                job_id, rid = self._prepare(s, sch, now)
                reason = resumed        # why the previous run was not resumed, or None
        except _Refused as e:
            status, reason, job_id, rid = "refused", str(e), None, None
        else:
            status = "launched"
        if run is None:
            run = db.ScheduleRun(schedule_id=sch.id, fire_at=fire_at, created_at=now, status=status)
            s.add(run)
        run.status, run.reason, run.job_id, run.reservation_id = status, reason, job_id, rid
        s.flush()
        return Action(sch.name, fire_at, status, reason, job_id)

    @staticmethod
    def _resume(s, sch: db.Schedule, now: float) -> tuple[str, str] | str | None:
        """``unfinished: resume``: continue the schedule's previous run when it ended unfinished
        (:func:`spotwise.engine.work.resume.refusal` allows it) and has a committed checkpoint, in this
        transaction, with ``budget_per_run`` (else the task's ``budget_usd``) added on top of what
        it spent: ``(job_id, reason)``. A previous run that cannot be resumed gives the reason the
        fire time starts over instead (a string), or None when there is no previous run; a resume
        the money refuses raises :class:`_Refused` (starting over would spend as well)."""
        from spotwise.engine.work import resume

        prev = s.scalars(select(db.ScheduleRun).where(db.ScheduleRun.schedule_id == sch.id,
                                                      db.ScheduleRun.job_id.is_not(None))
                         .order_by(db.ScheduleRun.fire_at.desc(), db.ScheduleRun.id.desc()).limit(1)).first()
        if prev is None:
            return None
        job = s.get(db.Job, prev.job_id)
        if job is None or job.status == "succeeded":
            return None
        if (no := resume.refusal(job, prev.job_id)) is not None:
            return f"started over: {no}"
        task = TaskSpec.model_validate(sch.task)
        added = sch.budget_per_run if sch.budget_per_run is not None else task.budget_usd
        try:
            r = resume.prepare(prev.job_id, budget_usd=added, deadline_hours=sch.deadline_hours, now=now, s=s)
        except resume.ResumeRefused as e:
            if e.no_checkpoint:
                return f"started over: {e}"
            raise _Refused(str(e)) from None
        return r.job_id, f"resumed job {r.job_id} from step {r.from_step} (it was {r.from_status})"

    def _prepare(self, s, sch: db.Schedule, now: float) -> tuple[str, int | None]:
        """Reserve the money and record the job (same transaction); raise _Refused when not allowed."""
        task = TaskSpec.model_validate(sch.task)
        from spotwise.service.boundary import USER_CODE_ENV, serves_user_code, user_code_fields

        code = user_code_fields(task)
        if code and not serves_user_code():       # served when the schedule was made, not any more
            raise _Refused(f"{', '.join(code)}: this server no longer runs user code ({USER_CODE_ENV} is not set)")
        cap = sch.budget_per_run if sch.budget_per_run is not None else task.budget_usd
        rid = None
        if sch.budget_per_month:
            bid = schedules.month_budget_id(sch.id)
            if cap is None:
                st = budgets.status(bid, at=now, s=s)
                cap = st.remaining_usd
                if cap <= budgets.EPS:
                    raise _Refused(f"monthly budget ${sch.budget_per_month:.2f} is used up for {st.period_key}")
            try:
                res = budgets.reserve_in(s, bid, cap, at=now)
            except budgets.BudgetExceeded as e:
                raise _Refused(f"per-run budget ${cap:.4f} would break the monthly budget: {e}") from None
            rid = res.id
        try:
            spec = jobs.spec_with(task, budget_usd=cap, deadline_hours=sch.deadline_hours,
                                  source=f"schedule {sch.name}")
        except SpotwiseError as e:
            if rid is not None:
                r = s.get(db.BudgetReservation, rid)
                r.state, r.actual_usd, r.settled_at = "released", 0.0, now
            raise _Refused(str(e)) from None
        job = jobs.create_job(s, spec)
        if rid is not None:
            s.get(db.BudgetReservation, rid).job_id = job.id
        return job.id, rid

    def start_job(self, job_id: str) -> None:
        try:
            self.launcher(job_id)
        except Exception as e:  # noqa: BLE001 - the launch itself failed: the job never ran, free its money
            from spotwise.engine.work import resume

            log.exception("could not start job %s", job_id)
            with db.locked_session() as s:
                j = db.lock_row(s, db.Job, job_id)
                if resume.is_resumption(j):        # a resumed job goes back to what it was: still resumable
                    resume.revert(s, j, f"could not start: {e}")
                else:
                    j.status, j.message, j.finished_at = "failed", f"could not start: {e}", time.time()
            budgets.settle_job(job_id)

    # -- background loop -----------------------------------------------------------------------
    def start(self, interval: float = 5.0) -> "Scheduler":
        def loop():
            while not self._stop.is_set():
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - one failed pass (a database hiccup) must not end the loop
                    log.exception("scheduler tick failed")
                self._stop.wait(interval)

        self._thread = threading.Thread(target=loop, name="scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
