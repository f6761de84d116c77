"""The decision table solved under the spell model and the ``spotwise-value`` policy that reads it.

Invariants (issue 19's): no deadline missed that on-demand alone could meet, spend at most the spend
guard's bound (1.05 x on-demand alone + one spot tick), a budget cap respected through
``BudgetCapped``, every decision with a reason; plus the table's moves on models whose right answer
is known, the regime pick, the shipped per-collection models and the command that makes them.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotwise.policies import get_policy
from spotwise.policies.base import ON_DEMAND, SPOT, Observation
from spotwise.policies.budget import BudgetCapped
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE
from spotwise.policies.sim.simulator import SimConfig, run_batch, run_reference
from spotwise.policies.spells import EDGES_H, NBINS, REGIMES_PATH, SpellPrior, fit_regimes, load_regimes
from spotwise.policies.rules.spotwise_policy import GUARD_ALLOWANCE
from spotwise.policies.traces import load_builtin
from spotwise.policies.rules.value_policy import SpotwiseValue
from spotwise.policies.rules.value_table import COMBO_INDEX, AvailabilityModel, age_bucket, solve

NAME = "spotwise-value"
TICK_H = 0.5


def _point_prior(streak_h: float, outage_h: float) -> SpellPrior:
    """A prior in which every streak lasts ``streak_h`` and every outage ``outage_h``."""
    pmf, mean = {}, {}
    for kind, x in (("streak", streak_h), ("outage", outage_h)):
        b = int(np.searchsorted(EDGES_H, x + 1e-9, side="right") - 1)
        pmf[kind] = np.eye(NBINS)[b]
        mean[kind] = np.where(np.arange(NBINS) == b, x, 1.0)
    return SpellPrior(pmf=pmf, mean_h=mean, meta={"collections": ["test"]})


def _move(prior: SpellPrior, combo: tuple[int, int], *, work_h: float, slack_h: float, age_h: float = 0.0,
          d: float = 0.2) -> int:
    table = solve(AvailabilityModel.from_prior(prior), task_h=10.0, deadline_h=14.0, restart_h=d, spot_price=1.0,
                  on_demand_price=3.0)
    return int(table.lookup(np.array([work_h]), np.array([slack_h]), np.array([COMBO_INDEX[combo]]),
                            age_bucket(np.array([age_h])))[0])


# ---- the table ---------------------------------------------------------------------------------

def test_short_outages_are_waited_out_and_long_streaks_taken_from_on_demand() -> None:
    calm = _point_prior(streak_h=20.0, outage_h=0.25)
    assert _move(calm, (0, IDLE), work_h=8.0, slack_h=3.0) == IDLE           # outage ends soon: wait
    assert _move(calm, (1, OD_CODE), work_h=8.0, slack_h=3.0) == SPOT_CODE   # 20-h streaks pay two changeovers
    assert _move(calm, (1, IDLE), work_h=8.0, slack_h=3.0) == SPOT_CODE


def test_streaks_shorter_than_their_changeovers_are_not_worth_leaving_on_demand_for() -> None:
    flaky = _point_prior(streak_h=0.1, outage_h=8.0)
    assert _move(flaky, (1, OD_CODE), work_h=8.0, slack_h=3.0, d=0.2) == OD_CODE
    # on spot, a productive streak is kept: leaving it costs a changeover and spot is cheaper
    assert _move(flaky, (1, SPOT_CODE), work_h=8.0, slack_h=3.0, age_h=0.05) == SPOT_CODE


def test_hazards_follow_the_prior() -> None:
    m = AvailabilityModel.from_prior(_point_prior(streak_h=1.2, outage_h=0.25))
    assert m.hazard.shape == (2, m.K) and ((m.hazard >= 0) & (m.hazard <= 1)).all()
    k = int(age_bucket(np.array([1.2]))[0])
    assert m.hazard[1, k] > 0 and (m.hazard[1, :k] == 0).all()   # no streak ends before 1.2 h


# ---- the regimes ---------------------------------------------------------------------------------

def test_shipped_regimes_have_provenance_and_are_what_the_command_makes() -> None:
    doc = json.loads(REGIMES_PATH.read_text())
    assert doc["meta"]["command"].startswith("python -m spotwise.policies.spells") and doc["meta"]["fitted"]
    shipped = load_regimes()
    refit = fit_regimes(load_builtin())
    assert sorted(shipped) == sorted(refit) and len(shipped) == 10
    for name, prior in shipped.items():
        for k in ("streak", "outage"):
            np.testing.assert_allclose(prior.pmf[k], refit[name].pmf[k], atol=1e-7)


def test_the_run_picks_the_regime_its_spells_look_like() -> None:
    regimes = {"calm": _point_prior(streak_h=20.0, outage_h=0.25), "flaky": _point_prior(streak_h=0.1, outage_h=8.0)}
    pol = SpotwiseValue(prior=_point_prior(1.0, 1.0), regimes=regimes)
    decision = None
    for t in range(12):      # 0.1-h streaks and outages: streak lengths point at "flaky"
        decision = pol.decide(Observation(elapsed_h=t * 0.1, deadline_h=14.0, task_h=10.0, work_done_h=0.0,
                                          restart_h=0.2, tick_h=0.1, current=ON_DEMAND if t else "none",
                                          region="z", spot_available={"z": t % 2 == 0}, spot_price={"z": 1.0},
                                          on_demand_price={"z": 3.0}))
    assert decision is not None and "'flaky'" in decision.reason


def test_a_decision_is_a_table_lookup_once_solved(monkeypatch) -> None:
    """The table is solved once per job shape; every later decision looks it up. Counted, not timed
    (no timed assertions here: how fast a decision is, is bench/bench_policies.py's to measure)."""
    from spotwise.policies.rules import value_policy

    pol = get_policy(NAME, regimes={})
    value_policy.clear_tables()
    solves = []
    real = value_policy.solve
    monkeypatch.setattr(value_policy, "solve", lambda *a, **k: solves.append(1) or real(*a, **k))

    def obs(t: int) -> Observation:
        return Observation(elapsed_h=t * 0.05, deadline_h=60.0, task_h=48.0, work_done_h=t * 0.05, restart_h=0.2,
                           tick_h=0.05, current=SPOT, region="z", spot_available={"z": True}, spot_price={"z": 1.0},
                           on_demand_price={"z": 3.0})

    pol.decide(obs(0))                       # solves the table for this job
    assert len(solves) == 1
    for t in range(1, 201):
        assert pol.decide(obs(t)) is not None
    assert len(solves) == 1                  # 200 decisions, no second solve


# ---- invariants --------------------------------------------------------------------------------

bits_st = st.one_of(st.lists(st.booleans(), min_size=20, max_size=90),
                    st.integers(2, 4).map(lambda k: [i % k == 0 for i in range(60)]))


def _cfg(task: int, slack: int, d: float, spot: float = 0.9731, od: float = 3.06) -> SimConfig:
    need = math.ceil((task * TICK_H + d) / TICK_H - 1e-9) * TICK_H     # on-demand alone, whole ticks
    return SimConfig(task_h=task * TICK_H, deadline_h=need + slack * TICK_H, restart_h=d, spot_price=spot,
                     on_demand_price=od)


def _od_only_usd(cfg: SimConfig) -> float:
    return math.ceil((cfg.task_h + cfg.restart_h) / TICK_H - 1e-9) * TICK_H * cfg.on_demand_price


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=bits_st, task=st.integers(1, 14), slack=st.integers(0, 14), d=st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.7]),
       spot=st.floats(0.05, 2.9), regimes=st.booleans())
def test_never_misses_where_on_demand_could_and_spend_is_bounded(bits, task, slack, d, spot, regimes) -> None:
    """Every such job can meet its deadline on on-demand alone (deadline >= on-demand's whole ticks)."""
    cfg = _cfg(task, slack, d, spot=spot)
    kw = {} if regimes else {"regimes": {}}
    w = np.resize(np.array(bits, dtype=bool), cfg.horizon_ticks(TICK_H * 3600))[None]
    vec = run_batch(get_policy(NAME, **kw), w, cfg, TICK_H * 3600)
    pol = get_policy(NAME, **kw)
    reasons: list[str] = []
    inner = pol.decide

    def decide(obs):
        dec = inner(obs)
        reasons.append(dec.reason)
        return dec

    pol.decide = decide  # type: ignore[method-assign]
    ref = run_reference(pol, w, cfg, TICK_H * 3600)
    assert not vec.missed[0] and not ref.missed[0], (vec.finish_h[0], cfg.deadline_h)
    assert vec.cost_usd[0] == pytest.approx(ref.cost_usd[0])
    assert vec.cost_usd[0] <= (1 + GUARD_ALLOWANCE) * _od_only_usd(cfg) + spot * TICK_H + 1e-9
    assert reasons and all(reasons)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=bits_st, task=st.integers(2, 12), slack=st.integers(0, 12), d=st.sampled_from([0.0, 0.2, 0.5]),
       budget=st.floats(1.0, 80.0))
def test_budget_cap_is_respected(bits, task, slack, d, budget) -> None:
    cfg = _cfg(task, slack, d)
    row = np.resize(np.array(bits, dtype=bool), cfg.horizon_ticks(TICK_H * 3600))
    r = run_reference(BudgetCapped(get_policy(NAME, regimes={}), priority="budget"), row[None], cfg, TICK_H * 3600,
                      budget_usd=budget)
    assert r.cost_usd[0] <= budget + 1e-6


def test_no_miss_and_never_worse_than_on_demand_alone_on_the_shipped_traces() -> None:
    """Shipped traces at the issue's hardest setting (d = 0.2 h, C/R = 0.9), 2 starts per 600-s trace."""
    from spotwise.policies.sim.evaluate import evaluate

    cfg = SimConfig(task_h=48, deadline_h=48 / 0.9, restart_h=0.2)
    traces = [t for t in load_builtin() if t.gap_seconds == 600]
    res = evaluate(NAME, traces, cfg, starts=2, seed=11)
    od_alone = (cfg.task_h + cfg.restart_h) * cfg.on_demand_price
    assert sum(int(r.runs.missed.sum()) for r in res) == 0
    assert max(float(r.runs.cost_usd.max()) for r in res) <= od_alone * (1 + GUARD_ALLOWANCE) + cfg.spot_price
