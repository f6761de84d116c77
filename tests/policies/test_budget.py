"""Budget caps: unit rules and property tests over random traces, prices and budgets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotwise.errors import InputError
from spotwise.policies import get_policy
from spotwise.policies.base import Decision, Observation
from spotwise.policies.budget import BUDGET_EXHAUSTED, BudgetCapped, may_commit, plan_check, resolve
from spotwise.policies.sim.simulator import SimConfig, run_batch, run_reference


def _obs(**kw) -> Observation:
    base = dict(elapsed_h=1.0, deadline_h=10.0, task_h=5.0, work_done_h=1.0, restart_h=0.2, tick_h=0.5,
                current="none", region="r", spot_available={"r": True}, spot_price={"r": 1.0},
                on_demand_price={"r": 3.0}, spent_usd=9.0, budget_usd=10.0)
    base.update(kw)
    return Observation(**base)


def test_may_commit_checks_before_spending() -> None:
    assert may_commit(9.0, 1.0, 10.0)
    assert not may_commit(9.5, 1.0, 10.0)
    assert may_commit(1e9, 1.0, None)


def test_resolve_by_priority() -> None:
    od = Decision("on-demand", "r")
    r = resolve(_obs(), od, priority="budget")      # 9 + 1.5 > 10
    assert r.status == BUDGET_EXHAUSTED and r.decision.market == "none" and r.gave_up == "deadline"
    r = resolve(_obs(), od, priority="deadline")
    assert r.decision.market == "on-demand" and r.gave_up == "budget" and r.status is None
    r = resolve(_obs(), Decision("spot", "r"), priority="budget")   # 9 + 0.5 fits
    assert r.decision.market == "spot" and r.gave_up == "none"
    with pytest.raises(InputError):
        resolve(_obs(), od, priority="cheap")  # type: ignore[arg-type]


def test_plan_check_says_what_does_not_fit() -> None:
    c = plan_check(task_h=10, restart_h=0.2, budget_usd=5, spot_usd_per_h=1.0, on_demand_usd_per_h=3.0)
    assert not c.fits and "cheapest" in c.message and c.cheapest_usd == pytest.approx(10.2)
    c = plan_check(task_h=10, restart_h=0.2, budget_usd=20, spot_usd_per_h=1.0, on_demand_usd_per_h=3.0)
    assert c.fits and not c.deadline_on_demand_fits
    c = plan_check(task_h=10, restart_h=0.2, budget_usd=40, spot_usd_per_h=1.0, on_demand_usd_per_h=3.0,
                   deadline_h=12)
    assert c.fits and c.deadline_on_demand_fits
    with pytest.raises(InputError):
        plan_check(task_h=-1, restart_h=0.2, budget_usd=1, spot_usd_per_h=1.0, on_demand_usd_per_h=3.0)


traces = st.lists(st.booleans(), min_size=30, max_size=90)
POLICIES = ["greedy", "uniform-progress", "spotwise", "spotwise-rule", "on-demand"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=traces, task=st.integers(2, 12), slack=st.integers(0, 12), d=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
       spot=st.floats(0.1, 2.0), od=st.floats(2.0, 6.0), budget=st.floats(1.0, 80.0),
       name=st.sampled_from(POLICIES))
def test_spend_never_exceeds_the_cap(bits, task, slack, d, spot, od, budget, name) -> None:
    tick_h = 0.5
    cfg = SimConfig(task_h=task * tick_h, deadline_h=(task + slack) * tick_h + d, restart_h=d, spot_price=spot,
                    on_demand_price=od)
    row = np.array(bits + [True] * 40, dtype=bool)
    r = run_reference(BudgetCapped(get_policy(name), priority="budget"), row[None], cfg, tick_h * 3600,
                      budget_usd=budget)
    assert r.cost_usd[0] <= budget + 1e-6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=traces, task=st.integers(1, 12), slack=st.integers(0, 12), d=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
       name=st.sampled_from(POLICIES))
def test_no_deadline_miss_when_on_demand_could_make_it(bits, task, slack, d, name) -> None:
    tick_h = 0.5
    # on-demand from the start needs ceil((C + d) / tick) ticks; give at least that
    need = int(np.ceil((task * tick_h + d) / tick_h - 1e-9)) * tick_h
    cfg = SimConfig(task_h=task * tick_h, deadline_h=need + slack * tick_h, restart_h=d)
    row = np.array(bits, dtype=bool)
    w = np.resize(row, cfg.horizon_ticks(tick_h * 3600))[None]
    ref = run_reference(get_policy(name), w, cfg, tick_h * 3600)
    assert not ref.missed[0], (ref.finish_h[0], cfg.deadline_h)
    vec = run_batch(get_policy(name), w, cfg, tick_h * 3600)
    assert vec.cost_usd[0] == ref.cost_usd[0]
    # with a deadline-first budget the cap is given up rather than the deadline
    capped = run_reference(BudgetCapped(get_policy(name), priority="deadline"), w, cfg, tick_h * 3600, budget_usd=1.0)
    assert not capped.missed[0]
