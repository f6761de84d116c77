"""Run a policy over many traces and start points and summarise it (what ``spotwise simulate`` prints).

Lanes from all traces that share a tick length are simulated in one vectorised batch, so the
per-tick numpy overhead is paid once per tick, not once per trace. :func:`evaluate_multi_region`
is the other way to read the same traces: one job that may run in any of their regions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from spotwise.policies.base import Policy, get_policy
from spotwise.policies.lanes import LanePolicy
from spotwise.policies.sim.simulator import (RunResults, SimConfig, history_windows, run_batch, run_reference, start_points,
                                         windows)
from spotwise.policies.traces import Trace


@dataclass(slots=True)
class TraceResult:
    trace: Trace
    runs: RunResults
    exact: bool = True

    def summary(self, cfg: SimConfig) -> dict:
        r = self.runs
        od_only = (cfg.task_h + cfg.restart_h) * cfg.on_demand_price
        return {
            "trace": self.trace.trace_id,
            "collection": self.trace.collection,
            "runs": len(r),
            "mean_cost_usd": round(float(r.cost_usd.mean()), 4),
            "mean_cost_vs_on_demand": round(float(r.cost_usd.mean() / od_only), 4),
            "mean_on_demand_hours": round(float(r.on_demand_h.mean()), 3),
            "mean_spot_hours": round(float(r.spot_h.mean()), 3),
            "mean_on_demand_work_hours": round(float(r.on_demand_work_h.mean()), 3),
            "mean_spot_work_hours": round(float(r.spot_work_h.mean()), 3),
            "deadline_misses": int(r.missed.sum()),
            **({} if self.exact else {"exact": False}),
        }


def _fieldwise(like: RunResults, array: Callable[[str], np.ndarray]) -> RunResults:
    """A :class:`RunResults` whose array fields are ``array(name)`` and whose other fields are ``like``'s
    (concatenating the parts of one run, or slicing one trace's runs out of a batch)."""
    kw: dict[str, Any] = {f: array(f) if isinstance(getattr(like, f), np.ndarray) else getattr(like, f)
                          for f in RunResults.__slots__}
    return RunResults(**kw)


def evaluate(policy: str | Policy, traces: list[Trace], cfg: SimConfig, *, starts: int = 300, seed: int = 0,
             engine: str = "auto", history_h: float = 0.0) -> list[TraceResult]:
    """Simulate ``starts`` random start points per trace. ``engine``: auto | batch | reference.

    ``history_h``: the policy is first shown the zone's availability over up to this many hours
    before each start (what the trace has of them; none where the trace is shorter than the job's
    window, :func:`~spotwise.policies.sim.simulator.history_windows`)."""
    pol = get_policy(policy) if isinstance(policy, str) else policy
    out: dict[str, TraceResult] = {}
    if getattr(pol, "name", "") == "omniscient":
        from spotwise.policies.sim.omniscient import solve

        for tr in traces:
            s = start_points(tr, cfg, starts, seed)
            w = windows(tr.available(cfg.nodes), s, cfg.horizon_ticks(tr.gap_seconds))
            parts = [solve(w[i:i + 50], cfg, tr.gap_seconds) for i in range(0, len(s), 50)]  # bounded memory
            res = _fieldwise(parts[0][0], lambda f: np.concatenate([getattr(p[0], f) for p in parts]))
            res.starts = s
            out[tr.trace_id + "|" + tr.collection] = TraceResult(tr, res, all(p[1] for p in parts))
        return [out[t.trace_id + "|" + t.collection] for t in traces]
    lanes = pol if isinstance(pol, LanePolicy) and engine != "reference" else None
    groups: dict[float, list[Trace]] = {}
    for tr in traces:
        groups.setdefault(tr.gap_seconds, []).append(tr)
    for gap, group in groups.items():
        horizon = cfg.horizon_ticks(gap)
        rows, spans, all_starts, past = [], [], [], []
        back = int(round(history_h * 3600.0 / gap))
        for tr in group:
            s = start_points(tr, cfg, starts, seed)
            rows.append(windows(tr.available(cfg.nodes), s, horizon))
            spans.append(len(s))
            all_starts.append(s)
            past.append(history_windows(tr.available(cfg.nodes), s, back, cfg, gap))
        avail = np.concatenate(rows)
        hist = np.concatenate(past) if back > 0 else None
        res = (run_batch(lanes, avail, cfg, gap, history=hist) if lanes is not None
               else run_reference(pol, avail, cfg, gap, history=hist))
        lo = 0
        for tr, n, s in zip(group, spans, all_starts):
            part = _fieldwise(res, lambda f: getattr(res, f)[lo:lo + n])
            part.starts = s
            out[tr.trace_id + "|" + tr.collection] = TraceResult(tr, part)
            lo += n
    return [out[t.trace_id + "|" + t.collection] for t in traces]


def evaluate_multi_region(policy: str | Policy, traces: list[Trace], cfg: SimConfig, *, starts: int = 300,
                          seed: int = 0) -> TraceResult:
    """One job across all ``traces`` (one region each, on one timeline), from ``starts`` common start
    ticks (:mod:`spotwise.policies.sim.multiregion`). The result stands for the whole set: its trace is
    named ``"<zone>+<zone>..."`` in the ``multi-region`` collection. Needs two traces or more."""
    from spotwise.errors import InputError, Problem
    from spotwise.policies.sim.multiregion import aligned_starts, run_multi

    if len(traces) < 2:
        raise InputError(Problem("--multi-region", len(traces), "two or more traces, one per region"))
    pol = get_policy(policy) if isinstance(policy, str) else policy
    runs = run_multi(pol, traces, cfg, aligned_starts(traces, cfg, starts, seed))
    merged = replace(traces[0], trace_id="+".join(t.zone or t.trace_id for t in traces), collection="multi-region")
    return TraceResult(merged, runs)


def summarise(policy_name: str, results: list[TraceResult], cfg: SimConfig) -> dict:
    """The JSON document of ``spotwise simulate``."""
    cost = np.concatenate([r.runs.cost_usd for r in results])
    od = np.concatenate([r.runs.on_demand_h for r in results])
    spot = np.concatenate([r.runs.spot_h for r in results])
    od_only = (cfg.task_h + cfg.restart_h) * cfg.on_demand_price
    doc = {
        "policy": policy_name,
        "runs": int(cost.shape[0]),
        "mean_cost_usd": round(float(cost.mean()), 4),
        "mean_cost_vs_on_demand": round(float(cost.mean() / od_only), 4),
        "mean_on_demand_hours": round(float(od.mean()), 3),
        "mean_spot_hours": round(float(spot.mean()), 3),
        "deadline_misses": int(sum(int(r.runs.missed.sum()) for r in results)),
        "per_trace": [r.summary(cfg) for r in results],
    }
    if not all(r.exact for r in results):
        doc["exact"] = False
    return doc
