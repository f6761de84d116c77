"""Budgets: money is reserved before a launch and settled from the ledger after it.

Contract
    :func:`reserve` sets ``amount`` aside against a budget for the budget's current period (a
    calendar month in the budget's timezone, or ``total``). It holds a write lock while it adds up
    what the period already holds and inserts the reservation — ``SELECT ... FOR UPDATE`` on the
    budget row on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite — so any number of concurrent
    schedulers, API calls or processes can never together reserve more than the cap.
    :func:`settle` replaces the reservation by what the job actually spent (the sum of its ledger
    rows; the orchestrator's per-run cap keeps that at or below the reservation); :func:`release`
    frees it when nothing was launched. Both are idempotent.

A period "holds" the reserved amounts of open reservations plus the actual spend of settled ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sqlalchemy.exc import IntegrityError

from spotwise.errors import Conflict, InputError, Problem, SpotwiseError
from spotwise.engine.state import db

PERIODS = ("month", "total")
EPS = 1e-9


class BudgetExceeded(SpotwiseError):
    """A reservation would take a budget past its cap; nothing was reserved."""

    def __init__(self, budget_id: str, cap: float, held: float, amount: float) -> None:
        self.budget_id, self.cap, self.held, self.amount = budget_id, cap, held, amount
        super().__init__(f"budget {budget_id!r}: ${held:.4f} of ${cap:.4f} already spent or reserved this period; "
                         f"${amount:.4f} more would exceed it (${max(0.0, cap - held):.4f} left)")


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    id: str
    name: str
    cap_usd: float
    period: str
    period_key: str
    timezone: str
    reserved_usd: float
    spent_usd: float

    @property
    def held_usd(self) -> float:
        return self.reserved_usd + self.spent_usd

    @property
    def remaining_usd(self) -> float:
        return max(0.0, self.cap_usd - self.held_usd)

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "cap_usd": self.cap_usd, "period": self.period,
                "period_key": self.period_key, "timezone": self.timezone,
                "reserved_usd": round(self.reserved_usd, 6), "spent_usd": round(self.spent_usd, 6),
                "remaining_usd": round(self.remaining_usd, 6)}


def zone(name: str, *, field: str = "timezone") -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InputError(Problem(field, name, "an IANA time zone name, e.g. UTC or Europe/Berlin")) from None


def period_key(period: str, tz: str, at: float | None = None) -> str:
    if period == "total":
        return "total"
    t = datetime.fromtimestamp(at if at is not None else time.time(), tz=dt_timezone.utc).astimezone(zone(tz))
    return f"{t.year:04d}-{t.month:02d}"


def create_budget(budget_id: str, *, cap_usd: float, name: str | None = None, period: str = "month",
                  timezone: str = "UTC", s: Session | None = None) -> db.Budget:
    from spotwise.errors import number

    probs = []
    try:
        number("cap_usd", cap_usd, maximum=1e7)
    except InputError:
        probs.append(Problem("cap_usd", cap_usd, "a finite number of US dollars > 0 and <= 1e7"))
    if period not in PERIODS:
        probs.append(Problem("period", period, " or ".join(PERIODS)))
    if probs:
        raise InputError(probs, source="budget")
    zone(timezone)
    taken = Conflict(Problem("id", budget_id, "a budget id not already in use"), source="budget")

    def insert(s: Session) -> db.Budget:
        if s.get(db.Budget, budget_id) is not None:
            raise taken
        b = db.Budget(id=budget_id, name=name or budget_id, cap_usd=float(cap_usd), period=period,
                      timezone=timezone, created_at=time.time())
        s.add(b)
        s.flush()
        return b

    if s is not None:
        return insert(s)
    try:
        # a writer's transaction: on SQLite it serialises with a concurrent create, so the check
        # sees the other row; on PostgreSQL the primary key refuses the second insert
        with db.locked_session() as own:
            return insert(own)
    except IntegrityError:
        raise taken from None


def _held(s: Session, budget_id: str, key: str) -> tuple[float, float]:
    R = db.BudgetReservation
    reserved = s.scalar(select(func.coalesce(func.sum(R.amount_usd), 0.0)).where(
        R.budget_id == budget_id, R.period_key == key, R.state == "reserved"))
    spent = s.scalar(select(func.coalesce(func.sum(R.actual_usd), 0.0)).where(
        R.budget_id == budget_id, R.period_key == key, R.state == "committed"))
    return float(reserved or 0.0), float(spent or 0.0)


def exists(budget_id: str) -> bool:
    """Whether a budget has this id (the API answers 404 when not)."""
    with db.session() as s:
        return s.get(db.Budget, budget_id) is not None


def status(budget_id: str, *, at: float | None = None, s: Session | None = None) -> BudgetStatus:
    own = s is None
    s = s or db.session()
    try:
        st = statuses(s, [budget_id], at=at).get(budget_id)
        if st is None:
            raise InputError(Problem("budget_id", budget_id, "the id of an existing budget"), source="budget")
        return st
    finally:
        if own:
            s.close()


def reserve_in(s: Session, budget_id: str, amount: float, *, job_id: str | None = None,
               at: float | None = None) -> db.BudgetReservation:
    """Reserve inside a :func:`db.locked_session` (so the caller can record its launch in the same
    transaction). Raises :class:`BudgetExceeded` when the period cannot hold ``amount``."""
    if not amount > 0:
        raise InputError(Problem("amount_usd", amount, "a number of US dollars > 0"), source="budget")
    b = db.lock_row(s, db.Budget, budget_id)
    if b is None:
        raise InputError(Problem("budget_id", budget_id, "the id of an existing budget"), source="budget")
    key = period_key(b.period, b.timezone, at)
    reserved, spent = _held(s, budget_id, key)
    if reserved + spent + amount > b.cap_usd + EPS:
        raise BudgetExceeded(budget_id, b.cap_usd, reserved + spent, amount)
    r = db.BudgetReservation(budget_id=budget_id, period_key=key, job_id=job_id, amount_usd=float(amount),
                             state="reserved", created_at=time.time())
    s.add(r)
    s.flush()
    return r


def reserve(budget_id: str, amount: float, *, job_id: str | None = None, at: float | None = None) -> int:
    """Reserve ``amount`` now, in a transaction of its own; returns the reservation id."""
    with db.locked_session() as s:
        return reserve_in(s, budget_id, amount, job_id=job_id, at=at).id


def settle(reservation_id: int, actual_usd: float) -> None:
    """Turn a reservation into spend (``actual_usd``, from the ledger). Idempotent."""
    def do(s):
        r = s.get(db.BudgetReservation, reservation_id)
        if r is None or r.state != "reserved":
            return
        r.state, r.actual_usd, r.settled_at = "committed", max(0.0, float(actual_usd)), time.time()
    db.write(do)   # runs when many jobs end at once: retried on a lost race


def release(reservation_id: int) -> None:
    """Free a reservation whose launch never happened. Idempotent."""
    with db.locked_session() as s:
        r = s.get(db.BudgetReservation, reservation_id)
        if r is None or r.state != "reserved":
            return
        r.state, r.actual_usd, r.settled_at = "released", 0.0, time.time()


def settle_job(job_id: str) -> int:
    """Settle every open reservation of a finished job at its ledger spend; returns how many.

    A resumed job (:mod:`spotwise.engine.work.resume`) reserves again for each new leg: its open
    reservation is settled at the spend not already committed by its earlier reservations against
    the same budget, so the budget counts each dollar of the job once."""
    R = db.BudgetReservation
    with db.session() as s:
        spend = db.job_spend(s, job_id)
        open_ = list(s.execute(select(R.id, R.budget_id).where(R.job_id == job_id, R.state == "reserved")))
        committed = dict(s.execute(select(R.budget_id, func.coalesce(func.sum(R.actual_usd), 0.0)).where(
            R.job_id == job_id, R.state == "committed").group_by(R.budget_id)).all())
    for rid, bid in open_:
        settle(rid, max(0.0, spend - float(committed.get(bid) or 0.0)))
    return len(open_)


def statuses(s: Session, budget_ids: list[str] | None = None, *, at: float | None = None) -> dict[str, BudgetStatus]:
    """Status of many budgets (all when ``budget_ids`` is None) in two queries: the list views
    (API, dashboard, schedules) must not cost three queries per budget."""
    q = select(db.Budget)
    if budget_ids is not None:
        if not budget_ids:
            return {}
        q = q.where(db.Budget.id.in_(budget_ids))
    bs = list(s.scalars(q.order_by(db.Budget.id)))
    keys = {b.id: period_key(b.period, b.timezone, at) for b in bs}
    R = db.BudgetReservation
    held: dict[tuple[str, str, str], float] = {}
    if bs:
        rows = s.execute(select(R.budget_id, R.period_key, R.state,
                                func.coalesce(func.sum(R.amount_usd), 0.0), func.coalesce(func.sum(R.actual_usd), 0.0))
                         .where(R.budget_id.in_(list(keys)), R.state.in_(("reserved", "committed")))
                         .group_by(R.budget_id, R.period_key, R.state)).all()
        for bid, key, state, amount, actual in rows:
            held[(bid, key, state)] = float((amount if state == "reserved" else actual) or 0.0)  # coalesced: never None
    return {b.id: BudgetStatus(b.id, b.name, b.cap_usd, b.period, keys[b.id], b.timezone,
                               held.get((b.id, keys[b.id], "reserved"), 0.0),
                               held.get((b.id, keys[b.id], "committed"), 0.0)) for b in bs}


def list_budgets(at: float | None = None) -> list[BudgetStatus]:
    with db.session() as s:
        return list(statuses(s, at=at).values())
