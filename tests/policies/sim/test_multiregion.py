"""Multi-region runs: cheaper than one region, a move is a changeover, no deadline misses."""

from __future__ import annotations

import json

import numpy as np

from spotwise.cli import main
from spotwise.policies import get_policy
from spotwise.policies.base import Observation
from spotwise.policies.sim.multiregion import aligned_starts, run_multi
from spotwise.policies.sim.simulator import SimConfig, run_batch, windows
from spotwise.policies.traces import builtin_traces_dir, load_builtin


def test_multi_region_beats_the_average_single_region() -> None:
    traces = load_builtin("gcp-h100-skynomad-2025-10")[:4]
    cfg = SimConfig(task_h=24, deadline_h=30, restart_h=0.2)
    s = aligned_starts(traces, cfg, 8, seed=0)
    for name in ("uniform-progress", "spotwise"):
        multi = run_multi(get_policy(name), traces, cfg, s)
        singles = [run_batch(get_policy(name), windows(t.data, s, cfg.horizon_ticks(t.gap_seconds)), cfg,
                             t.gap_seconds).cost_usd.mean() for t in traces]
        assert not multi.missed.any()
        assert multi.cost_usd.mean() <= np.mean(singles) + 1e-9


def test_region_choice_and_stickiness() -> None:
    pol = get_policy("uniform-progress")
    obs = Observation(elapsed_h=0, deadline_h=10, task_h=5, work_done_h=0, restart_h=0.2, tick_h=0.5,
                      spot_available={"a": True, "b": True, "c": False}, spot_price={"a": 2.0, "b": 1.0, "c": 0.5},
                      on_demand_price={"a": 3.0, "b": 3.0, "c": 2.5})
    d = pol.decide(obs)
    assert d.market == "spot" and d.region == "b"          # cheapest region that has spot
    obs.current, obs.region = "spot", "a"
    assert pol.decide(obs).region == "a"                    # running spot stays: moving costs d


def test_moving_is_a_changeover() -> None:
    # region a available on even ticks only, b on odd ticks only: a mover never makes progress with d = 1 tick
    from spotwise.policies.traces import Trace

    n = 40
    a = Trace(trace_id="a", collection="x", gap_seconds=3600, data=np.arange(n) % 2 == 0, zone="a")
    b = Trace(trace_id="b", collection="x", gap_seconds=3600, data=np.arange(n) % 2 == 1, zone="b")
    cfg = SimConfig(task_h=3, deadline_h=20, restart_h=1.0)
    r = run_multi(get_policy("greedy"), [a, b], cfg, np.array([0]))
    assert r.spot_work_h[0] == 0.0 and not r.missed[0]


def test_cli_multi_region(capsys) -> None:
    d = builtin_traces_dir() / "gcp-h100-skynomad-2025-10"
    paths = [str(p) for p in sorted(d.glob("*.json"))[:3]]
    rc = main(["simulate", "--trace", *paths, "--policy", "spotwise", "--task-hours", "12", "--deadline-hours", "16",
               "--restart-hours", "0.2", "--starts", "4", "--multi-region", "--format", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 4 and doc["deadline_misses"] == 0
