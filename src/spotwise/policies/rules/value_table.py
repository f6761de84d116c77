"""The decision table of a spot job, solved by dynamic programming under a learned availability model.

Why. The clairvoyant optimum (:mod:`spotwise.policies.sim.omniscient`) knows the future; an online policy
can only know how spot *tends* to behave. This module makes that tendency a Markov decision process
and solves it exactly (on a grid), so the policy's moves are the expected-cost-optimal ones under
the model, instead of a fixed reserve with two bets on top.

The process, in steps of ``dt`` hours (0.05 h by default):

* **State**: work left ``W`` and slack ``S = time left - work left`` (in steps), the market running
  now (idle, spot or on-demand, with the changeover steps ``r`` still to pay on it), whether spot is
  available this step, and the age bucket of the current spot spell (streak or outage).
* **Moves**: idle, spot (only if available), on-demand. Staying on the running market keeps its
  pending changeover; starting or switching to a cluster sets it to ``D = round(d / dt)`` steps
  (as the simulator: it replaces, never adds). A step on a cluster costs its price x ``dt``; a
  productive step lowers ``W`` by one, any other step (idle, or a changeover step) lowers ``S`` by
  one. ``W = 0`` ends the job; ``S < 0`` is a missed deadline (a prohibitive cost).
* **Availability** is semi-Markov (:class:`AvailabilityModel`): a spell of age bucket ``k`` ends
  in a step with hazard ``h[a, k]`` and otherwise ages into bucket ``k + 1`` with probability
  ``dt / width(k)``; the hazards come from a :class:`~spotwise.policies.spells.SpellPrior` (the
  spell-length histograms fitted on traces, shipped as data with its training command). A spot
  cluster whose spell ends is preempted (the job is idle).

Since every step lowers ``W + S`` (the time left) by exactly one, the whole table is one backward
sweep over the time left: ``(W + S)`` levels x (market x availability x age x ``S``) states, a few
seconds of numpy for a 48-h job. Only the decisions of the states a policy meets at a decision
point (idle, spot or on-demand with no changeover pending) are kept: one byte each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE
from spotwise.policies.spells import EDGES_H, SpellPrior

DT_H = 0.05
# Age buckets (hours) of the current spell: unions of the prior's bins, finer where the hazard moves.
AGE_EDGES_H = np.array([0.0, 1 / 12, 1 / 6, 0.25, 1 / 3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0,
                        24.0, 48.0, np.inf])
BIG = 1e6             # cost of a missed deadline: larger than any schedule's
# Rows of the kept decisions: (spot available, market running with no changeover pending)
COMBOS = ((0, IDLE), (0, OD_CODE), (1, IDLE), (1, SPOT_CODE), (1, OD_CODE))
COMBO_INDEX = {c: i for i, c in enumerate(COMBOS)}


@dataclass(frozen=True, slots=True)
class AvailabilityModel:
    """Per step of ``dt`` hours: ``hazard[a, k]`` that a spell (``a`` = 1 streak, 0 outage) in age
    bucket ``k`` ends, and ``advance[k]`` that it moves on to bucket ``k + 1`` if it does not."""

    dt: float
    hazard: np.ndarray     # [2, K]
    advance: np.ndarray    # [K]

    @property
    def K(self) -> int:
        return int(self.advance.shape[0])

    @classmethod
    def from_prior(cls, prior: SpellPrior, dt: float = DT_H) -> "AvailabilityModel":
        edges = AGE_EDGES_H
        K = len(edges) - 1
        width = np.diff(edges)
        advance = np.where(np.isfinite(width), np.minimum(dt / np.where(np.isfinite(width), width, 1.0), 1.0), 0.0)
        hazard = np.zeros((2, K))
        for a, kind in ((1, "streak"), (0, "outage")):
            pmf = prior.pmf[kind]
            # the prior's bins falling in each bucket (its edges are a superset of ours)
            idx = np.clip(np.searchsorted(edges, EDGES_H[:-1] + 1e-9, side="right") - 1, 0, K - 1)
            mass = np.bincount(idx, weights=pmf, minlength=K)
            surv = np.cumsum(mass[::-1])[::-1]
            q = np.where(surv > 1e-12, mass / np.maximum(surv, 1e-12), 1.0)
            al = advance
            h = np.where(al > 0, q * al / np.maximum(1.0 - q + q * al, 1e-12), 0.0)
            # Open last bucket: constant hazard from the mean residual length of its spells.
            last = np.isfinite(edges[:-1]) & ~np.isfinite(edges[1:])
            tail_bins = EDGES_H[:-1] >= edges[-2] - 1e-9
            tail_mass = pmf[tail_bins].sum()
            resid = (float((pmf[tail_bins] * prior.mean_h[kind][tail_bins]).sum() / tail_mass) - edges[-2]
                     if tail_mass > 0 else 24.0)
            h = np.where(last, min(dt / max(resid, dt), 1.0), h)
            hazard[a] = np.clip(h, 0.0, 1.0)
        return cls(dt=dt, hazard=hazard, advance=advance)


def age_bucket(age_h: np.ndarray) -> np.ndarray:
    """Age bucket of spells that have lasted ``age_h`` hours before this step."""
    K = len(AGE_EDGES_H) - 1
    return np.clip(np.searchsorted(AGE_EDGES_H, np.asarray(age_h) + 1e-9, side="right") - 1, 0, K - 1)


@dataclass(slots=True)
class DecisionTable:
    """``act[W + S, combo, k, S]``: the market code to request (0 idle, 1 spot, 2 on-demand)."""

    act: np.ndarray
    dt: float
    w_max: int
    s_max: int
    meta: dict = field(default_factory=dict)

    def lookup(self, work_left_h: np.ndarray, slack_h: np.ndarray, combo: np.ndarray, bucket: np.ndarray) -> np.ndarray:
        """Decisions for lanes (vectorised; a handful of integer operations per lane)."""
        w = np.clip(np.ceil(np.asarray(work_left_h) / self.dt - 1e-6).astype(np.int64), 0, self.w_max)
        s = np.clip(np.floor(np.asarray(slack_h) / self.dt + 1e-6).astype(np.int64), 0, self.s_max)
        return self.act[np.minimum(w + s, self.act.shape[0] - 1), combo, bucket, s]


def solve(model: AvailabilityModel, *, task_h: float, deadline_h: float, restart_h: float, spot_price: float,
          on_demand_price: float) -> DecisionTable:
    """The expected-cost-optimal move of every decision state under ``model`` (see the module doc)."""
    dt = model.dt
    w_max = int(math.ceil(task_h / dt - 1e-9))
    s_max = max(int(math.floor((deadline_h - task_h) / dt + 1e-9)), 0)
    D = int(round(restart_h / dt))
    K = model.K
    nc = 1 + 2 * (D + 1)
    sp = [1 + r for r in range(D + 1)]            # spot, r changeover steps pending
    od = [2 + D + r for r in range(D + 1)]        # on-demand, r pending
    ps, po = spot_price * dt, on_demand_price * dt
    S = np.arange(s_max + 1)
    h = model.hazard[:, :, None]                  # [2, K, 1]
    al = model.advance[None, :, None]             # [1, K, 1]
    V = np.zeros((nc, 2, K, s_max + 1))
    levels = w_max + s_max + 1
    act = np.zeros((levels, len(COMBOS), K, s_max + 1), dtype=np.int8)
    big_col = np.full((nc, 2, K, 1), BIG)
    for tau in range(1, levels):
        W = tau - S
        # Expected value of the next state over availability (V[spot, a=0] already = V[idle, a=0]).
        adv = np.concatenate([V[:, :, 1:], V[:, :, -1:]], axis=2)
        flip = V[:, ::-1, :1, :]                  # the other kind, age bucket 0
        EV = (1.0 - h) * ((1.0 - al) * V + al * adv) + h * flip
        EVs = np.concatenate([big_col, EV[..., :-1]], axis=3)   # one slack step lost
        q_idle = EVs[0]                                           # [2, K, S]
        q_sp = np.empty((nc, 2, K, s_max + 1))
        q_od = np.empty((nc, 2, K, s_max + 1))
        for market, codes, price in ((SPOT_CODE, sp, ps), (OD_CODE, od, po)):
            q = q_sp if market == SPOT_CODE else q_od
            start = price + (EVs[codes[D - 1]] if D > 0 else EV[codes[0]])
            q[:] = start
            q[codes[0]] = price + EV[codes[0]]
            for r in range(1, D + 1):
                q[codes[r]] = price + EVs[codes[r - 1]]
        q_sp[:, 0] = BIG                                          # no spot in an outage
        stack = np.stack([np.broadcast_to(q_idle, q_sp.shape), q_sp, q_od])   # [3, nc, 2, K, S]
        choice = stack.argmin(axis=0)
        Vn = np.take_along_axis(stack, choice[None], axis=0)[0]
        Vn = np.where((W <= 0)[None, None, None, :], 0.0, np.minimum(Vn, BIG))
        Vn[sp, 0] = Vn[0, 0]                                      # a preempted spot cluster is idle
        V = Vn
        for i, (a, cur) in enumerate(COMBOS):
            c = 0 if cur == IDLE else sp[0] if cur == SPOT_CODE else od[0]
            act[tau, i] = choice[c, a]
    meta = {"task_h": task_h, "deadline_h": deadline_h, "restart_h": restart_h, "spot_price": spot_price,
            "on_demand_price": on_demand_price, "dt": dt, "changeover_steps": D}
    return DecisionTable(act=act, dt=dt, w_max=w_max, s_max=s_max, meta=meta)
