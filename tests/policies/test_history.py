"""A run shown the zone's availability before it starts (issue 19): the history windows, the two
engines with history, LanePolicy.prime, SpellBook.add_history, and what history does to spotwise."""

from __future__ import annotations

import numpy as np
import pytest

from spotwise.policies import get_policy
from spotwise.policies.base import Observation
from spotwise.policies.sim.evaluate import evaluate
from spotwise.policies.lanes import IDLE, LanePolicy, Lanes
from spotwise.policies.sim.simulator import SimConfig, history_windows, run_batch, run_reference, start_points, windows
from spotwise.policies.spells import SpellBook, bin_of, load_prior
from spotwise.policies.traces import Trace, load_builtin

PAPER = "aws-1node-avail-2022-10-26"      # 600-s ticks
FIVE_MIN = "aws-4node-preempt-2023-08-03"  # 300-s ticks


# -- history_windows ------------------------------------------------------------------------------
def test_history_windows_are_the_ticks_before_each_start_oldest_first() -> None:
    rng = np.random.default_rng(5)
    avail = rng.random(200) < 0.5
    cfg = SimConfig(task_h=1.0, deadline_h=2.0, restart_h=0.1)   # 12 ticks of 600 s: far shorter than 200
    starts = np.array([0, 1, 7, 30, 150, 199])
    h = history_windows(avail, starts, 10, cfg, 600)
    assert h.shape == (6, 10) and h.dtype == np.int8
    for i, s in enumerate(starts):
        for j in range(10):
            k = s - 10 + j
            assert h[i, j] == (int(avail[k]) if k >= 0 else -1), (s, j)
    assert (h[0] == -1).all()                       # nothing before tick 0
    assert (h[1, :9] == -1).all() and h[1, 9] == int(avail[0])
    assert set(np.unique(h[3:])) <= {0, 1}          # fully inside the trace: no unknowns


def test_history_never_contains_the_start_or_later() -> None:
    cfg = SimConfig(task_h=1.0, deadline_h=2.0, restart_h=0.1)
    for s in (1, 20, 57):
        avail = np.zeros(100, dtype=bool)
        avail[s:] = True                            # spot from the start on: none of it is history
        h = history_windows(avail, np.array([s]), 30, cfg, 600)
        assert not (h == 1).any(), s
        assert (h[0, -min(s, 30):] == 0).all()


def test_history_is_empty_where_the_trace_is_shorter_than_the_job_window() -> None:
    cfg = SimConfig(task_h=1.0, deadline_h=2.0, restart_h=0.1)   # 12 ticks of 600 s
    avail = np.ones(12, dtype=bool)                              # exactly the window: starts would wrap
    h = history_windows(avail, np.array([0, 5, 11]), 8, cfg, 600)
    assert h.shape == (3, 8) and (h == -1).all()
    assert history_windows(np.ones(13, dtype=bool), np.array([5]), 8, cfg, 600)[0, -1] == 1
    assert history_windows(avail, np.array([3]), 0, cfg, 600).shape == (1, 0)


# -- the two engines agree with history -----------------------------------------------------------
def _with_history(tr: Trace, cfg: SimConfig, hours: float, n: int):
    s = np.concatenate([start_points(tr, cfg, n, seed=7), [0, 5]])   # and two starts with partial history
    w = windows(tr.data, s, cfg.horizon_ticks(tr.gap_seconds))
    h = history_windows(tr.data, s, int(round(hours * 3600 / tr.gap_seconds)), cfg, tr.gap_seconds)
    return w, h


@pytest.mark.parametrize("name", ["spotwise", "uniform-progress"])
@pytest.mark.parametrize("collection,index", [(PAPER, 2), (PAPER, 1), (FIVE_MIN, 0)])
def test_engines_agree_with_history(name: str, collection: str, index: int) -> None:
    tr = load_builtin(collection)[index]
    cfg = SimConfig(task_h=12.0, deadline_h=16.0, restart_h=0.2)
    w, h = _with_history(tr, cfg, 48.0, 18)
    assert (h == -1).any() and (h >= 0).any()
    pol = get_policy(name)
    ref = run_reference(pol, w, cfg, tr.gap_seconds, history=h)
    vec = run_batch(pol, w, cfg, tr.gap_seconds, history=h)
    np.testing.assert_array_equal(vec.cost_usd, ref.cost_usd)
    np.testing.assert_array_equal(vec.finish_h, ref.finish_h)
    np.testing.assert_array_equal(vec.on_demand_h, ref.on_demand_h)
    np.testing.assert_allclose(vec.on_demand_work_h, ref.on_demand_work_h, atol=1e-9)


def test_history_reaches_both_engines_for_spotwise() -> None:
    """Not vacuous: on these traces spotwise's outcomes with history differ from those without, in
    both engines alike (so the agreement above is not two engines ignoring it)."""
    tr = load_builtin(PAPER)[1]
    cfg = SimConfig(task_h=12.0, deadline_h=16.0, restart_h=0.2)
    w, h = _with_history(tr, cfg, 48.0, 18)
    pol = get_policy("spotwise")
    base_b = run_batch(pol, w, cfg, tr.gap_seconds)
    hist_b = run_batch(pol, w, cfg, tr.gap_seconds, history=h)
    base_r = run_reference(pol, w, cfg, tr.gap_seconds)
    hist_r = run_reference(pol, w, cfg, tr.gap_seconds, history=h)
    assert (hist_b.cost_usd != base_b.cost_usd).any()
    np.testing.assert_array_equal(hist_b.cost_usd != base_b.cost_usd, hist_r.cost_usd != base_r.cost_usd)


# -- LanePolicy.prime -----------------------------------------------------------------------------
class _Ages(LanePolicy):
    """Records the streak / outage ages it is shown at the first tick; always idles."""

    name = "ages"

    def __init__(self) -> None:
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []
        super().__init__()

    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        assert v.up_h is not None and v.down_h is not None
        self.seen.append((np.array(v.up_h, dtype=float), np.array(v.down_h, dtype=float)))
        return np.full(v.has_spot.shape, IDLE, dtype=np.int8)


def _first_tick_decide(history: np.ndarray, has: bool, tick_h: float) -> tuple[float, float]:
    pol = _Ages()
    pol.observe_history(history[history >= 0], tick_h)
    pol.decide(Observation(elapsed_h=0.0, deadline_h=4.0, task_h=1.0, work_done_h=0.0, restart_h=0.1,
                           tick_h=tick_h, region="z", spot_available={"z": has}))
    up, down = pol.seen[0]
    return float(up[0]), float(down[0])


def test_prime_starts_the_streak_at_the_history_s_last_spell() -> None:
    tick_h = 600 / 3600
    # histories ending in k = 3, 1, 5 ticks of spot, one of 2 ticks of outage, one unknown at the front
    hist = np.array([[0, 1, 0, 0, 1, 1, 1],
                     [1, 1, 1, 1, 1, 0, 1],
                     [-1, -1, 1, 1, 1, 1, 1],
                     [1, 1, 1, 1, 1, 0, 0],
                     [0, 0, 0, 0, 0, 1, 1]], dtype=np.int8)
    first = np.array([[1], [1], [1], [0], [0]], dtype=bool)           # the job's first tick
    avail = np.repeat(first, 3, axis=1)
    cfg = SimConfig(task_h=0.1, deadline_h=0.5, restart_h=0.0)
    pol = _Ages()
    run_batch(pol, avail, cfg, 600, history=hist)
    up, down = pol.seen[0]
    want_up = np.array([4, 2, 6, 0, 0]) * tick_h
    want_down = np.array([0, 0, 0, 3, 1]) * tick_h   # 2 ticks of outage go on; a new one after spot
    np.testing.assert_allclose(up, want_up, atol=1e-12)
    np.testing.assert_allclose(down, want_down, atol=1e-12)
    for i in range(len(hist)):                       # the one-lane decide agrees with the lane engine
        assert _first_tick_decide(hist[i], bool(first[i, 0]), tick_h) == pytest.approx((want_up[i], want_down[i]))


def test_an_unknown_history_changes_nothing() -> None:
    pol = get_policy("spotwise")
    assert isinstance(pol, LanePolicy)
    st, fresh = pol.new_state(4), pol.new_state(4)
    pol.prime(st, np.full((4, 50), -1, dtype=np.int8), 600 / 3600)
    for k in ("_up_since", "_down_since", "_last_has"):
        np.testing.assert_array_equal(st[k], fresh[k])
    for kind in ("streak", "outage"):
        np.testing.assert_array_equal(st["_book"].count[kind], fresh["_book"].count[kind])
    tr = load_builtin(PAPER)[1]
    cfg = SimConfig(task_h=12.0, deadline_h=16.0, restart_h=0.2)
    s = start_points(tr, cfg, 20, seed=2)
    w = windows(tr.data, s, cfg.horizon_ticks(tr.gap_seconds))
    none = run_batch(pol, w, cfg, tr.gap_seconds)
    blank = run_batch(pol, w, cfg, tr.gap_seconds, history=np.full((len(s), 288), -1, dtype=np.int8))
    empty = run_batch(pol, w, cfg, tr.gap_seconds, history=np.zeros((len(s), 0), dtype=np.int8))
    for other in (blank, empty):
        np.testing.assert_array_equal(other.cost_usd, none.cost_usd)
        np.testing.assert_array_equal(other.finish_h, none.finish_h)
    ref = run_reference(pol, w[:5], cfg, tr.gap_seconds, history=np.full((5, 288), -1, dtype=np.int8))
    np.testing.assert_array_equal(ref.cost_usd, none.cost_usd[:5])


# -- SpellBook.add_history ------------------------------------------------------------------------
def test_add_history_counts_the_complete_spells_only() -> None:
    row = [-1, -1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 1]   # censored 1 1 | 0 0 0 | 1 | 0 0 | censored 1 1 1
    book = SpellBook(load_prior(), 3, 5.0)
    hist = np.array([row, [-1] * len(row), [1] * 6 + [0] * 7], dtype=np.int8)
    book.add_history(hist, 0.5, weight=2.0)
    np.testing.assert_allclose(book.seen("outage"), [4.0, 0.0, 0.0])   # 2 outages x weight 2
    np.testing.assert_allclose(book.seen("streak"), [2.0, 0.0, 0.0])   # 1 streak x weight 2
    np.testing.assert_allclose(book.total["outage"][0].sum(), 2.0 * (1.5 + 1.0))
    np.testing.assert_allclose(book.total["streak"][0].sum(), 2.0 * 0.5)
    assert book.count["outage"][0, bin_of(np.array(1.5))] == 2.0 and book.count["outage"][0, bin_of(np.array(1.0))] == 2.0
    # the spell the history ends with goes on into the job: it ends (once, weight 1) when the job sees it end
    book.observe(np.array([0, 1, 1]), 0.0)
    np.testing.assert_allclose(book.seen("streak"), [3.0, 0.0, 0.0])
    np.testing.assert_allclose(book.total["streak"][0].sum(), 2.0 * 0.5 + 1.5)   # 3 ticks before + none in the job
    np.testing.assert_allclose(book.seen("outage"), [4.0, 0.0, 1.0])          # lane 2's 3.5-h outage ended
    np.testing.assert_allclose(book.total["outage"][2].sum(), 3.5)


# -- what history does to spotwise ----------------------------------------------------------------
def _first_on_demand_tick(history: np.ndarray | None) -> tuple[int, float]:
    cfg = SimConfig(task_h=12.0, deadline_h=16.0, restart_h=0.2)
    horizon = cfg.horizon_ticks(600)
    row = np.array(([1] * 12 + [0] * 18 + [1] * horizon)[:horizon], dtype=bool)   # a 3-h outage after 2 h
    pol = get_policy("spotwise")
    markets: list[str] = []
    decide = pol.decide

    def spy(obs: Observation):
        d = decide(obs)
        markets.append(d.market)
        return d

    pol.decide = spy  # type: ignore[method-assign]
    res = run_reference(pol, row[None], cfg, 600, history=None if history is None else history[None])
    batch = run_batch(get_policy("spotwise"), row[None], cfg, 600,
                      history=None if history is None else history[None])
    assert batch.cost_usd[0] == res.cost_usd[0]
    return markets.index("on-demand"), float(res.cost_usd[0])


def test_a_history_of_long_outages_makes_spotwise_buy_on_demand_sooner() -> None:
    long_outages = np.array(([1] * 18 + [0] * 48) * 4 + [1] * 18, dtype=np.int8)   # 3 h up, 8 h down; 47 h
    short_outages = np.array(([1] * 18 + [0] * 1) * 14 + [1] * 18, dtype=np.int8)  # 3 h up, 10 min down
    without, cost_without = _first_on_demand_tick(None)
    assert without > 12                                   # it waits out part of the outage either way
    sooner, cost_long = _first_on_demand_tick(long_outages)
    assert sooner < without                               # the zone's outages last: stop waiting sooner
    assert cost_long > cost_without                       # (here spot came back: the caution cost money)
    assert _first_on_demand_tick(short_outages)[0] == without   # short outages say nothing about a 1-h+ one


# -- invariants with history on -------------------------------------------------------------------
def test_no_misses_and_the_cost_bound_with_a_week_of_history() -> None:
    traces = [t for t in load_builtin() if t.gap_seconds >= 150]
    cfg = SimConfig(task_h=48.0, deadline_h=48.0 / 0.9, restart_h=0.2)
    sw = evaluate("spotwise", traces, cfg, starts=3, seed=0, history_h=168.0)
    od = evaluate("on-demand", traces, cfg, starts=3, seed=0)
    assert [r.trace.trace_id for r in sw] == [r.trace.trace_id for r in od]
    for a, b in zip(sw, od):
        np.testing.assert_array_equal(a.runs.starts, b.runs.starts)
        assert int(a.runs.missed.sum()) == 0, a.trace.trace_id
        bound = b.runs.cost_usd * 1.05 + cfg.spot_price * a.trace.tick_h + 1e-9
        assert (a.runs.cost_usd <= bound).all(), (a.trace.trace_id, a.runs.cost_usd, bound)


@pytest.mark.parametrize("name", ["spotwise", "uniform-progress"])
def test_evaluate_with_zero_history_is_bit_identical(name: str) -> None:
    traces = [load_builtin(PAPER)[1], load_builtin(FIVE_MIN)[0]]
    cfg = SimConfig(task_h=12.0, deadline_h=16.0, restart_h=0.2)
    plain = evaluate(name, traces, cfg, starts=15, seed=4)
    zero = evaluate(name, traces, cfg, starts=15, seed=4, history_h=0)
    week = evaluate(name, traces, cfg, starts=15, seed=4, history_h=168.0)
    for a, b in zip(plain, zero):
        for f in ("cost_usd", "finish_h", "on_demand_h", "spot_h", "on_demand_work_h", "preemptions", "starts"):
            np.testing.assert_array_equal(getattr(a.runs, f), getattr(b.runs, f))
    if name == "spotwise":   # and history_h does reach evaluate's engine
        assert any((a.runs.cost_usd != c.runs.cost_usd).any() for a, c in zip(plain, week))
