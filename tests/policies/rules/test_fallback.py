"""spot-fallback (the policy real runs use by default) never misses a deadline that on-demand could
meet, on the real shared traces, and falls back to on-demand after repeated preemptions."""

import json

import pytest

from spotwise.cli import main
from spotwise.policies import Observation, get_policy
from spotwise.policies.base import NONE, ON_DEMAND, SPOT
from spotwise.policies.traces import builtin_traces_dir


@pytest.mark.parametrize("collection,c,r,d", [
    ("aws-1node-avail-2022-10-26", 12, 16, 0.2),
    ("aws-1node-avail-2022-11-28", 20, 24, 0.05),
])
def test_no_deadline_misses_on_real_traces(capsys, collection, c, r, d):
    rc = main(["simulate", "--trace", str(builtin_traces_dir() / collection), "--policy", "spot-fallback",
               "--task-hours", str(c), "--deadline-hours", str(r), "--restart-hours", str(d),
               "--starts", "30", "--format", "json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] > 0
    assert out["deadline_misses"] == 0
    assert out["mean_spot_hours"] > 0          # it does use spot


def _obs(**kw):
    base = dict(elapsed_h=1.0, deadline_h=100.0, task_h=10.0, work_done_h=1.0, restart_h=0.1, tick_h=0.1,
                region="z", spot_available={"z": True})
    base.update(kw)
    return Observation(**base)


def test_falls_back_after_repeated_preemptions_and_stays():
    p = get_policy("spot-fallback", max_spot_preemptions=3, window_h=1.0)
    assert p.decide(_obs()).market == SPOT
    assert p.decide(_obs(spot_available={"z": False})).market == NONE
    assert p.decide(_obs(elapsed_h=1.2, preemptions=2)).market == SPOT
    assert p.decide(_obs(elapsed_h=1.3, preemptions=3)).market == ON_DEMAND
    assert p.decide(_obs(elapsed_h=9.0, preemptions=3)).market == ON_DEMAND   # for good


def test_safety_net_goes_on_demand_when_only_on_demand_can_finish():
    p = get_policy("spot-fallback")
    # 8 h of work left, 8.3 h to the deadline, restart 0.1 h, ticks of 0.1 h: no slack for spot
    assert p.decide(_obs(elapsed_h=91.7, work_done_h=2.0)).market == ON_DEMAND
