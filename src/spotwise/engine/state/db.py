"""Database models and engine (SQLAlchemy 2).

``SPOTWISE_DATABASE_URL`` selects the database (e.g. ``postgresql+psycopg://127.0.0.1/test``);
by default SQLite at ``$SPOTWISE_HOME/spotwise.db``. The spend ledger (:class:`LedgerEntry`) is
append-only: a node's cost is the sum of its entries, each billed per second at the price the
node was launched at, with that price's source and date copied onto the entry.

The schema is owned by Alembic (``spotwise/engine/state/migrations``): the first use of an engine runs
``upgrade head`` (under a lock, so two processes starting at once do not race), never
``create_all``. Budgets, schedules and API tokens are the service's tables (revision 0002); what runs saw of
spot per zone is ``spot_observations`` (revision 0004); a run's loss and spend curves are
``curve_points`` (revision 0005); the job's own output (what the driver and every rank printed) is
``job_logs`` (revision 0006); a schedule's ``unfinished`` rule is revision 0007.

Locking: :func:`locked_session` opens a transaction that serialises writers — ``BEGIN IMMEDIATE``
on SQLite; on PostgreSQL the caller locks the row it checks with ``SELECT ... FOR UPDATE``
(:func:`lock_row`). Budget reservations are checked and written inside such a transaction, so
concurrent launches can never reserve more than a budget holds.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from spotwise.config import setting
from spotwise.paths import home


T = TypeVar("T")


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(32), index=True)   # pending|running|succeeded|budget_exhausted|failed|cancelled|lost
    cloud: Mapped[str] = mapped_column(String(32))
    cluster_id: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
    spec: Mapped[dict] = mapped_column(JSON)
    budget_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    deadline_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    steps_completed: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    resumes: Mapped[int] = mapped_column(Integer, default=0)
    final_checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    report: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    owner_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the runner's lease (revision 0003; see spotwise.engine.state.lease)
    owner_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    owner_started: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    node_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)


class NodeRecord(Base):
    __tablename__ = "nodes"

    instance_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    cluster_id: Mapped[str] = mapped_column(String(64), index=True)
    cloud: Mapped[str] = mapped_column(String(32))
    instance_type: Mapped[str] = mapped_column(String(64))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str] = mapped_column(String(64))
    market: Mapped[str] = mapped_column(String(32))
    role: Mapped[str] = mapped_column(String(16))
    usd_per_hour: Mapped[float] = mapped_column(Float)
    price_source: Mapped[str] = mapped_column(Text)
    price_as_of: Mapped[str] = mapped_column(String(32))
    launched_at: Mapped[float] = mapped_column(Float)
    billed_until: Mapped[float] = mapped_column(Float)
    terminated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)


class LedgerEntry(Base):
    """Append-only: one row per billed interval of one node."""

    __tablename__ = "ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    instance_id: Mapped[str] = mapped_column(String(128), index=True)
    cloud: Mapped[str] = mapped_column(String(32))
    market: Mapped[str] = mapped_column(String(32))
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float)
    seconds: Mapped[int] = mapped_column(Integer)
    usd_per_hour: Mapped[float] = mapped_column(Float)
    usd: Mapped[float] = mapped_column(Float)
    price_source: Mapped[str] = mapped_column(Text)
    price_as_of: Mapped[str] = mapped_column(String(32))


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    t: Mapped[float] = mapped_column(Float, default=time.time)
    kind: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


class CurvePoint(Base):
    """One sample of a running job's curves (revision 0005): ``step`` and ``loss`` as training last
    reported them (``None`` before the first report, or a loss that was not finite), ``spend_usd``
    billed and accrued by ``t`` (:mod:`spotwise.engine.run.curves`)."""

    __tablename__ = "curve_points"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    t: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    spend_usd: Mapped[float] = mapped_column(Float)
    # the run's speed then (revision 0008; None when training could not say): global tokens per
    # second, model FLOPs utilisation against the workers' GPU peak, a rank's peak memory
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    mfu: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobLog(Base):
    """One line the job printed (revision 0006): ``seq`` orders a job's lines (1, 2, ... across its
    clusters and resumes), ``rank`` is ``driver``, a rank number or ``spotwise`` (a note of ours),
    ``node`` the instance that printed it, ``stream`` ``stdout`` or ``stderr``
    (:mod:`spotwise.engine.run.joblogs`)."""

    __tablename__ = "job_logs"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_logs_job_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    seq: Mapped[int] = mapped_column(BigInteger)   # never reused: a chatty job may pass 2**31
    t: Mapped[float] = mapped_column(Float)
    rank: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(128))
    stream: Mapped[str] = mapped_column(String(8))
    line: Mapped[str] = mapped_column(Text)


class SpotObservation(Base):
    """A stretch of ticks in which one run saw spot of ``instance_type`` in ``cloud``/``region`` as
    obtainable (``state`` 1) or not (0), ``[t_start, t_end)`` (revision 0004): the zone history a
    later run's policy is shown (:mod:`spotwise.engine.state.spot_log`)."""

    __tablename__ = "spot_observations"
    __table_args__ = (Index("ix_spot_observations_site", "cloud", "region", "instance_type", "t_end"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cloud: Mapped[str] = mapped_column(String(32))
    region: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(64))
    state: Mapped[int] = mapped_column(Integer)
    t_start: Mapped[float] = mapped_column(Float)
    t_end: Mapped[float] = mapped_column(Float)


class Budget(Base):
    """A spending cap. ``period`` is ``month`` (resets each calendar month in ``timezone``) or
    ``total``. Spend against it is the sum of its reservations (see :mod:`spotwise.engine.work.budgets`)."""

    __tablename__ = "budgets"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    cap_usd: Mapped[float] = mapped_column(Float)
    period: Mapped[str] = mapped_column(String(16), default="month")     # month|total
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    created_at: Mapped[float] = mapped_column(Float, default=time.time)


class BudgetReservation(Base):
    """Money set aside for one launch before it starts. ``reserved`` holds ``amount_usd``;
    ``committed`` holds ``actual_usd`` (the job's ledger spend); ``released`` holds nothing."""

    __tablename__ = "budget_reservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    budget_id: Mapped[str] = mapped_column(ForeignKey("budgets.id", ondelete="CASCADE"), index=True)
    period_key: Mapped[str] = mapped_column(String(16), index=True)     # "2026-11" or "total"
    job_id: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
    amount_usd: Mapped[float] = mapped_column(Float)
    actual_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="reserved")  # reserved|committed|released
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    settled_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Schedule(Base):
    """A cron-scheduled task. ``last_fire_at`` is the newest fire time already handled (launched,
    skipped or refused), so a restarted scheduler never handles one twice."""

    __tablename__ = "schedules"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    task: Mapped[dict] = mapped_column(JSON)
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    budget_per_run: Mapped[float | None] = mapped_column(Float, nullable=True)
    budget_per_month: Mapped[float | None] = mapped_column(Float, nullable=True)
    deadline_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    overlap: Mapped[str] = mapped_column(String(16), default="skip")     # skip|queue
    # restart|resume: what a fire time does when the schedule's previous run ended unfinished
    unfinished: Mapped[str] = mapped_column(String(16), default="restart", server_default="restart")
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    last_fire_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ScheduleRun(Base):
    """One fire time of a schedule and what became of it: ``launched`` (with its job),
    ``queued``, ``skipped`` or ``refused`` (with the reason), then ``finished``."""

    __tablename__ = "schedule_runs"
    __table_args__ = (UniqueConstraint("schedule_id", "fire_at", name="uq_schedule_run_fire"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"), index=True)
    fire_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    reservation_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)


class ApiToken(Base):
    """An API token; only its SHA-256 is stored (the token itself is shown once, at creation)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


def database_url() -> str:
    return setting("SPOTWISE_DATABASE_URL") or f"sqlite:///{home() / 'spotwise.db'}"


def _create_private(url: str) -> None:
    """Create a missing SQLite file with mode 0600 (SQLite gives its -wal/-shm files the same
    mode): the database holds job specs, spend and token hashes, not for other local users."""
    path = url.split("///", 1)[1] if "///" in url else ""
    if not path or path.startswith(":memory:") or os.path.exists(path):
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


@lru_cache(maxsize=8)
def _engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        _create_private(url)
        eng = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            # Let SQLAlchemy emit BEGIN itself (pysqlite's own handling defers it), so a locking
            # transaction can ask for BEGIN IMMEDIATE.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(eng, "begin")
        def _begin(conn) -> None:
            conn.exec_driver_sql(conn.get_execution_options().get("sqlite_begin", "BEGIN"))
    else:
        eng = create_engine(url, pool_pre_ping=True)
    from spotwise.engine.state.migrate import upgrade

    upgrade(eng)
    return eng


def engine() -> Engine:
    return _engine(database_url())


def session() -> Session:
    return sessionmaker(engine(), expire_on_commit=False)()


def is_postgres() -> bool:
    return engine().dialect.name == "postgresql"


@contextmanager
def locked_session() -> Iterator[Session]:
    """A session whose transaction serialises with other writers: ``BEGIN IMMEDIATE`` on SQLite
    (takes the database's write lock up front); on PostgreSQL, lock rows with :func:`lock_row`.
    Commits on success, rolls back on an exception."""
    eng = engine()
    with eng.connect() as conn:
        if eng.dialect.name == "sqlite":
            conn = conn.execution_options(sqlite_begin="BEGIN IMMEDIATE")
        with conn.begin():
            with Session(bind=conn, expire_on_commit=False) as s:
                yield s
                s.flush()


RETRY_ATTEMPTS = 10


def retryable(e: BaseException) -> bool:
    """A write that lost a race and may simply be run again: SQLite's ``database is locked`` /
    ``SQLITE_BUSY_SNAPSHOT`` (a deferred transaction that read, then found another writer had
    committed), PostgreSQL's deadlock / serialization failure."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(e, DBAPIError):
        return False
    text = str(e.orig or e).lower()
    code = getattr(e.orig, "sqlstate", None) or getattr(e.orig, "pgcode", None)
    return "database is locked" in text or "database table is locked" in text or code in ("40P01", "40001")


def write(fn: "Callable[[Session], T]", *, attempts: int = RETRY_ATTEMPTS) -> "T":
    """Run ``fn(s)`` in a :func:`locked_session` and commit; run the whole transaction again when
    it lost a race (:func:`retryable`), with full-jitter backoff.

    Why: the paths that must not fail — a runner recording that its job failed, a reconcile
    marking a job ``lost``, a settlement — are exactly the ones that run when many jobs fail at
    once. SQLite's busy timeout does not cover every case (a transaction that read before it wrote
    gets ``SQLITE_BUSY`` at once rather than waiting), so these writers take the write lock up
    front and retry what is left. ``fn`` must be safe to run again (it re-reads what it changes).
    """
    import random

    from sqlalchemy.exc import DBAPIError

    for attempt in range(1, attempts + 1):
        try:
            with locked_session() as s:
                return fn(s)
        except DBAPIError as e:      # only a driver error can be a lost race; anything else propagates
            if attempt == attempts or not retryable(e):
                raise
            time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** attempt)))
    raise AssertionError("unreachable")


def lock_row(s: Session, model, pk):
    """``SELECT ... FOR UPDATE`` the row (a no-op clause on SQLite, whose whole-database write
    lock :func:`locked_session` already holds)."""
    return s.scalars(select(model).where(model.__mapper__.primary_key[0] == pk).with_for_update()).first()


def jobs_spend(s: Session, job_ids: list[str]) -> dict[str, float]:
    """Spend of many jobs in one aggregate query (a list page must not cost one query per row)."""
    from sqlalchemy import func

    if not job_ids:
        return {}
    rows = s.execute(select(LedgerEntry.job_id, func.sum(LedgerEntry.usd)).where(LedgerEntry.job_id.in_(job_ids))
                     .group_by(LedgerEntry.job_id)).all()
    out = {j: 0.0 for j in job_ids}
    out.update({j: float(v or 0.0) for j, v in rows})
    return out


def job_spend(s: Session, job_id: str) -> float:
    return jobs_spend(s, [job_id])[job_id]
