"""The ``spotwise`` rule, decision by decision, through ``Policy.decide`` (what the orchestrator calls)."""

from __future__ import annotations

import pytest

from spotwise.policies import get_policy
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Observation


def _obs(t: int, *, spot: bool, current: str, work_done_h: float = 0.0, task_h: float = 20.0,
         deadline_h: float = 30.0) -> Observation:
    return Observation(elapsed_h=t * 0.1, deadline_h=deadline_h, task_h=task_h, work_done_h=work_done_h,
                       restart_h=0.2, tick_h=0.1, current=current, region="z", spot_available={"z": spot})


def test_leaves_on_demand_only_for_a_spot_streak_that_has_lasted_settle_times_d() -> None:
    pol = get_policy("spotwise")          # settle = 2: 2 * 0.2 h = four 0.1-h ticks
    assert pol.decide(_obs(0, spot=False, current=ON_DEMAND)).market == ON_DEMAND   # outage: hold
    markets = [pol.decide(_obs(t, spot=True, current=ON_DEMAND)).market for t in range(1, 7)]
    assert markets == [ON_DEMAND, ON_DEMAND, ON_DEMAND, SPOT, SPOT, SPOT]


def test_an_idle_job_takes_a_new_spot_streak_at_once() -> None:
    pol = get_policy("spotwise")
    assert pol.decide(_obs(0, spot=False, current=NONE)).market == NONE   # plenty of slack: wait
    assert pol.decide(_obs(1, spot=True, current=NONE)).market == SPOT


@pytest.mark.parametrize("work_done_h,expect_spotwise,expect_up", [(14.0, NONE, NONE), (7.0, NONE, ON_DEMAND),
                                                                    (3.5, ON_DEMAND, ON_DEMAND)])
def test_reserve_is_capped_at_a_fifth_of_the_work_left(work_done_h: float, expect_spotwise: str,
                                                       expect_up: str) -> None:
    # C = 20 h, R = 30 h, in an outage at t = 12 h (18 h left). UP keeps a reserve of slack of
    # W * (R - C) / C = W / 2, spotwise W * min(1/2, 0.2) = W / 5. Work done 14 h: W = 6, slack 12,
    # above both; 7 h: W = 13, slack 5, between 2.6 and 6.5; 3.5 h: W = 16.5, slack 1.5, below both.
    t = 120
    for name, expect in (("spotwise", expect_spotwise), ("uniform-progress", expect_up)):
        obs = _obs(t, spot=False, current=NONE, work_done_h=work_done_h)
        w, slack = obs.work_left_h, obs.time_left_h - obs.work_left_h
        got = get_policy(name).decide(obs).market
        assert got == expect, (name, w, slack)
