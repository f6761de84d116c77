"""Trace-driven simulation of one job under a policy (the Can't Be Late accounting).

Semantics, per tick of ``gap_seconds`` (``g``):

* At the start of tick ``t`` the cluster that ran during tick ``t-1`` is credited: progress grows by
  ``max(g - r, 0)`` where ``r`` is the changeover delay still pending (which shrinks by what the
  tick absorbed), capped at the work left. The job is done when progress reaches ``C``; its finish
  time is ``t * g`` and it misses when that is after the deadline ``R``.
* A spot cluster whose trace says unavailable at tick ``t`` is preempted: the job becomes idle.
* The policy then picks idle / spot (only if available) / on-demand for tick ``t``. Starting or
  switching to a cluster sets the pending delay to ``d`` (it replaces, never adds); idling keeps it.
* A tick on a cluster is billed in full at its price, even the last, partial one.

Two engines implement exactly this: :func:`run_reference`, a plain per-tick loop over
:class:`~spotwise.policies.base.Policy` objects and :class:`Observation` s (what the orchestrator
does online), and :func:`run_batch`, the same loop vectorised over thousands of start points for a
:class:`~spotwise.policies.lanes.LanePolicy`. Tests hold them to identical results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from spotwise.errors import InputError, Problem
from spotwise.policies.base import Observation, Policy
from spotwise.policies.lanes import CODE_TO_MARKET, IDLE, MARKET_TO_CODE, OD_CODE, SPOT_CODE, Lanes, LanePolicy
from spotwise.policies.spells import trailing_spell
from spotwise.policies.traces import Trace

REGION = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One job: ``task_h`` hours of work (C) due ``deadline_h`` hours after it starts (R)."""

    task_h: float
    deadline_h: float
    restart_h: float
    spot_price: float = 0.9731
    on_demand_price: float = 3.06
    nodes: int = 1

    def __post_init__(self) -> None:
        problems = []
        if not (self.task_h > 0):
            problems.append(Problem("--task-hours", self.task_h, "a number of hours > 0"))
        if not (self.deadline_h >= self.task_h):
            problems.append(Problem("--deadline-hours", self.deadline_h,
                                    f">= --task-hours ({self.task_h}); on-demand alone needs that long"))
        if not (self.restart_h >= 0):
            problems.append(Problem("--restart-hours", self.restart_h, "a number of hours >= 0"))
        if not (self.spot_price >= 0):
            problems.append(Problem("--spot-price", self.spot_price, "$/h >= 0"))
        if not (self.on_demand_price > 0):
            problems.append(Problem("--on-demand-price", self.on_demand_price, "$/h > 0"))
        if self.nodes < 1:
            problems.append(Problem("--nodes", self.nodes, "a whole number >= 1"))
        if problems:
            raise InputError(problems, source="simulate")

    def horizon_ticks(self, gap_seconds: float) -> int:
        """Ticks after which any sane policy has finished (deadline + all work + two changeovers)."""
        return int(math.ceil((self.deadline_h + self.task_h + 2 * self.restart_h) * 3600 / gap_seconds)) + 2


@dataclass(slots=True)
class RunResults:
    """Per-run outcomes (one element per simulated start point)."""

    cost_usd: np.ndarray
    on_demand_h: np.ndarray
    spot_h: np.ndarray
    finish_h: np.ndarray          # inf where the job never finished within the horizon
    preemptions: np.ndarray
    on_demand_work_h: np.ndarray  # progress made on on-demand (the paper's "hours on on-demand")
    spot_work_h: np.ndarray       # progress made on spot
    deadline_h: float
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def missed(self) -> np.ndarray:
        return self.finish_h > self.deadline_h + 1e-9

    def __len__(self) -> int:
        return int(self.cost_usd.shape[0])


def start_points(trace: Trace, cfg: SimConfig, starts: int, seed: int) -> np.ndarray:
    """``starts`` random start ticks, reproducible from ``seed`` and the trace id.

    Start points are drawn so that the whole deadline window lies inside the trace; a trace shorter
    than the deadline is replayed cyclically (its start is then anywhere in it).
    """
    window = int(math.ceil(cfg.deadline_h * 3600 / trace.gap_seconds))
    hi = trace.num_ticks - window
    salt = sum(trace.trace_id.encode())  # stable across processes (unlike hash())
    rng = np.random.default_rng([seed, salt])
    if hi <= 0:
        return rng.integers(0, trace.num_ticks, size=starts)
    return rng.integers(0, hi + 1, size=starts)


def history_windows(avail: np.ndarray, starts: np.ndarray, ticks: int, cfg: SimConfig,
                    gap_seconds: float) -> np.ndarray:
    """``[len(starts), ticks]`` availability of the ``ticks`` ticks *before* each start (int8: 1 / 0;
    ``-1`` where the trace has no such tick): the zone's recent history, known when the job starts.

    Never wraps: where the trace is shorter than the job's window (its start points then wrap around
    the end, :func:`start_points`), the job's own future would be in that history, so it is empty."""
    out = np.full((len(starts), max(int(ticks), 0)), -1, dtype=np.int8)
    window = int(math.ceil(cfg.deadline_h * 3600 / gap_seconds))
    if ticks <= 0 or avail.shape[0] - window <= 0:
        return out
    idx = np.asarray(starts)[:, None] - ticks + np.arange(ticks)[None, :]
    known = idx >= 0
    out[known] = np.asarray(avail, dtype=np.int8)[idx[known]]
    return out


def windows(avail: np.ndarray, starts: np.ndarray, ticks: int) -> np.ndarray:
    """``[len(starts), ticks]`` availability, wrapping around the end of the trace."""
    idx = (starts[:, None] + np.arange(ticks)[None, :]) % avail.shape[0]
    return avail[idx]


def run_batch(policy: LanePolicy, avail: np.ndarray, cfg: SimConfig, gap_seconds: float, *,
              history: np.ndarray | None = None) -> RunResults:
    """Simulate every row of ``avail`` ([lanes, ticks] bool) at once; see the module docstring.

    ``history``: ``[lanes, H]`` availability before each job starts (:func:`history_windows`), given
    to the policy before its first tick (:meth:`~spotwise.policies.base.Policy.observe_history`)."""
    n, horizon = avail.shape
    g = float(gap_seconds)
    tick_h = g / 3600.0
    c_s, d_s = cfg.task_h * 3600.0, cfg.restart_h * 3600.0
    progress = np.zeros(n)
    rleft = np.zeros(n)
    cur = np.zeros(n, dtype=np.int8)
    done = np.zeros(n, dtype=bool)
    finish_t = np.full(n, -1, dtype=np.int64)
    od_ticks = np.zeros(n, dtype=np.int64)
    od_work = np.zeros(n)
    spot_ticks = np.zeros(n, dtype=np.int64)
    preempt = np.zeros(n, dtype=np.int64)
    st = policy.new_state(n)
    if history is not None:
        policy.prime(st, np.asarray(history, dtype=np.int8), tick_h)
    for t in range(horizon + 1):
        run = cur != IDLE
        if run.any():
            gain = np.where(run, np.maximum(g - rleft, 0.0), 0.0)
            rleft = np.where(run, np.maximum(rleft - g, 0.0), rleft)
            gain = np.minimum(gain, c_s - progress)
            progress = progress + gain
            od_work += np.where(cur == OD_CODE, gain, 0.0)
            new_done = ~done & (progress >= c_s - 1e-6)
            if new_done.any():
                finish_t[new_done] = t
                done |= new_done
                cur[new_done] = IDLE
        if done.all() or t == horizon:
            break
        has = avail[:, t]
        pre = (cur == SPOT_CODE) & ~has
        preempt += pre
        cur[pre] = IDLE
        v = Lanes(elapsed_h=np.float64(t * tick_h), work_done_h=progress / 3600.0, restart_left_h=rleft / 3600.0,
                  current=cur, has_spot=has, preemptions=preempt, deadline_h=cfg.deadline_h, task_h=cfg.task_h,
                  restart_h=cfg.restart_h, tick_h=tick_h, spot_price=cfg.spot_price,
                  on_demand_price=cfg.on_demand_price,
                  spent_usd=(od_ticks * cfg.on_demand_price + spot_ticks * cfg.spot_price) * tick_h)
        req = policy.step(v, st)
        req = np.where(done, IDLE, req).astype(np.int8)
        switch = (req != cur) & (req != IDLE)
        rleft = np.where(switch, d_s, rleft)
        cur = req
        od_ticks += cur == OD_CODE
        spot_ticks += cur == SPOT_CODE
    return _results(cfg, tick_h, od_ticks, spot_ticks, finish_t, preempt, od_work / 3600.0, progress / 3600.0)


def _results(cfg: SimConfig, tick_h: float, od_ticks, spot_ticks, finish_t, preempt, od_work_h,
             work_h) -> RunResults:
    od_h = np.asarray(od_ticks) * tick_h
    spot_h = np.asarray(spot_ticks) * tick_h
    finish = np.where(np.asarray(finish_t) >= 0, np.asarray(finish_t) * tick_h, np.inf)
    return RunResults(cost_usd=od_h * cfg.on_demand_price + spot_h * cfg.spot_price, on_demand_h=od_h,
                      spot_h=spot_h, finish_h=finish, preemptions=np.asarray(preempt), deadline_h=cfg.deadline_h,
                      on_demand_work_h=np.asarray(od_work_h, dtype=float),
                      spot_work_h=np.asarray(work_h, dtype=float) - np.asarray(od_work_h, dtype=float))


def run_reference(policy: Policy, avail: np.ndarray, cfg: SimConfig, gap_seconds: float, *,
                  budget_usd: float | None = None, history: np.ndarray | None = None) -> RunResults:
    """The per-tick loop over ``Policy.decide`` (one job per row of ``avail``), for cross-checks.

    ``budget_usd`` is passed to the policy in every Observation (see :mod:`spotwise.policies.budget`);
    ``history`` (one row per job, as in :func:`run_batch`) through ``Policy.observe_history``.
    """
    rows = np.atleast_2d(avail)
    g = float(gap_seconds)
    tick_h = g / 3600.0
    c_s, d_s = cfg.task_h * 3600.0, cfg.restart_h * 3600.0
    out: dict[str, list[float]] = {k: [] for k in ("od", "spot", "fin", "pre", "odw", "w")}
    for i, row in enumerate(rows):
        policy.reset()
        up = down = 0
        if history is not None:
            past = np.asarray(history[i], dtype=np.int8)
            past = past[past >= 0]
            policy.observe_history(past, tick_h)
            up, down = _trailing(past)
        progress = rleft = 0.0
        cur = IDLE
        od = spot = pre = 0
        fin = -1
        spent = 0.0
        od_work = 0.0
        for t in range(row.shape[0] + 1):
            if cur != IDLE:
                gain = max(g - rleft, 0.0)
                rleft = max(rleft - g, 0.0)
                gain = min(gain, c_s - progress)
                progress += gain
                if cur == OD_CODE:
                    od_work += gain
                if progress >= c_s - 1e-6:
                    fin = t
                    break
            if t == row.shape[0]:
                break
            has = bool(row[t])
            up, down = (up + 1, 0) if has else (0, down + 1)
            if cur == SPOT_CODE and not has:
                cur = IDLE
                pre += 1
            obs = Observation(
                elapsed_h=t * tick_h, deadline_h=cfg.deadline_h, task_h=cfg.task_h, work_done_h=progress / 3600.0,
                restart_h=cfg.restart_h, tick_h=tick_h, current=CODE_TO_MARKET[cur], region=REGION,
                spot_available={REGION: has}, spot_price={REGION: cfg.spot_price},
                on_demand_price={REGION: cfg.on_demand_price}, spot_streak_h={REGION: up * tick_h},
                spot_down_h={REGION: down * tick_h}, preemptions=pre, spent_usd=spent,
                restart_left_h=rleft / 3600.0, budget_usd=budget_usd,
            )
            req = MARKET_TO_CODE[policy.decide(obs).market]
            if req == SPOT_CODE and not has:
                req = IDLE
            if req != cur and req != IDLE:
                rleft = d_s
            cur = req
            od += cur == OD_CODE
            spot += cur == SPOT_CODE
            spent += (cfg.on_demand_price if cur == OD_CODE else cfg.spot_price if cur == SPOT_CODE else 0.0) * tick_h
        out["od"].append(od)
        out["spot"].append(spot)
        out["fin"].append(fin)
        out["pre"].append(pre)
        out["odw"].append(od_work / 3600.0)
        out["w"].append(progress / 3600.0)
    return _results(cfg, tick_h, np.array(out["od"]), np.array(out["spot"]), np.array(out["fin"]),
                    np.array(out["pre"]), np.array(out["odw"]), np.array(out["w"]))


def _trailing(past: np.ndarray) -> tuple[int, int]:
    """(ticks spot has been up, ticks it has been down) at the end of ``past`` (0/1 ticks)."""
    if past.size == 0:
        return 0, 0
    last, age = trailing_spell(past)
    return (age, 0) if last == 1 else (0, age)
