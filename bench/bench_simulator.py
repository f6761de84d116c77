"""Simulator throughput: vectorised engine vs the per-tick reference loop, same runs, same machine.

48-hour jobs (R = 60 h, d = 0.2 h) under ``uniform-progress`` on the 600-s traces shipped with
spotwise (25 traces). Prints simulated runs per second of both engines, their ratio, and checks that
the costs agree. Usage: ``python bench/bench_simulator.py [--starts 300] [--ref-starts 8]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from spotwise.policies import get_policy
from spotwise.policies.sim.simulator import SimConfig, run_batch, run_reference, start_points, windows
from spotwise.policies.traces import load_builtin


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--ref-starts", type=int, default=8)
    args = ap.parse_args()
    cfg = SimConfig(task_h=48, deadline_h=60, restart_h=0.2)
    traces = [t for t in load_builtin() if t.gap_seconds == 600]
    horizon = cfg.horizon_ticks(600)
    rows = np.concatenate([windows(t.data, start_points(t, cfg, args.starts, 0), horizon) for t in traces])
    pol = get_policy("uniform-progress")
    run_batch(pol, rows[:50], cfg, 600)  # warm-up
    t0 = time.perf_counter()
    run_batch(pol, rows, cfg, 600)
    t_vec = time.perf_counter() - t0
    sub = rows[:: max(1, len(rows) // (args.ref_starts * len(traces)))][: args.ref_starts * len(traces)]
    t0 = time.perf_counter()
    ref = run_reference(pol, sub, cfg, 600)
    t_ref = time.perf_counter() - t0
    check = run_batch(pol, sub, cfg, 600)
    same = bool(np.array_equal(check.cost_usd, ref.cost_usd))
    v_rate, r_rate = len(rows) / t_vec, len(sub) / t_ref
    print(f"traces={len(traces)} tick=600s C=48h R=60h d=0.2h policy=uniform-progress")
    print(f"vectorised: {len(rows)} runs in {t_vec:.3f}s = {v_rate:,.0f} runs/s")
    print(f"per-tick reference (Policy.decide): {len(sub)} runs in {t_ref:.3f}s = {r_rate:,.0f} runs/s")
    print(f"ratio vectorised/reference: {v_rate / r_rate:.1f}x; identical costs on the shared runs: {same}")


if __name__ == "__main__":
    main()
