"""Multi-region simulation: one job that may run in any of several regions (one trace each).

Same accounting as :mod:`spotwise.policies.sim.simulator`, plus: each region has its own spot
availability and prices, on-demand is always available, and moving to another region is a
changeover like any other (the pending delay is set to ``d``). Policies see every region in the
:class:`Observation` and answer with a region; :meth:`LanePolicy.decide` turns a single-region rule
into a multi-region one (stay where spot is, else go to the cheapest region that has spot; start
on-demand in the cheapest on-demand region), so ``uniform-progress`` and ``spotwise`` both work
here unchanged.
"""

from __future__ import annotations

import numpy as np

from spotwise.errors import InputError, Problem
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Observation, Policy
from spotwise.policies.sim.simulator import RunResults, SimConfig, _results
from spotwise.policies.traces import Trace


def aligned_starts(traces: list[Trace], cfg: SimConfig, starts: int, seed: int) -> np.ndarray:
    """Common start ticks for traces that share a timeline (same tick length)."""
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) != 1:
        raise InputError(Problem("--trace", sorted(gaps), "traces with one tick length for a multi-region run"))
    n = min(t.num_ticks for t in traces)
    window = int(np.ceil(cfg.deadline_h * 3600 / traces[0].gap_seconds))
    rng = np.random.default_rng([seed, 7919])
    return rng.integers(0, max(n - window, 1), size=starts)


def run_multi(policy: Policy, traces: list[Trace], cfg: SimConfig, start_ticks: np.ndarray, *,
              spot_prices: list[float] | None = None, on_demand_prices: list[float] | None = None) -> RunResults:
    """Per-tick multi-region loop; one run per start tick."""
    names = [t.zone or t.trace_id for t in traces]
    sp = spot_prices or [cfg.spot_price] * len(traces)
    odp = on_demand_prices or [cfg.on_demand_price] * len(traces)
    g = traces[0].gap_seconds
    tick_h = g / 3600.0
    horizon = cfg.horizon_ticks(g)
    avail = np.stack([t.available(cfg.nodes)[:min(x.num_ticks for x in traces)] for t in traces])
    c_s, d_s = cfg.task_h * 3600.0, cfg.restart_h * 3600.0
    cost, od_ticks, spot_ticks, fins, pres, odws, works = [], [], [], [], [], [], []
    for s0 in start_ticks:
        policy.reset()
        progress = rleft = spent = od_work = 0.0
        market, region = NONE, None
        od = spot = pre = 0
        fin = -1
        for t in range(horizon + 1):
            if market != NONE:
                gain = min(max(g - rleft, 0.0), c_s - progress)
                rleft = max(rleft - g, 0.0)
                progress += gain
                od_work += gain if market == ON_DEMAND else 0.0
                if progress >= c_s - 1e-6:
                    fin = t
                    break
            if t == horizon:
                break
            col = avail[:, (s0 + t) % avail.shape[1]]
            has = {n: bool(a) for n, a in zip(names, col)}
            if market == SPOT and region is not None and not has[region]:
                market = NONE
                pre += 1
            obs = Observation(elapsed_h=t * tick_h, deadline_h=cfg.deadline_h, task_h=cfg.task_h,
                              work_done_h=progress / 3600.0, restart_h=cfg.restart_h, tick_h=tick_h, current=market,
                              region=region, spot_available=has, spot_price=dict(zip(names, sp)),
                              on_demand_price=dict(zip(names, odp)), preemptions=pre, spent_usd=spent,
                              restart_left_h=rleft / 3600.0)
            dec = policy.decide(obs)
            new_market = dec.market
            new_region = dec.region if dec.region is not None else (region or names[0])
            if new_market == SPOT and not has.get(new_region, False):
                new_market = NONE
            if new_market != NONE and (new_market != market or new_region != region):
                rleft = d_s
            market = new_market
            if market != NONE:
                region = new_region
                i = names.index(region)
                price = sp[i] if market == SPOT else odp[i]
                spent += price * tick_h
                od += market == ON_DEMAND
                spot += market == SPOT
        cost.append(spent)
        od_ticks.append(od)
        spot_ticks.append(spot)
        fins.append(fin)
        pres.append(pre)
        odws.append(od_work / 3600.0)
        works.append(progress / 3600.0)
    res = _results(cfg, tick_h, np.array(od_ticks), np.array(spot_ticks), np.array(fins), np.array(pres),
                   np.array(odws), np.array(works))
    res.cost_usd = np.array(cost)   # per-region prices: the ledger, not the flat formula
    res.starts = np.asarray(start_ticks)
    return res
