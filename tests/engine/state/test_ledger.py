"""The ledger bills per second at the launch price, append-only, on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from spotwise.provisioner.base import Node


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    if request.param == "sqlite":
        monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
        yield "sqlite"
        return
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", request.getfixturevalue("pg_database"))
    yield "postgresql"


def _job(job_id: str) -> None:
    from spotwise.engine.state import db

    with db.session() as s:
        s.add(db.Job(id=job_id, name="t", status="running", cloud="local", cluster_id="c", spec={}))
        s.commit()


def _node(iid: str, price: float, market: str, t0: float) -> Node:
    return Node(cloud="local", instance_id=iid, instance_type="local.cpu1", region="local", zone="local-a",
                market=market, usd_per_hour=price, cluster_id="c", job_id="j", launched_at=t0,
                extra={"price_source": "sheet", "price_as_of": "2026-11-22"})


def test_per_second_billing_at_launch_price(database):
    from sqlalchemy import select

    from spotwise.engine.state import db
    from spotwise.engine.state.ledger import Ledger

    _job("j")
    led = Ledger("j")
    t0 = 1_000_000.0
    led.open(_node("a", 3.6, "spot", t0))         # $0.001 per second
    led.open(_node("b", 7.2, "on-demand", t0))    # $0.002 per second
    led.bill(t0 + 10.7)                            # whole seconds only: 10 s each
    assert led.spend(t0 + 10.7) == pytest.approx(11 * 0.001 + 11 * 0.002)   # accrued rounds up
    led.close("a", at=t0 + 20.2)                   # 10.2 s more -> 11 s billed (partial second = full)
    led.close("b", at=t0 + 15.0)                   # exactly 5 s more
    with db.session() as s:
        rows = s.scalars(select(db.LedgerEntry).order_by(db.LedgerEntry.id)).all()
        assert [(r.instance_id, r.seconds) for r in rows] == [("a", 10), ("b", 10), ("a", 11), ("b", 5)]
        assert all(r.price_source == "sheet" and r.price_as_of == "2026-11-22" for r in rows)
        assert db.job_spend(s, "j") == pytest.approx(21 * 0.001 + 15 * 0.002)
        a = s.get(db.NodeRecord, "a")
        assert a.terminated_at == pytest.approx(t0 + 20.2) and a.billed_until == pytest.approx(t0 + 21)
    assert led.hours_by_market() == {"spot": pytest.approx(21 / 3600), "on-demand": pytest.approx(15 / 3600)}
    assert led.rate_usd_per_hour() == 0


def test_close_is_idempotent_and_rate_tracks_open_nodes(database):
    from spotwise.engine.state import db
    from spotwise.engine.state.ledger import Ledger

    _job("j")
    led = Ledger("j")
    led.open(_node("a", 1.0, "spot", 100.0))
    led.open(_node("b", 2.0, "spot", 100.0))
    assert led.rate_usd_per_hour() == 3.0
    led.close("a", at=160.0)
    led.close("a", at=999.0)          # already closed: nothing more billed
    assert led.rate_usd_per_hour() == 2.0
    with db.session() as s:
        assert db.job_spend(s, "j") == pytest.approx(60 / 3600)


def test_a_one_off_charge_is_one_row_counted_in_spend_and_a_resumes_carry_over(database):
    """A checkpoint copy's egress: one 0-second row with its amount, source and date; spend (what
    the cap reads) includes it at once, not the instance hours; a resumed job's ledger carries it;
    an amount that is not a finite number >= 0 is refused and records nothing."""
    from spotwise.engine.state import db
    from spotwise.engine.state.ledger import Ledger, cost_report

    _job("j")
    led = Ledger("j")
    t0 = 1_000_000.0
    led.open(_node("a", 3.6, "spot", t0))
    led.charge("egress/step-6/gs://b/r->az://a/c/r", cloud="gcp", market="egress", usd=0.25,
               source="cloud.google.com/vpc/network-pricing", as_of="2026-11-01", at=t0 + 5)
    assert led.spend(t0 + 10) == pytest.approx(0.25 + 10 * 0.001)
    for bad in (float("nan"), float("inf"), -0.01):
        with pytest.raises(ValueError):
            led.charge("x", cloud="gcp", market="egress", usd=bad, source="s", as_of="d")
    led.close_all()
    assert set(led.hours_by_market()) == {"spot"}          # instance hours only
    rep = cost_report("j")
    [eg] = [r for r in rep["rows"] if r["market"] == "egress"]
    assert (eg["cost_usd"], eg["hours"], eg["price_source"], eg["price_as_of"]) == (
        0.25, 0, "cloud.google.com/vpc/network-pricing", "2026-11-01")
    with db.session() as s:
        assert db.job_spend(s, "j") == pytest.approx(rep["total_usd"])
    assert Ledger("j").carry_over() == pytest.approx(rep["total_usd"])
