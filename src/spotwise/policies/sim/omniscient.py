"""``omniscient``: the cheapest schedule for a job that knows the whole future trace.

Not an online policy: it is the lower bound the others are judged against. Computed by dynamic
programming over ``(tick, progress, market, ticks into the current cluster's life)`` under exactly
the simulator's accounting (changeover delay ``d`` paid at the start of every cluster, full-tick
billing, spot only on available ticks, finish no later than the deadline).

Exactness: progress is counted in quanta of ``q = gcd(gap, d, C)`` seconds. When the tick, the
delay and the task length are whole seconds (every shipped trace) and the table fits in
``max_cells`` cells, the result is the **exact optimum** of the simulated problem; ``exact`` is
then True and :class:`Omniscient` can replay the optimal schedule through the ordinary simulator
(the tests do, and check the cost matches). Otherwise (very fine ticks, e.g. the 30-s traces at
long deadlines) it falls back to a **proven but loose lower bound**: all work at the spot price
up to the number of available ticks times the tick length, the rest at the on-demand price, with
no changeover cost; ``exact`` is False.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotwise.errors import InputError, Problem
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Decision, Observation, Policy, register_policy
from spotwise.policies.sim.simulator import RunResults, SimConfig

MAX_CELLS = 60_000_000   # ticks x progress quanta x lanes: beyond this, use the loose bound


@dataclass(slots=True)
class _Grid:
    q: int          # seconds per progress quantum
    P: int          # quanta of work
    gains: list[int]  # gains[j]: quanta gained by the j-th tick of a cluster's life (j capped at K)
    K: int
    T: int          # ticks available before the deadline


def _grid(cfg: SimConfig, gap_seconds: float) -> _Grid | None:
    g, d, c = gap_seconds, cfg.restart_h * 3600.0, cfg.task_h * 3600.0
    if any(abs(x - round(x)) > 1e-6 for x in (g, d, c)):
        return None
    g_i, d_i, c_i = int(round(g)), int(round(d)), int(round(c))
    q = math.gcd(math.gcd(g_i, d_i), c_i) if d_i else math.gcd(g_i, c_i)
    gu, du = g_i // q, d_i // q
    K = max(1, math.ceil(du / gu)) if du else 1
    gains = [max(0, gu - max(du - j * gu, 0)) for j in range(K + 1)]
    T = int(math.floor(cfg.deadline_h * 3600.0 / g + 1e-9))
    return _Grid(q=q, P=c_i // q, gains=gains, K=K, T=T)


def _shift(a: np.ndarray, s: int, fill) -> np.ndarray:
    """out[:, j] = a[:, j - s]; the first ``s`` columns get ``fill``; what runs off the end is dropped."""
    if s == 0:
        return a
    out = np.empty_like(a)
    out[:, :s] = fill
    out[:, s:] = a[:, :-s]
    return out


def _bound(avail: np.ndarray, cfg: SimConfig, gap_seconds: float) -> RunResults:
    T = int(math.floor(cfg.deadline_h * 3600.0 / gap_seconds + 1e-9))
    spot_work = np.minimum(avail[:, :T].sum(axis=1) * gap_seconds / 3600.0, cfg.task_h)
    od_work = cfg.task_h - spot_work
    n = avail.shape[0]
    return RunResults(cost_usd=spot_work * cfg.spot_price + od_work * cfg.on_demand_price, on_demand_h=od_work,
                      spot_h=spot_work, finish_h=np.full(n, cfg.deadline_h), preemptions=np.zeros(n, dtype=np.int64),
                      deadline_h=cfg.deadline_h, on_demand_work_h=od_work, spot_work_h=spot_work)


def _transitions(K: int, gains: list[int]) -> dict:
    """target state -> [(source state, quanta gained)]; states: 'idle' and (market, age 1..K)."""
    states = ["idle"] + [(m, j) for m in (SPOT, ON_DEMAND) for j in range(1, K + 1)]
    tr: dict = {"idle": [(s, 0) for s in states]}
    for m in (SPOT, ON_DEMAND):
        other = ON_DEMAND if m == SPOT else SPOT
        tr[(m, 1)] = [("idle", gains[0])] + [((other, j), gains[0]) for j in range(1, K + 1)]
        if K == 1:
            tr[(m, 1)].append(((m, 1), gains[1]))
        for j in range(2, K + 1):
            tr[(m, j)] = [((m, j - 1), gains[j - 1])]
        if K >= 2:
            tr[(m, K)].append(((m, K), gains[K]))
    return tr


def solve(avail: np.ndarray, cfg: SimConfig, gap_seconds: float, *, max_cells: int = MAX_CELLS,
          keep_choices: bool = False) -> tuple[RunResults, bool, list | None]:
    """Optimal cost for every row of ``avail`` ([lanes, ticks]); returns (results, exact, choices).

    ``choices`` (only with ``keep_choices``) holds the argmin of every state at every tick, from
    which :func:`_backtrack` recovers lane 0's schedule.
    """
    grid = _grid(cfg, gap_seconds)
    n = avail.shape[0]
    if grid is None or n * (grid.P + 1) * grid.T > max_cells or avail.shape[1] < grid.T:
        return _bound(avail, cfg, gap_seconds), False, None
    P, K, gains = grid.P, grid.K, grid.gains
    W = P + max(gains) + 1                      # progress columns; >= P means done
    g_h = gap_seconds / 3600.0
    price = {SPOT: cfg.spot_price * g_h, ON_DEMAND: cfg.on_demand_price * g_h}
    tr = _transitions(K, gains)
    cost = {k: np.full((n, W), np.inf) for k in tr}
    cost["idle"][:, 0] = 0.0
    odt = {k: np.zeros((n, W), dtype=np.int32) for k in tr}   # on-demand ticks on the best path
    odw = {k: np.zeros((n, W), dtype=np.int32) for k in tr}   # on-demand quanta of work on it
    choices: list | None = [] if keep_choices else None
    for t in range(grid.T):
        a = avail[:, t][:, None]
        nc, nt, nw, ch = {}, {}, {}, {}
        for target, cands in tr.items():
            m = target[0] if target != "idle" else None
            # None until the first candidate: then arrays over the grid
            best_c: Any = None
            best_t: Any = None
            best_w: Any = None
            arg: Any = None
            for i, (src, gain) in enumerate(cands):
                c = _shift(cost[src], gain, np.inf)
                tt = _shift(odt[src], gain, 0)
                w = _shift(odw[src], gain, 0)
                if m == ON_DEMAND and gain:
                    w = w + gain
                if best_c is None:
                    best_c, best_t, best_w = c, tt, w
                    arg = np.zeros(c.shape, dtype=np.int8) if choices is not None else None
                    continue
                better = c < best_c
                best_c = np.where(better, c, best_c)
                best_t = np.where(better, tt, best_t)
                best_w = np.where(better, w, best_w)
                if arg is not None:
                    arg = np.where(better, np.int8(i), arg)
            if m is not None:
                best_c = best_c + price[m]
                if m == ON_DEMAND:
                    best_t = best_t + 1
                else:
                    best_c = np.where(a, best_c, np.inf)
            nc[target], nt[target], nw[target] = best_c, best_t, best_w
            if choices is not None:
                ch[target] = arg
        cost, odt, odw = nc, nt, nw
        if choices is not None:
            choices.append(ch)
    # done: any state, any column >= P
    keys = list(tr)
    stack = np.stack([cost[k][:, P:] for k in keys])          # [states, n, W-P]
    flat = stack.transpose(1, 0, 2).reshape(n, -1)
    idx = flat.argmin(axis=1)
    final_c = flat[np.arange(n), idx]
    s_idx, col = np.divmod(idx, W - P)
    final_t = np.array([odt[keys[s]][i, P + c] for i, (s, c) in enumerate(zip(s_idx, col))])
    final_w = np.array([odw[keys[s]][i, P + c] for i, (s, c) in enumerate(zip(s_idx, col))])
    od_h = final_t * g_h
    od_work = np.minimum(final_w * grid.q / 3600.0, cfg.task_h)
    spot_h = np.zeros(n)
    if cfg.spot_price > 0:
        spot_h = np.round((final_c - od_h * cfg.on_demand_price) / cfg.spot_price / g_h) * g_h
    ok = np.isfinite(final_c)
    res = RunResults(cost_usd=final_c, on_demand_h=od_h, spot_h=np.where(ok, spot_h, 0.0),
                     finish_h=np.where(ok, cfg.deadline_h, np.inf), preemptions=np.zeros(n, dtype=np.int64),
                     deadline_h=cfg.deadline_h, on_demand_work_h=od_work, spot_work_h=cfg.task_h - od_work)
    if choices is not None:
        choices.append((keys[int(s_idx[0])], P + int(col[0])))
    return res, True, choices


def _backtrack(choices: list, tr: dict) -> list[str]:
    """Markets per tick of lane 0's optimal schedule (``none`` | ``spot`` | ``on-demand``)."""
    state, p = choices[-1]
    plan: list[str] = []
    for t in range(len(choices) - 2, -1, -1):
        arg = choices[t][state]
        src, gain = tr[state][int(arg[0, p])]
        plan.append(NONE if state == "idle" else state[0])
        state, p = src, p - gain
    assert state == "idle" and p == 0, (state, p)
    return plan[::-1]


@register_policy("omniscient")
class Omniscient(Policy):
    """Follows the optimal schedule for a known future; call :meth:`plan` before each run.

    It needs the future, so it cannot steer a real run: ``decide`` without a plan is an error.
    """

    def __init__(self) -> None:
        self._plan: list[str] | None = None

    def plan(self, avail_row: np.ndarray, cfg: SimConfig, gap_seconds: float) -> RunResults:
        res, exact, choices = solve(np.atleast_2d(avail_row), cfg, gap_seconds, keep_choices=True)
        if not exact or choices is None:
            raise InputError(Problem("policy", "omniscient", "a trace whose tick, delay and task are whole seconds "
                                                             "(the exact optimum could not be computed)"))
        grid = _grid(cfg, gap_seconds)
        assert grid is not None
        self._plan = _backtrack(choices, _transitions(grid.K, grid.gains))
        return res

    def reset(self) -> None:
        pass  # the plan stays: reset() is called by the simulator just before the run it was made for

    def decide(self, obs: Observation) -> Decision:
        if self._plan is None:
            raise InputError(Problem("policy", "omniscient", "a policy that does not need the future "
                                                             "(omniscient is a simulation-only lower bound)"))
        t = int(round(obs.elapsed_h / obs.tick_h))
        return Decision(self._plan[t] if t < len(self._plan) else ON_DEMAND, obs.region)
