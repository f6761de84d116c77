"""``spotwise-value``: each move read from a decision table solved under the learned availability model.

Why. ``spotwise`` (:mod:`spotwise.policies.rules.survival_policy`) keeps the slack-reserve rule and lets a
survival model make its two bets; the reserve still decides most moves. Here the rule is gone: the
job's whole problem (work left, slack, market, changeover pending, spot up or down and for how long)
is a Markov decision process under the semi-Markov availability model fitted on traces, solved once
per job shape by :func:`spotwise.policies.rules.value_table.solve` (a few seconds; cached per process) and
read at run time by table lookup (a few integer operations per decision).

What is learned ships as data: the spell-length prior ``data/spell_prior.json`` (its provenance and
training command inside); the table is a pure function of it and of the job (task, deadline,
changeover, prices), so it is solved where it is used, never stale.

Kept from the other policies, on top of the table:

* the safety net (:func:`~spotwise.policies.rules.greedy.safety_net`): once the work left plus one
  changeover no longer fits, on-demand to the end (a running productive spot cluster is kept), so no
  deadline is missed that on-demand alone could meet (the table's grid and model are approximate;
  the net is exact, in the simulator's ticks);
* the spend guard (at most ``1.05 x`` on-demand alone plus one spot tick, as ``spotwise``).

Without prices (a live caller that passes none) the table is solved at the simulator's default
price ratio; the reason says so. Every decision's reason names the state it was read at.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.rules.greedy import safety_net
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE, Lanes, LanePolicy
from spotwise.policies.spells import KINDS, NBINS, SpellBook, SpellPrior, load_prior, load_regimes
from spotwise.policies.rules.spotwise_policy import GUARD_ALLOWANCE, on_demand_only_usd
from spotwise.policies.rules.value_table import (AGE_EDGES_H, COMBO_INDEX, DT_H, AvailabilityModel, DecisionTable,
                                           age_bucket, solve)

DEFAULT_PRICES = (0.9731, 3.06)   # the simulator's defaults (spot, on-demand $/h): used when none are given
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 16                  # a table is 25-50 MB for a 48-h job: one per regime and the pooled one

SMOOTH = 0.05                     # share of uniform mass mixed into each regime's histogram for the likelihood
(W_DONE, W_TABLE, W_GUARD, W_NET_SPOT, W_NET) = range(5)
_NAMES = {IDLE: "wait", SPOT_CODE: "spot", OD_CODE: "on-demand"}


def table_for(prior: SpellPrior, *, task_h: float, deadline_h: float, restart_h: float, spot_price: float,
              on_demand_price: float, dt: float = DT_H) -> DecisionTable:
    """The solved table for one job shape (cached: the last two shapes of this process)."""
    key = (id(prior), round(task_h, 6), round(deadline_h, 6), round(restart_h, 6), round(spot_price, 6),
           round(on_demand_price, 6), dt)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key][1]
    table = solve(AvailabilityModel.from_prior(prior, dt), task_h=task_h, deadline_h=deadline_h,
                  restart_h=restart_h, spot_price=spot_price, on_demand_price=on_demand_price)
    table.meta["prior"] = dict(prior.meta)
    _CACHE[key] = (prior, table)   # the prior is kept alive so its id() is not reused while cached
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return table


def clear_tables() -> None:
    """Drop every cached table (a benchmark moving on to another job shape frees the memory)."""
    _CACHE.clear()


@register_policy("spotwise-value")
class SpotwiseValue(LanePolicy):
    """``prior``: the pooled spell prior, used until the run has seen ``min_spells`` spells end
    (default: the shipped one); ``regimes``: candidate spell models (name -> prior; default: the
    shipped per-collection ones), of which the run uses the likeliest given the spells it has seen;
    ``{}``: the pooled prior only; ``guard``: the spend guard (off only to show in tests what it
    prevents)."""

    def __init__(self, *, prior: SpellPrior | None = None, regimes: dict[str, SpellPrior] | None = None,
                 min_spells: int = 2, guard: bool = True) -> None:
        self.prior = prior if prior is not None else load_prior()
        self.regimes = dict(regimes) if regimes is not None else load_regimes()
        self.min_spells = int(min_spells)
        self.guard = bool(guard)
        names = sorted(self.regimes)
        self._names = names
        # log-likelihood weights per regime and kind (smoothed: no spell length is impossible)
        self._logp = {k: np.log(np.stack([(1 - SMOOTH) * self.regimes[m].pmf[k] + SMOOTH / NBINS for m in names]))
                      if names else np.zeros((0, NBINS)) for k in KINDS}
        super().__init__()

    def init_state(self, n: int) -> dict:
        return {"_why": np.zeros(n, dtype=np.int8), "_priced": np.ones(1, dtype=bool),
                "_book": SpellBook(self.prior, n, 0.0), "_model": np.full(n, -1, dtype=np.int64)}

    def _pick(self, st: dict) -> np.ndarray:
        """Per lane: the index of the likeliest regime given the spells it has seen end (-1: pooled)."""
        book: SpellBook = st["_book"]
        if not self._names:
            return st["_model"]
        ll = book.count["streak"] @ self._logp["streak"].T + book.count["outage"] @ self._logp["outage"].T  # [n, m]
        seen = book.seen("streak") + book.seen("outage")
        st["_model"] = np.where(seen >= self.min_spells, ll.argmax(axis=1), -1)
        return st["_model"]

    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        priced = v.spot_price is not None and v.on_demand_price is not None
        ps, po = (float(v.spot_price), float(v.on_demand_price)) if priced else DEFAULT_PRICES  # type: ignore[arg-type]
        st["_priced"][0] = priced
        st["_book"].observe(v.has_spot, v.elapsed_h)
        model = self._pick(st)
        work_left = v.work_left_h
        slack = v.time_left_h - work_left
        has = v.has_spot.astype(bool)
        assert v.up_h is not None and v.down_h is not None
        age = np.maximum(np.where(has, v.up_h, v.down_h) - v.tick_h, 0.0)
        cur = np.where(~has & (v.current == SPOT_CODE), IDLE, v.current)
        combo = np.select([~has & (cur == IDLE), ~has, has & (cur == IDLE), has & (cur == SPOT_CODE)],
                          [COMBO_INDEX[(0, IDLE)], COMBO_INDEX[(0, OD_CODE)], COMBO_INDEX[(1, IDLE)],
                           COMBO_INDEX[(1, SPOT_CODE)]], COMBO_INDEX[(1, OD_CODE)])
        bucket = age_bucket(age)
        req = np.zeros(work_left.shape, dtype=np.int8)
        for m in np.unique(model):
            sel = model == m
            prior = self.prior if m < 0 else self.regimes[self._names[int(m)]]
            table = table_for(prior, task_h=v.task_h, deadline_h=v.deadline_h, restart_h=v.restart_h,
                              spot_price=ps, on_demand_price=po)
            req[sel] = table.lookup(work_left[sel], slack[sel], combo[sel], bucket[sel])
        req = np.where((req == SPOT_CODE) & ~has, IDLE, req)
        before_net = req
        req = safety_net(v, req)
        net = req != before_net
        guard = np.zeros(req.shape, dtype=bool)
        if self.guard and priced and v.spent_usd is not None:
            rest = v.spent_usd + ps * v.tick_h + po * v.ticks_h(work_left + v.restart_h)
            cap_usd = (1.0 + GUARD_ALLOWANCE) * on_demand_only_usd(v) + 1e-6
            productive = (v.current == SPOT_CODE) & has & (v.restart_left_h < 1e-9)
            guard = (rest > cap_usd) & ~productive
            req = np.where(guard, OD_CODE, req)
        done = work_left <= 1e-9
        st["_why"][:] = np.select([done, guard, net & (req == SPOT_CODE), net],
                                  [W_DONE, W_GUARD, W_NET_SPOT, W_NET], W_TABLE)
        return np.where(done, IDLE, req)

    def explain(self, v: Lanes, st: dict, code: int) -> str:
        why = int(st["_why"][0])
        w = float(v.work_left_h[0])
        slack = float(v.time_left_h[0]) - w
        nums = f"work left {w:.2f} h, slack {slack:.2f} h"
        if why == W_DONE:
            return "work done: release everything"
        if why == W_GUARD:
            spent = float(v.spent_usd[0]) if v.spent_usd is not None else 0.0
            return (f"spend guard: ${spent:.2f} spent + on-demand for the rest would exceed on-demand alone "
                    f"(${on_demand_only_usd(v):.2f}); on-demand to the end")
        if why == W_NET_SPOT:
            return f"safety net (d): keep the productive spot cluster, it is the only way to finish ({nums})"
        if why == W_NET:
            return f"safety net (d): work left + d no longer fits otherwise; on-demand to the end ({nums})"
        has = bool(v.has_spot[0])
        assert v.up_h is not None and v.down_h is not None
        age = float(v.up_h[0] if has else v.down_h[0])
        k = int(age_bucket(np.array([max(age - v.tick_h, 0.0)]))[0])
        lo, hi = AGE_EDGES_H[k], AGE_EDGES_H[k + 1]
        spell = f"spot {'up' if has else 'out'} for {age:.2f} h (age bucket {lo:.2f}-{hi:.2f} h)"
        prices = "" if bool(st["_priced"][0]) else "; prices unknown, table solved at the default ratio"
        m = int(st["_model"][0])
        seen = int(st["_book"].seen("streak")[0] + st["_book"].seen("outage")[0])
        model = (f"spell model '{self._names[m]}' (the likeliest given the {seen} spells seen on this run)" if m >= 0
                 else f"the pooled spell model ({seen} spells seen on this run, fewer than {self.min_spells})")
        return (f"{_NAMES[code]}: least expected cost to finish under {model}, from {nums}, on "
                f"{_NAMES[int(v.current[0])]}, {spell}{prices}")
