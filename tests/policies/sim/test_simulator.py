"""The simulator's accounting, the two engines against each other, and the paper's Table 3."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from spotwise.cli import main
from spotwise.errors import InputError
from spotwise.policies import get_policy
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Decision, Observation, Policy
from spotwise.policies.sim.evaluate import evaluate
from spotwise.policies.sim.omniscient import Omniscient, solve
from spotwise.policies.sim.simulator import SimConfig, run_batch, run_reference, start_points, windows
from spotwise.policies.traces import builtin_traces_dir, load_builtin, load_trace


PAPER = "aws-1node-avail-2022-10-26"


def _ticks(*bits: int) -> np.ndarray:
    return np.array([bits], dtype=bool)


def test_accounting_by_hand() -> None:
    # 1-hour ticks, 2 h of work, d = 0.5 h, deadline 10 h; greedy on spot: up, up, down, up, up, ...
    cfg = SimConfig(task_h=2.0, deadline_h=10.0, restart_h=0.5, spot_price=1.0, on_demand_price=3.0)
    avail = _ticks(1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
    r = run_reference(get_policy("greedy"), avail, cfg, 3600)
    # tick0: +0.5, tick1: +1 (1.5), tick2 preempted idle, tick3: restart +0.5 (2.0) -> done at t=4 h
    assert r.finish_h[0] == pytest.approx(4.0)
    assert r.spot_h[0] == pytest.approx(3.0)        # three full ticks billed
    assert r.cost_usd[0] == pytest.approx(3.0)
    assert r.preemptions[0] == 1
    b = run_batch(get_policy("greedy"), avail, cfg, 3600)
    assert b.cost_usd[0] == r.cost_usd[0] and b.finish_h[0] == r.finish_h[0]


def test_changeover_replaces_not_adds() -> None:
    # on-demand from t=0 with d = 1.5 h on 1-h ticks: 0 h, then 0.5 h, then full ticks
    cfg = SimConfig(task_h=1.5, deadline_h=10.0, restart_h=1.5)
    r = run_reference(get_policy("on-demand"), _ticks(*[0] * 12), cfg, 3600)
    assert r.finish_h[0] == pytest.approx(3.0)
    assert r.on_demand_h[0] == pytest.approx(3.0)


@pytest.mark.parametrize("name", ["on-demand", "greedy", "uniform-progress", "spotwise", "spotwise-rule",
                                  "spot-fallback"])
def test_vectorised_matches_reference(name: str) -> None:
    tr = load_builtin(PAPER)[2]
    for d in (0.2, 0.05):
        cfg = SimConfig(task_h=12.0, deadline_h=16.0, restart_h=d)
        s = start_points(tr, cfg, 25, seed=3)
        w = windows(tr.data, s, cfg.horizon_ticks(tr.gap_seconds))
        pol = get_policy(name)
        ref = run_reference(pol, w, cfg, tr.gap_seconds)
        if name == "spot-fallback":   # not a LanePolicy: only the reference engine drives it
            assert np.isfinite(ref.finish_h).all()
            continue
        vec = run_batch(pol, w, cfg, tr.gap_seconds)
        np.testing.assert_array_equal(vec.cost_usd, ref.cost_usd)
        np.testing.assert_array_equal(vec.finish_h, ref.finish_h)
        np.testing.assert_allclose(vec.on_demand_work_h, ref.on_demand_work_h, atol=1e-9)


def _table3(policy: str, starts: int = 300):
    cfg = SimConfig(task_h=48, deadline_h=60, restart_h=0.2)
    traces = [t.head(1781) for t in load_builtin(PAPER)]
    res = evaluate(policy, traces, cfg, starts=starts, seed=0)
    od = np.concatenate([r.runs.on_demand_work_h for r in res]).mean()
    spot = np.concatenate([r.runs.spot_work_h for r in res]).mean()
    return od, spot, sum(int(r.runs.missed.sum()) for r in res)


@pytest.mark.parametrize("policy,paper_od,paper_spot", [
    ("on-demand", 48.0, 0.0), ("greedy", 30.8, 17.2), ("uniform-progress", 25.1, 22.9)])
def test_reproduces_paper_table3(policy: str, paper_od: float, paper_spot: float) -> None:
    od, spot, misses = _table3(policy)
    assert abs(od - paper_od) <= 0.5 and abs(spot - paper_spot) <= 0.5, (od, spot)
    assert misses == 0


def test_reproduces_paper_table3_omniscient() -> None:
    od, spot, _ = _table3("omniscient", starts=60)   # the exact DP costs ~25 ms per run; 480 runs suffice
    assert abs(od - 20.7) <= 0.5 and abs(spot - 27.4) <= 0.5, (od, spot)


def test_omniscient_plan_replays_to_the_same_cost_and_bounds_the_others() -> None:
    tr = load_builtin(PAPER)[3].head(1781)
    for d in (0.2, 0.05):
        cfg = SimConfig(task_h=20.0, deadline_h=26.0, restart_h=d)
        s = start_points(tr, cfg, 6, seed=1)
        w = windows(tr.data, s, cfg.horizon_ticks(tr.gap_seconds))
        best, exact, _ = solve(w, cfg, tr.gap_seconds)
        assert exact
        for i, row in enumerate(w):
            o = Omniscient()
            planned = o.plan(row, cfg, tr.gap_seconds)
            replay = run_reference(o, row[None], cfg, tr.gap_seconds)
            assert replay.cost_usd[0] == pytest.approx(planned.cost_usd[0]) == pytest.approx(best.cost_usd[i])
            assert not replay.missed[0]
        for name in ("greedy", "uniform-progress", "spotwise", "on-demand"):
            other = run_batch(get_policy(name), w, cfg, tr.gap_seconds)
            assert (best.cost_usd <= other.cost_usd + 1e-9).all(), name


class _Script(Policy):
    """Plays a fixed sequence of markets, one per tick (on-demand once the script runs out)."""

    def __init__(self, plan: tuple[str, ...]) -> None:
        self.plan = plan

    def decide(self, obs: Observation) -> Decision:
        t = int(round(obs.elapsed_h / obs.tick_h))
        return Decision(self.plan[t] if t < len(self.plan) else ON_DEMAND)


@pytest.mark.parametrize("task_h,deadline_h,restart_h", [(2.0, 6.0, 0.5), (3.0, 7.0, 1.5), (2.5, 6.0, 0.0),
                                                         (3.0, 7.0, 0.75)])
def test_omniscient_is_the_exact_optimum_by_brute_force(task_h: float, deadline_h: float, restart_h: float) -> None:
    """The DP's cost equals the cheapest of *every* schedule (3^T of them), each run through the
    ordinary per-tick simulator: the bound the 7 % target is judged against is the true optimum."""
    cfg = SimConfig(task_h=task_h, deadline_h=deadline_h, restart_h=restart_h, spot_price=1.0, on_demand_price=3.1)
    T = int(deadline_h)
    rng = np.random.default_rng(11)
    rows = rng.random((8, cfg.horizon_ticks(3600))) < 0.55
    plans = list(itertools.product((NONE, SPOT, ON_DEMAND), repeat=T))
    dp, exact, _ = solve(rows, cfg, 3600)
    assert exact
    feasible = 0
    for i, row in enumerate(rows):
        best = np.inf
        for plan in plans:
            if any(m == SPOT and not row[t] for t, m in enumerate(plan)):
                continue   # the simulator would idle there: the same as a plan with NONE
            r = run_reference(_Script(plan), row[None], cfg, 3600)
            if not r.missed[0]:
                feasible += 1
                best = min(best, float(r.cost_usd[0]))
        assert dp.cost_usd[i] == pytest.approx(best), (i, row[:T].astype(int), dp.cost_usd[i], best)
    on_demand = run_reference(get_policy("on-demand"), rows[:1], cfg, 3600).cost_usd[0]
    assert feasible > 10 * len(rows) and (dp.cost_usd < on_demand - 1e-9).sum() >= len(rows) // 2


def test_omniscient_refuses_online_use() -> None:
    with pytest.raises(InputError):
        Omniscient().decide(Observation(elapsed_h=0, deadline_h=2, task_h=1, work_done_h=0, restart_h=0.1, tick_h=0.1))


def test_gang_availability_uses_counts() -> None:
    tr = load_trace(builtin_traces_dir() / "aws-16node-avail-2023-08-27" / "aws_us-east-2b_v100_1x16_2023-08-27.json")
    assert tr.available(1).mean() == pytest.approx(tr.metadata["availability_fraction"], abs=1e-3)
    assert tr.available(16).mean() == pytest.approx(tr.metadata["fraction_all_16_available"], abs=1e-3)
    cfg1 = SimConfig(task_h=24, deadline_h=32, restart_h=0.2)
    cfg16 = SimConfig(task_h=24, deadline_h=32, restart_h=0.2, nodes=16)
    one = evaluate("greedy", [tr], cfg1, starts=40)[0].runs
    gang = evaluate("greedy", [tr], cfg16, starts=40)[0].runs
    assert gang.spot_h.mean() < one.spot_h.mean()
    with pytest.raises(InputError):
        tr.available(17)


def test_short_trace_wraps_and_every_shipped_trace_loads() -> None:
    traces = load_builtin()
    assert len(traces) == 47
    short = [t for t in traces if t.duration_h < 40][0]
    res = evaluate("uniform-progress", [short], SimConfig(task_h=48, deadline_h=60, restart_h=0.2), starts=10)[0]
    assert not res.runs.missed.any()


def test_cli_json_and_errors(capsys) -> None:
    path = str(builtin_traces_dir() / PAPER / "aws_us-west-2a_v100_1_2022-10-26.json")
    rc = main(["simulate", "--trace", path, "--policy", "uniform-progress", "--task-hours", "48",
               "--deadline-hours", "60", "--restart-hours", "0.2", "--starts", "20", "--format", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"policy", "runs", "mean_cost_usd", "mean_cost_vs_on_demand", "mean_on_demand_hours",
                        "mean_spot_hours", "deadline_misses", "per_trace"}
    assert doc["runs"] == 20 and doc["deadline_misses"] == 0
    rc = main(["simulate", "--trace", path, "--policy", "greedy", "--task-hours", "48", "--deadline-hours", "30",
               "--restart-hours", "0.2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--deadline-hours" in err and "Traceback" not in err
    rc = main(["simulate", "--trace", "/no/such/trace.json", "--policy", "greedy", "--task-hours", "4",
               "--deadline-hours", "6", "--restart-hours", "0.2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--trace" in err


TARGET_CONFIGS = [(d, ratio) for d in (0.2, 0.05) for ratio in (0.7, 0.8, 0.9)]


@pytest.fixture(scope="module")
def spotwise_vs_up() -> dict:
    """spotwise and Uniform Progress on every shipped trace, at every configuration of the issue's
    target (C = 48 h, C/R in {0.7, 0.8, 0.9}, d in {0.2 h, 0.05 h}); 6 starts per trace to stay
    quick (the 100-start figures are in docs/benchmarks.md)."""
    traces = load_builtin()
    costs = {"spotwise": [], "uniform-progress": []}
    by_col: dict = {}
    misses = 0
    for d, ratio in TARGET_CONFIGS:
        cfg = SimConfig(task_h=48, deadline_h=48 / ratio, restart_h=d)
        for name in costs:
            res = evaluate(name, traces, cfg, starts=6, seed=5)
            costs[name].append(np.concatenate([r.runs.cost_usd for r in res]))
            if name == "spotwise":
                misses += sum(int(r.runs.missed.sum()) for r in res)
            for r in res:
                by_col.setdefault((name, r.trace.collection), []).append(r.runs.cost_usd.mean())
    ratio_all = np.concatenate(costs["spotwise"]).mean() / np.concatenate(costs["uniform-progress"]).mean()
    per_col = {col: np.mean(by_col[("spotwise", col)]) / np.mean(by_col[("uniform-progress", col)])
               for (_, col) in by_col}
    return {"ratio": ratio_all, "per_col": per_col, "misses": misses}


def test_spotwise_beats_uniform_progress_with_zero_misses(spotwise_vs_up: dict) -> None:
    """What the rule achieves: zero misses, cheaper than UP overall (3.11 % in the 100-start
    benchmark; 2 % asserted for few-start noise), and never more than the issue's 1 % worse than UP
    on any collection (it is cheaper on every one)."""
    assert spotwise_vs_up["misses"] == 0
    assert spotwise_vs_up["ratio"] <= 0.98, spotwise_vs_up["ratio"]
    for col, r in spotwise_vs_up["per_col"].items():
        assert r <= 1.01, (col, r)


# The strict xfail for the old 7 % target is gone (issue 19): the target is now a share of the
# UP -> optimum gap, measured by bench/bench_policy_headroom.py (in and out of sample); the policy's
# invariants (no miss where on-demand could make it, spend bounded, budget cap) are property tests in
# tests/policies/rules/test_spotwise_policy.py.
