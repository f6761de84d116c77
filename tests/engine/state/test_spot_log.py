"""What runs saw of spot, recorded per site and instance type, and shown to a later run's policy
(:mod:`spotwise.engine.state.spot_log`), on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from sqlalchemy import select

from spotwise.engine.state import db
from spotwise.engine.run.market_watch import history_key, show_recorded_history
from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator
from spotwise.engine.state.spot_log import DOWN, FLUSH_S, UP, SiteKey, SpotLog, recorded_history
from spotwise.errors import InputError
from spotwise.policies.spells import SpellBook, known_stretches, load_prior
from spotwise.policies.rules.survival_policy import SpotwiseSurvival
from spotwise.provisioner.base import Node
from spotwise.taskspec import parse_taskspec

KEY = SiteKey("aws", "us-east-1", "p4d.24xlarge")
T0 = 1_700_000_000.0
TICK = 5.0


def _play(log: SpotLog, states, key=KEY, t0=T0):
    """Observe ``states`` (1 / 0 / None) at consecutive ticks from ``t0``; returns the time after."""
    t = t0
    for st in states:
        log.observe(key, st, t)
        t += log.tick_s
    return t


def _rows(key=KEY):
    with db.session() as s:
        T = db.SpotObservation
        return s.execute(select(T.job_id, T.state, T.t_start, T.t_end).where(
            T.cloud == key.cloud, T.region == key.region, T.instance_type == key.instance_type)
            .order_by(T.t_start)).all()


def test_stretches_round_trip_into_a_history(database) -> None:
    log = SpotLog("job-a", TICK)
    states = [UP] * 4 + [DOWN] * 3 + [None] * 2 + [UP] * 2
    end = _play(log, states)
    log.close()
    rows = _rows()
    assert [(r.state, r.t_start, r.t_end) for r in rows] == [
        (UP, T0, T0 + 4 * TICK), (DOWN, T0 + 4 * TICK, T0 + 7 * TICK), (UP, T0 + 9 * TICK, T0 + 11 * TICK)]
    assert {r.job_id for r in rows} == {"job-a"}
    hist = recorded_history(KEY, now=end + 3 * TICK, hours=16 * TICK / 3600, tick_s=TICK)
    # 16 ticks ending 3 ticks after the last one: 2 before the first, then what was seen, then 3 after
    want = [-1, -1] + [1 if s == UP else 0 if s == DOWN else -1 for s in states] + [-1] * 3
    assert hist.tolist() == want
    # another site or instance type saw nothing
    assert (recorded_history(SiteKey("aws", "us-east-1", "p5.48xlarge"), now=end, hours=1, tick_s=TICK) == -1).all()
    assert (recorded_history(SiteKey("aws", "us-west-2", "p4d.24xlarge"), now=end, hours=1, tick_s=TICK) == -1).all()


def test_a_missed_tick_starts_a_new_stretch_and_a_long_one_is_written_as_it_goes(database) -> None:
    log = SpotLog("job-b", TICK)
    log.observe(KEY, UP, T0)
    log.observe(KEY, UP, T0 + TICK)
    log.observe(KEY, UP, T0 + 10 * TICK)          # nothing seen for 8 ticks in between: not one stretch
    assert [(r.t_start, r.t_end) for r in _rows()] == [(T0, T0 + 2 * TICK), (T0 + 10 * TICK, T0 + 11 * TICK)]
    # a stretch that goes on is written at least every FLUSH_S, so a crash loses at most that much
    ticks = int(3 * FLUSH_S / TICK)
    _play(log, [UP] * ticks, t0=T0 + 11 * TICK)
    last_tick = T0 + (10 + ticks) * TICK
    newest = _rows()[-1]
    assert newest.t_start == T0 + 10 * TICK
    assert last_tick + TICK - newest.t_end <= FLUSH_S
    assert newest.t_end > T0 + 10 * TICK + 2 * FLUSH_S
    log.close()
    assert _rows()[-1].t_end == last_tick + TICK


def test_where_two_runs_disagree_obtainable_wins(database) -> None:
    a, b = SpotLog("job-a", TICK), SpotLog("job-b", TICK)
    _play(a, [DOWN] * 6)
    _play(b, [None, None, UP, UP, None, None])
    a.close()
    b.close()
    hist = recorded_history(KEY, now=T0 + 6 * TICK, hours=6 * TICK / 3600, tick_s=TICK)
    assert hist.tolist() == [0, 0, 1, 1, 0, 0]


def test_bad_arguments_are_refused(database) -> None:
    with pytest.raises(ValueError, match="tick_s"):
        SpotLog("j", 0)
    with pytest.raises(ValueError, match="state"):
        SpotLog("j", TICK).observe(KEY, 2, T0)
    with pytest.raises(ValueError, match="hours"):
        recorded_history(KEY, now=T0, hours=-1, tick_s=TICK)
    assert recorded_history(KEY, now=T0, hours=0, tick_s=TICK).size == 0


def test_a_database_that_cannot_be_written_is_logged_not_fatal(home, monkeypatch, caplog) -> None:
    # a PostgreSQL database that does not exist: every write fails for real
    monkeypatch.setenv("SPOTWISE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/sw_no_such_db_0")
    log = SpotLog("job-x", TICK)
    with caplog.at_level(logging.WARNING, logger="spotwise.spot_log"):
        _play(log, [UP, UP, DOWN])
        log.close()
    assert log.failed_writes >= 2 and "could not record spot availability" in caplog.text
    pol = SpotwiseSurvival()
    with caplog.at_level(logging.WARNING, logger="spotwise.orchestrator"):
        assert show_recorded_history(pol, KEY, hours=1, tick_s=TICK, now=T0) is None
    assert "not shown to the policy" in caplog.text
    db._engine.cache_clear()


# -- the survival model reads a history with gaps ---------------------------------------------------
def test_unknown_ticks_cut_spells_instead_of_joining_them() -> None:
    assert [s.tolist() for s in known_stretches(np.array([-1, 1, 1, -1, 0, 0, 1, -1]))] == [[1, 1], [0, 0, 1]]
    tick_h = 0.5
    book = SpellBook(load_prior(), n=1, weight=5.0)
    # 1 1 0 0 1 | gap | 0 1 1 0 : complete spells: the outage 0 0 (1 h) and the streak 1 1 (1 h); the
    # 1 ... 1 either side of the gap is not one 2-tick streak, and 1 1 at the start is censored
    book.add_history(np.array([[1, 1, 0, 0, 1, -1, -1, 0, 1, 1, 0]]), tick_h)
    assert book.seen("outage").tolist() == [1.0] and book.seen("streak").tolist() == [1.0]
    assert book.total["outage"].sum() == pytest.approx(1.0) and book.total["streak"].sum() == pytest.approx(1.0)
    assert book._last[0] == 0 and book._since[0] == pytest.approx(-0.5)   # the final 0 goes on into the job
    # a history that ends in unknown ticks carries no spell into the job
    tail = SpellBook(load_prior(), n=1, weight=5.0)
    tail.add_history(np.array([[1, 0, 0, 1, 1, -1]]), tick_h)
    assert tail._last[0] == -1 and tail.seen("outage").tolist() == [1.0]


def test_unknown_ticks_before_the_start_change_nothing() -> None:
    """The simulator's histories are unknown only before the trace starts: same counts as before."""
    rng = np.random.default_rng(0)
    row = (rng.random(400) < 0.7).astype(np.int8)
    a, b = SpellBook(load_prior(), n=1, weight=5.0), SpellBook(load_prior(), n=1, weight=5.0)
    a.add_history(row[None, :], 0.1)
    b.add_history(np.concatenate([np.full(50, -1, dtype=np.int8), row])[None, :], 0.1)
    for k in ("streak", "outage"):
        np.testing.assert_array_equal(a.count[k], b.count[k])
        np.testing.assert_allclose(a.total[k], b.total[k])
    assert a._last[0] == b._last[0] and a._since[0] == b._since[0]


# -- the orchestrator: records each tick's evidence, shows a later run what was recorded -------------
TASK = {"name": "rec-run", "policy": "spotwise", "deadline_hours": 2.0, "training": {"steps": 5}}


def _node(iid: str, market: str, o) -> Node:
    return Node(cloud=o.cloud, instance_id=iid, instance_type=o.instance_type, region=o.region, zone=o.zone,
                market=market, usd_per_hour=1.0, cluster_id="c", job_id="j")


def test_the_orchestrator_records_what_it_saw_and_the_next_run_is_shown_it(database) -> None:
    o = Orchestrator(parse_taskspec(TASK), LaunchOptions(policy_interval_s=TICK))
    assert o.history is None                       # nothing recorded yet
    key = history_key(o.plan)
    spot = next(of for of in o.plan.offers if of.market.value == "spot")
    assert key == SiteKey(spot.cloud, spot.region, spot.instance_type)
    now = time.time() - 90 * TICK       # the next run reads the last hours before its own start
    # a spot worker running: obtainable; it is preempted and not replaced: not obtainable (one tick),
    # then nothing known; then a spot launch there answers a capacity error: not obtainable while the
    # orchestrator remembers it (60 s)
    o.fleet.nodes["w1"] = _node("w1", "spot", spot)
    for i in range(40):
        o.watch.record_tick(now + i * TICK, o.fleet.spot_sites())
    del o.fleet.nodes["w1"]
    o.watch.spot_lost_t[key] = now + 40 * TICK - 1
    o.watch.record_tick(now + 40 * TICK, o.fleet.spot_sites())
    for i in range(41, 50):
        o.watch.record_tick(now + i * TICK, o.fleet.spot_sites())
    o.watch.spot_fail_t[key] = now + 50 * TICK
    for i in range(50, 80):
        o.watch.record_tick(now + i * TICK, o.fleet.spot_sites())
    # an on-demand worker is no evidence about spot
    o.fleet.nodes["w2"] = _node("w2", "on-demand", spot)
    for i in range(80, 90):
        o.watch.record_tick(now + i * TICK, o.fleet.spot_sites())
    o.watch.close()
    hist = recorded_history(key, now=now + 90 * TICK, hours=90 * TICK / 3600, tick_s=TICK)
    want = [1] * 40 + [0] + [-1] * 9 + [0] * 12 + [-1] * 28
    assert hist.tolist() == want
    # the next run at that site is shown it, and its report says so
    o2 = Orchestrator(parse_taskspec(TASK), LaunchOptions(policy_interval_s=TICK))
    assert o2.history is not None and o2.history["source"] == "recorded" and o2.history["site"] == str(key)
    assert o2.history["known_ticks"] == 53
    book = o2.steering.policy._state["_book"]
    assert book.seen("outage")[0] == 0 and book.seen("streak")[0] == 0   # no spell both starts and ends known
    assert o2.history["obtainable_share"] == pytest.approx(40 / 53, abs=1e-4)
    # spot_history_hours 0 turns it off; a task's own file wins over the record
    o3 = Orchestrator(parse_taskspec({**TASK, "spot_history_hours": 0}), LaunchOptions(policy_interval_s=TICK))
    assert o3.history is None


def test_a_recorded_history_with_complete_spells_teaches_the_policy(database) -> None:
    key = SiteKey("local", "local", "x")
    log = SpotLog("old", TICK)
    pattern = ([UP] * 30 + [DOWN] * 6) * 5 + [UP] * 10
    end = _play(log, pattern, key=key)
    log.close()
    pol = SpotwiseSurvival()
    shown = show_recorded_history(pol, key, hours=1, tick_s=TICK, now=end)
    assert shown is not None and shown["known_ticks"] == len(pattern)
    book = pol._state["_book"]
    assert book.seen("outage")[0] == 5 and book.seen("streak")[0] == 4
    assert pol._state["_last_has"][0] == 1 and pol._state["_up_since"][0] == pytest.approx(-10 * TICK / 3600)
    assert show_recorded_history(SpotwiseSurvival(), key, hours=0, tick_s=TICK, now=end) is None


def test_spot_history_hours_is_validated() -> None:
    with pytest.raises(InputError) as e:
        parse_taskspec({**TASK, "spot_history_hours": -1})
    assert [p.field for p in e.value.problems] == ["spot_history_hours"]


def test_a_write_that_waits_on_another_writer_is_not_lost(sqlite_db, home) -> None:
    """Another connection holds SQLite's write lock (the ledger, the curves) while the log moves a
    stretch's end: the log waits for it and writes, instead of reading first and then being told
    ``database is locked`` once the other commits (seen as a warning on a local launch)."""
    import sqlite3
    import threading

    log = SpotLog("job-a", TICK)
    _play(log, [UP] * 2)                       # the stretch's row exists: the next write moves its end
    assert len(_rows()) == 1
    other = sqlite3.connect(home / "spotwise.db", isolation_level=None, timeout=30)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE spot_observations SET t_start = t_start")
    done = threading.Event()
    writer = threading.Thread(target=lambda: (log.close(), done.set()), daemon=True)
    writer.start()
    assert not done.wait(0.5)                 # it waits on the lock held above
    other.execute("COMMIT")
    other.close()
    writer.join(60)
    assert done.is_set() and log.failed_writes == 0
    assert [(r.state, r.t_end) for r in _rows()] == [(UP, T0 + 2 * TICK)]
