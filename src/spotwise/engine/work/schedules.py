"""Schedules: a task to run on a cron line, in a time zone, under per-run and per-month budgets.

Fields (all validated here, with errors naming the field): ``cron`` (5-field cron, croniter),
``timezone`` (IANA), ``budget_per_run`` (the run's cap; the orchestrator stops the run before it
passes it), ``budget_per_month`` (a :class:`~spotwise.engine.state.db.Budget` with id
``schedule:<id>``, period ``month`` in the schedule's time zone), ``deadline_hours``, ``name``,
``paused``, ``overlap`` (``skip`` a fire time while the previous run is still going, or ``queue``
it — at most one queued run), ``unfinished`` (``restart``: every fire time starts the task anew;
``resume``: when the schedule's previous run ended unfinished — stopped by its budget, cancelled,
lost with its runner or interrupted by its cloud — and has a committed checkpoint, the fire time
continues that run as :func:`spotwise.engine.work.resume.prepare` does, with ``budget_per_run`` added
on top of what it spent; a previous run that cannot be resumed is started over, with the reason).

Catch-up rule: after downtime, fire times that passed while nothing was scheduling are not all
replayed; only the newest one runs (if it is otherwise allowed), and the others are recorded as
one ``skipped`` run with the count in its reason.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone as dt_timezone
from functools import lru_cache

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from spotwise.errors import Conflict, InputError, Problem
from spotwise.engine.work import budgets
from spotwise.engine.state import db
from spotwise.utils.timefmt import iso_utc_or_none as iso_utc
from spotwise.taskspec import TaskSpec, parse_taskspec, task_doc

OVERLAP = ("skip", "queue")
UNFINISHED = ("restart", "resume")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def month_budget_id(schedule_id: str) -> str:
    return f"schedule:{schedule_id}"


CRON_ALLOWED = "a 5-field cron line 'minute hour day month weekday', e.g. '0 2 * * *'"


def check_cron(cron: str, *, field: str = "cron") -> str:
    """The cron line, normalised, when it is valid and fires at all (``0 0 31 2 *`` — 31
    February — is valid syntax but never fires; croniter gives up searching for it with an
    error, which must be a 422 here rather than a 500 on every later read)."""
    from croniter import croniter

    cron = " ".join(str(cron).split())
    if "\x00" in cron or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise InputError(Problem(field, cron, CRON_ALLOWED), source="schedule")
    try:
        croniter(cron, datetime(2000, 1, 1, tzinfo=dt_timezone.utc)).get_next(datetime)
    except Exception:  # noqa: BLE001 - croniter's CroniterBadDateError and friends: no fire time
        raise InputError(Problem(field, cron, CRON_ALLOWED + " that fires (this one never does)"),
                         source="schedule") from None
    return cron


def fire_times_after(cron: str, tz: str, after: float, until: float, limit: int = 100_000) -> list[float]:
    """Fire times t with after < t <= until (epoch seconds), at most ``limit`` (the newest kept)."""
    from croniter import croniter

    z = budgets.zone(tz)
    it = croniter(cron, datetime.fromtimestamp(after, tz=dt_timezone.utc).astimezone(z))
    out: list[float] = []
    while True:
        t = it.get_next(datetime).timestamp()
        if t > until:
            return out
        out.append(t)
        if len(out) > limit:
            out.pop(0)


def next_fire(cron: str, tz: str, after: float) -> float:
    """The first fire time of ``cron`` in ``tz`` strictly after ``after`` (epoch seconds).

    A five-field cron fires on whole minutes, so every ``after`` inside one minute has the same
    answer (the first fire at or after the next minute): those calls are served from a cache,
    which keeps listing schedules cheap for the API and the dashboard.
    """
    if len(cron.split()) == 5:
        return _next_fire_minute(cron, tz, int(after // 60))
    return _next_fire(cron, tz, after)


@lru_cache(maxsize=4096)
def _next_fire_minute(cron: str, tz: str, minute: int) -> float:
    return _next_fire(cron, tz, minute * 60 + 30)


def _next_fire(cron: str, tz: str, after: float) -> float:
    from croniter import croniter

    z = budgets.zone(tz)
    return croniter(cron, datetime.fromtimestamp(after, tz=dt_timezone.utc).astimezone(z)).get_next(datetime).timestamp()


def _positive(name: str, v, probs: list[Problem]) -> None:
    """A finite number > 0 (money, hours), else a problem naming the field."""
    from spotwise.errors import number

    try:
        number(name, v, maximum=1e7 if name.startswith("budget") else 1e5)
    except InputError as e:
        probs.extend(e.problems)


def create_schedule(task: dict | TaskSpec, *, cron: str, timezone: str = "UTC", budget_per_run: float | None = None,
                    budget_per_month: float | None = None, deadline_hours: float | None = None,
                    name: str | None = None, overlap: str = "skip", paused: bool = False,
                    unfinished: str = "restart", now: float | None = None) -> dict:
    import re

    spec = task if isinstance(task, TaskSpec) else parse_taskspec(task, source="task")
    probs: list[Problem] = []
    for n, v in (("budget_per_run", budget_per_run), ("budget_per_month", budget_per_month),
                 ("deadline_hours", deadline_hours)):
        _positive(n, v, probs)
    if budget_per_run and budget_per_month and budget_per_run > budget_per_month:
        probs.append(Problem("budget_per_run", budget_per_run, f"at most budget_per_month ({budget_per_month})"))
    if overlap not in OVERLAP:
        probs.append(Problem("overlap", overlap, " or ".join(OVERLAP)))
    if unfinished not in UNFINISHED:
        probs.append(Problem("unfinished", unfinished, " or ".join(UNFINISHED)))
    name = name or spec.name
    if not re.match(NAME_PATTERN, name):
        probs.append(Problem("name", name, "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"))
    if probs:
        raise InputError(probs, source="schedule")
    cron = check_cron(cron)
    budgets.zone(timezone)
    sid = uuid.uuid4().hex[:12]
    now = now if now is not None else time.time()
    taken = Conflict(Problem("name", name, "a schedule name not already in use"), source="schedule")
    try:
        return _insert_schedule(spec, sid, name, cron, timezone, budget_per_run, budget_per_month,
                                deadline_hours, paused, overlap, unfinished, now, taken)
    except IntegrityError:
        # PostgreSQL: a concurrent create of the same name committed between our check and our
        # insert (SELECT locks no row that does not exist yet); the unique index refused ours
        raise taken from None


def _insert_schedule(spec, sid, name, cron, timezone, budget_per_run, budget_per_month, deadline_hours, paused,
                     overlap, unfinished, now, taken) -> dict:
    with db.locked_session() as s:
        if s.scalar(select(db.Schedule.id).where(db.Schedule.name == name)) is not None:
            raise taken
        sch = db.Schedule(id=sid, name=name, task=task_doc(spec), cron=cron, timezone=timezone,
                          budget_per_run=budget_per_run, budget_per_month=budget_per_month,
                          deadline_hours=deadline_hours, paused=paused, overlap=overlap, unfinished=unfinished,
                          created_at=now,
                          last_fire_at=now)
        s.add(sch)
        s.flush()
        if budget_per_month:
            budgets.create_budget(month_budget_id(sid), cap_usd=budget_per_month, name=f"{name} (monthly)",
                                  period="month", timezone=timezone, s=s)
        return to_dict(sch, s=s, now=now)


def _find(ref: str, s: Session) -> db.Schedule | None:
    return s.get(db.Schedule, ref) or s.scalars(select(db.Schedule).where(db.Schedule.name == ref)).first()


def exists(ref: str) -> bool:
    """Whether a schedule has this id or name (the API answers 404 when not)."""
    with db.session() as s:
        return _find(ref, s) is not None


def get(ref: str, s: Session) -> db.Schedule:
    sch = _find(ref, s)
    if sch is None:
        raise InputError(Problem("schedule", ref, "the id or name of an existing schedule (see `spotwise schedule list`)"),
                         source="schedule")
    return sch


def to_dict(sch: db.Schedule, *, s=None, now: float | None = None,
            month_statuses: dict[str, budgets.BudgetStatus] | None = None) -> dict:
    """``month_statuses``: month budget statuses the caller already has, by budget id
    (``list_schedules`` fetches all of them at once); else this schedule's is looked up."""
    now = now if now is not None else time.time()
    month = None
    if sch.budget_per_month:
        bid = month_budget_id(sch.id)
        if month_statuses is not None:
            st = month_statuses.get(bid)
        else:
            try:
                st = budgets.status(bid, at=now, s=s)
            except InputError:
                st = None
        month = st.to_dict() if st is not None else None
    nxt = None if sch.paused else next_fire(sch.cron, sch.timezone, max(now, sch.last_fire_at or now))
    return {"id": sch.id, "name": sch.name, "task": sch.task.get("name"), "cron": sch.cron, "timezone": sch.timezone,
            "budget_per_run": sch.budget_per_run, "budget_per_month": sch.budget_per_month,
            "deadline_hours": sch.deadline_hours, "paused": bool(sch.paused), "overlap": sch.overlap,
            "unfinished": sch.unfinished or "restart",
            "next_run_at": iso_utc(nxt), "last_fire_at": iso_utc(sch.last_fire_at), "month_budget": month}


def describe(ref: str, *, runs_limit: int = 20) -> dict:
    """One schedule as :func:`to_dict`, with its newest ``runs_limit`` runs under ``runs``."""
    with db.session() as s:
        d = to_dict(get(ref, s), s=s)
    d["runs"] = runs(ref, limit=runs_limit)
    return d


def list_schedules(now: float | None = None) -> list[dict]:
    now = now if now is not None else time.time()
    with db.session() as s:
        rows = list(s.scalars(select(db.Schedule).order_by(db.Schedule.name)))
        st = budgets.statuses(s, [month_budget_id(x.id) for x in rows if x.budget_per_month], at=now)
        return [to_dict(x, s=s, now=now, month_statuses=st) for x in rows]


def set_paused(ref: str, paused: bool, *, now: float | None = None) -> dict:
    """Pause or resume. Resuming starts counting fire times from now: runs that fell due while a
    schedule was paused are not caught up."""
    now = now if now is not None else time.time()
    with db.locked_session() as s:
        sch = get(ref, s)
        sch = db.lock_row(s, db.Schedule, sch.id)
        if sch.paused and not paused:
            sch.last_fire_at = max(sch.last_fire_at or 0.0, now)
        sch.paused = paused
        return to_dict(sch, s=s, now=now)


def update(ref: str, **changes) -> dict:
    """Change cron/timezone/budgets/deadline/overlap/unfinished of a schedule (validated like on creation)."""
    with db.locked_session() as s:
        sch = db.lock_row(s, db.Schedule, get(ref, s).id)
        probs: list[Problem] = []
        for k in ("budget_per_run", "budget_per_month", "deadline_hours"):
            if k in changes:
                _positive(k, changes[k], probs)
        if "overlap" in changes and changes["overlap"] not in OVERLAP:
            probs.append(Problem("overlap", changes["overlap"], " or ".join(OVERLAP)))
        if "unfinished" in changes and changes["unfinished"] not in UNFINISHED:
            probs.append(Problem("unfinished", changes["unfinished"], " or ".join(UNFINISHED)))
        if probs:
            raise InputError(probs, source="schedule")
        if "cron" in changes:
            sch.cron = check_cron(changes["cron"])
        if "timezone" in changes:
            budgets.zone(changes["timezone"])
            sch.timezone = changes["timezone"]
        for k in ("budget_per_run", "deadline_hours", "overlap", "unfinished"):
            if k in changes:
                setattr(sch, k, changes[k])
        if "budget_per_month" in changes:
            sch.budget_per_month = changes["budget_per_month"]
            b = s.get(db.Budget, month_budget_id(sch.id))
            if changes["budget_per_month"] is None:
                pass   # the budget row stays (its history), the schedule stops using it
            elif b is None:
                budgets.create_budget(month_budget_id(sch.id), cap_usd=changes["budget_per_month"],
                                      name=f"{sch.name} (monthly)", timezone=sch.timezone, s=s)
            else:
                b.cap_usd = float(changes["budget_per_month"])
        return to_dict(sch, s=s)


def remove(ref: str) -> str:
    with db.locked_session() as s:
        sch = get(ref, s)
        sid = sch.id
        for r in s.scalars(select(db.ScheduleRun).where(db.ScheduleRun.schedule_id == sid)):
            s.delete(r)
        s.delete(sch)
    return sid


def runs(ref: str | None = None, limit: int = 50) -> list[dict]:
    with db.session() as s:
        q = select(db.ScheduleRun).order_by(db.ScheduleRun.fire_at.desc(), db.ScheduleRun.id.desc()).limit(limit)
        if ref:
            q = q.where(db.ScheduleRun.schedule_id == get(ref, s).id)
        return [{"id": r.id, "schedule_id": r.schedule_id, "fire_at": iso_utc(r.fire_at), "status": r.status,
                 "reason": r.reason, "job_id": r.job_id} for r in s.scalars(q)]
