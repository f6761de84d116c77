"""Migrations, the append-only ledger and budget reservations, on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest
from sqlalchemy import inspect, text

from spotwise.engine.work import budgets
from spotwise.engine.state import db
from spotwise.engine.state.migrate import current_revision, head_revision


def test_upgrade_head_on_first_use(database):
    eng = db.engine()
    assert current_revision(eng) == head_revision() == "0008"
    names = set(inspect(eng).get_table_names())
    assert {"owner_host", "owner_started", "lease_expires_at", "node_deadline"} <= {
        c["name"] for c in inspect(eng).get_columns("jobs")}
    assert {"jobs", "nodes", "ledger", "events", "budgets", "budget_reservations", "schedules",
            "schedule_runs", "api_tokens", "spot_observations", "curve_points", "job_logs", "alembic_version"} <= names


def _job(s, job_id="j1"):
    s.add(db.Job(id=job_id, name="t", status="running", cloud="local", spec={}, created_at=time.time()))


def test_ledger_is_append_only(database):
    with db.session() as s:
        _job(s)
        s.add(db.LedgerEntry(job_id="j1", instance_id="i", cloud="local", market="spot", start=0, end=1,
                             seconds=1, usd_per_hour=3.6, usd=0.001, price_source="x", price_as_of="y"))
        s.commit()
    for stmt in ("UPDATE ledger SET usd = 0", "DELETE FROM ledger"):
        with pytest.raises(Exception, match="append-only"):
            with db.engine().begin() as c:
                c.execute(text(stmt))
    with db.session() as s:
        assert db.job_spend(s, "j1") == pytest.approx(0.001)


def test_legacy_database_is_stamped_then_upgraded(home, monkeypatch):
    """A database made by the old ``create_all`` (no alembic_version) keeps its rows."""
    from sqlalchemy import create_engine

    url = f"sqlite:///{home / 'legacy.db'}"
    eng = create_engine(url)
    for t in ("jobs", "nodes", "ledger", "events"):
        db.Base.metadata.tables[t].create(eng)
    with eng.begin() as c:
        c.execute(text("INSERT INTO jobs (id, name, status, cloud, spec, created_at, steps_completed, preemptions, "
                       "resumes) VALUES ('old', 'n', 'succeeded', 'local', '{}', 0, 0, 0, 0)"))
    eng.dispose()
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", url)
    try:
        assert current_revision(db.engine()) == "0008"
        with db.session() as s:
            assert s.get(db.Job, "old").status == "succeeded"
    finally:
        db.engine().dispose()
        db._engine.cache_clear()


def test_reserve_settle_release(database):
    budgets.create_budget("team", cap_usd=10.0)
    r1 = budgets.reserve("team", 4.0, job_id="a")
    r2 = budgets.reserve("team", 5.0, job_id="b")
    with pytest.raises(budgets.BudgetExceeded, match=r"\$1.0000 left"):
        budgets.reserve("team", 2.0)
    budgets.settle(r1, 1.5)          # spent less than reserved: frees the rest
    budgets.settle(r1, 99.0)         # idempotent: a second settle changes nothing
    budgets.release(r2)
    st = budgets.status("team")
    assert (st.spent_usd, st.reserved_usd, st.remaining_usd) == (1.5, 0.0, 8.5)
    budgets.reserve("team", 8.5)
    with pytest.raises(budgets.BudgetExceeded):
        budgets.reserve("team", 0.01)


def test_month_period_uses_the_budget_timezone(database):
    budgets.create_budget("berlin", cap_usd=1.0, timezone="Europe/Berlin")
    # 2026-01-31 23:30 UTC is already February in Berlin
    t = 1769902200.0
    assert budgets.period_key("month", "Europe/Berlin", t) == "2026-02"
    assert budgets.period_key("month", "UTC", t) == "2026-01"
    budgets.reserve("berlin", 1.0, at=t - 86400 * 2)   # January (Berlin)
    budgets.reserve("berlin", 1.0, at=t)               # February: a fresh month
    with pytest.raises(budgets.BudgetExceeded):
        budgets.reserve("berlin", 0.5, at=t)


def test_bad_budget_input_names_the_field(database):
    from spotwise.errors import InputError

    with pytest.raises(InputError, match="cap_usd: got -1"):
        budgets.create_budget("x", cap_usd=-1)
    with pytest.raises(InputError, match="timezone: got 'Mars/Base'"):
        budgets.create_budget("x", cap_usd=1, timezone="Mars/Base")


N_WORKERS = 12
AMOUNT = 1.0
CAP = 5.0


def test_concurrent_threads_never_overspend(database):
    budgets.create_budget("shared", cap_usd=CAP)
    barrier = threading.Barrier(N_WORKERS)
    ok, refused, errors = [], [], []

    def worker(i):
        barrier.wait()
        try:
            ok.append(budgets.reserve("shared", AMOUNT, job_id=f"t{i}"))
        except budgets.BudgetExceeded:
            refused.append(i)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(N_WORKERS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(ok) == int(CAP / AMOUNT) and len(refused) == N_WORKERS - len(ok)
    assert budgets.status("shared").held_usd == pytest.approx(CAP)


def _proc_worker(url, home, start_at, q):
    os.environ["SPOTWISE_DATABASE_URL"] = url
    os.environ["SPOTWISE_HOME"] = home
    from spotwise.engine.work import budgets as b

    b.db._engine.cache_clear()     # forked: never touch the parent's pooled connections
    b.db.engine()
    while time.time() < start_at:
        time.sleep(0.001)
    for _ in range(3):
        try:
            b.reserve("shared", AMOUNT)
            q.put("ok")
        except b.BudgetExceeded:
            q.put("refused")
        except Exception as e:  # noqa: BLE001
            q.put(f"error {e!r}")


def test_concurrent_processes_never_overspend(database, home):
    budgets.create_budget("shared", cap_usd=CAP)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start_at = time.time() + 1.5
    procs = [ctx.Process(target=_proc_worker, args=(database, str(home), start_at, q)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in range(12)]
    for p in procs:
        p.join(timeout=60)
    assert all(r in ("ok", "refused") for r in results), results
    assert results.count("ok") == int(CAP / AMOUNT)
    assert budgets.status("shared").held_usd == pytest.approx(CAP)
