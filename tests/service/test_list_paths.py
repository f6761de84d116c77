"""The batched paths the list endpoints use give the same answers as the one-at-a-time ones, and
the token cache never outlives a revocation in the process that revoked."""

from __future__ import annotations

import time

import pytest

from spotwise.engine.work import budgets, schedules
from spotwise.engine.state import db
from spotwise.service import auth


def _ledger(s, job_id: str, usd: float, t: float) -> None:
    s.add(db.LedgerEntry(job_id=job_id, instance_id=f"i-{job_id}", cloud="local", market="spot", start=t,
                         end=t + 1, seconds=1, usd_per_hour=usd * 3600, usd=usd, price_source="t", price_as_of="t"))


def test_jobs_spend_matches_job_spend(database):
    now = time.time()
    with db.session() as s:
        for j in ("a", "b", "c"):
            s.add(db.Job(id=j, name=j, status="succeeded", cloud="local", spec={}, created_at=now))
        s.flush()
        for k, (j, usd) in enumerate([("a", 0.25), ("a", 0.5), ("b", 1.0)]):
            _ledger(s, j, usd, now + k)
        s.commit()
        many = db.jobs_spend(s, ["a", "b", "c"])
        assert many == {j: pytest.approx(db.job_spend(s, j)) for j in ("a", "b", "c")}
        assert many["a"] == pytest.approx(0.75) and many["c"] == 0.0
        assert db.jobs_spend(s, []) == {}


def test_budget_statuses_match_status(database):
    budgets.create_budget("x", cap_usd=10.0)
    budgets.create_budget("y", cap_usd=3.0, period="total")
    budgets.create_budget("z", cap_usd=1.0, timezone="Europe/Berlin")
    r = budgets.reserve("x", 4.0, job_id="j1")
    budgets.settle(r, 1.25)
    budgets.reserve("x", 2.0, job_id="j2")
    budgets.reserve("y", 1.0)
    with db.session() as s:
        st = budgets.statuses(s)
        assert list(st) == ["x", "y", "z"]
        for bid in st:   # what the list shows is what reserve_in checks against
            assert (st[bid].reserved_usd, st[bid].spent_usd) == budgets._held(s, bid, st[bid].period_key)
            assert st[bid].to_dict() == budgets.status(bid, s=s).to_dict()
        assert (st["x"].spent_usd, st["x"].reserved_usd) == (1.25, 2.0)
        assert budgets.statuses(s, ["y"])["y"].reserved_usd == 1.0
        assert budgets.statuses(s, []) == {}
    assert [b.id for b in budgets.list_budgets()] == ["x", "y", "z"]


@pytest.mark.parametrize("cron,tz", [("0 2 * * *", "UTC"), ("*/7 * * * *", "Europe/Berlin"),
                                     ("30 1 * * 0", "America/New_York")])
def test_cached_next_fire_equals_croniter(cron, tz):
    t0 = 1_700_000_000.0
    for k in range(0, 200):
        after = t0 + k * 37.3   # crosses minute boundaries and exact fire times
        assert schedules.next_fire(cron, tz, after) == schedules._next_fire(cron, tz, after)
    exact = schedules._next_fire(cron, tz, t0)    # a fire time itself: the next one is strictly after
    assert schedules.next_fire(cron, tz, exact) == schedules._next_fire(cron, tz, exact) > exact


def test_list_schedules_reports_month_budgets(database):
    schedules.create_schedule({"name": "nightly"}, cron="0 2 * * *", budget_per_month=5.0, name="n1")
    schedules.create_schedule({"name": "nightly"}, cron="0 3 * * *", name="n2")
    out = {d["name"]: d for d in schedules.list_schedules()}
    assert out["n1"]["month_budget"]["cap_usd"] == 5.0 and out["n2"]["month_budget"] is None
    with db.session() as s:
        one = schedules.to_dict(schedules.get("n1", s), s=s)
    assert one["month_budget"] == out["n1"]["month_budget"]


def test_token_cache_respects_revocation(database):
    tok = auth.create_token("t")
    assert auth.verify(tok) and auth.verify(tok)     # the second answer comes from the cache
    auth.revoke(auth.list_tokens()[0]["id"])
    assert not auth.verify(tok)
    assert not auth.verify("sw_" + "x" * 43)


def test_freeze_startup_heap_loads_the_catalog_and_freezes(home):
    import gc

    from spotwise.pricing import catalog
    from spotwise.service.app import freeze_startup_heap

    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert catalog._DEFAULT is not None
    finally:
        gc.unfreeze()
