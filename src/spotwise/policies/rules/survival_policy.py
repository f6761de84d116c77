"""``spotwise``: the slack-reserve rule, with its two bets made by a spell-length survival model.

Why. The slack-reserve rule (``spotwise-rule``, :mod:`spotwise.policies.rules.spotwise_policy`) makes two
fixed bets on how spot will behave: it leaves on-demand for a returning spot streak only once the
streak has lasted ``2d`` (young streaks die young), and in an outage it waits as long as the slack
covers a reserve ``W * min((R - C)/C, 0.15)`` whatever the outage looks like. Against the
clairvoyant optimum the first bet loses most where changeovers are dear (at d = 0.2 h, C/R 0.9 the
rule holds on-demand while spot is available 4.1 h per run, the optimum 1.4 h) and is needless
where they are cheap. This policy makes both bets with numbers from a survival model of spell
lengths (:mod:`spotwise.policies.spells`): a prior fitted on the training traces and shipped as
data (``data/spell_prior.json``, provenance and training command inside), updated with every spell
this run sees end, so a flapping zone quickly looks like one.

* **Leaving on-demand** (spot available, job on on-demand): a move earns ``po - ps`` per hour on
  spot and risks two changeovers (onto spot, and back when the streak ends), ``2d`` of progress
  worth ``ps + lambda`` per hour, where ``lambda`` is the shadow price of slack: ``(po - ps) *
  max(reserve, 2d) / (slack - 2d)``, capped at 10 x ``(po - ps)`` (slack is worth more the nearer it
  is to the ``2d`` safety net, below which the job is on on-demand to the end and every later spot
  hour is lost). The breakeven length is ``L* = 2d * (ps + lambda) / (po - ps)``; the job moves when
  the model gives ``P(the streak lasts another L*) >= quantile`` (0.5: the median, not the mean:
  streak lengths are heavy-tailed and the mean, dominated by rare long streaks, made the test leave
  far too often at d = 0.2 h), and never while the slack is more than ``back_h`` (0.6 h) below the
  reserve (the rule's band, kept as a hard guard).
* **Waiting in an outage** (idle, no spot): on-demand once the slack falls below the reserve plus
  ``gamma`` (0.25) x the outage's expected remaining length under the model (capped at the work
  left): outages are Lindy-like too, so an old outage is expected to last and the job stops
  spending slack on it a little earlier.
* **Waiting out a short outage** (off by default: ``grace`` 0; issue 19, fourth round, measured
  and not adopted): buying on-demand for an outage that is over a tick later costs a changeover
  onto on-demand and, when spot is back, another one off it. With ``grace`` > 0 the job stays idle
  below the reserve while the model gives ``P(the outage is over within grace x d) >= q_end`` and
  the slack is not more than ``back_h`` below the reserve; the safety nets still apply. On the
  d = 0.2 h runs the clairvoyant optimum idles through one-tick outages that this policy buys
  on-demand for; ``grace`` 1 gained about 0.3 points of the headroom in sample and nothing out of sample
  (``docs/policies.md`` § "Fourth round").

Everything else is the rule: spot whenever idle and spot is there, on-demand held through outages,
UP's ``2d``/``d`` safety nets (no deadline is missed that on-demand alone could meet) and the spend
guard (at most ``1.05 x`` on-demand alone plus one spot tick). Without prices (a live caller that
passes none) the leaving test cannot be priced and the rule's own hysteresis (band ``back_h``,
streak older than ``settle * d``) is used; the reason says so.

Every decision carries a reason with its numbers, e.g. ``spot back for 0.17 h: P(streak lasts
another 0.59 h, the breakeven of two changeovers at slack price $2.09/h) = 0.62 (prior + 3 streaks
seen on this run) >= 0.5: move to spot (slack ..., reserve ..., work left ...)``. One decision is a
few numpy operations over the model's 37 bins.

**The zone's history** (where the caller has it: a task's ``spot_history``, ``spotwise simulate
--history-hours``): the complete spells of the zone before the job starts count in the model as if
the run had seen them, so a flapping zone looks like one from the first tick, not after a few hours.

Registered as ``spotwise`` (the policy the project ships; the rule it builds on stays registered as
``spotwise-rule``). How far it gets (issue 19; ``docs/policies.md`` § "Share of the headroom"): a
few points of the UP -> optimum headroom more than the rule, in sample and with the prior fitted
leave-one-collection-out; far from the issue's 60 %.
"""

from __future__ import annotations

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.rules.greedy import safety_net
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE, Lanes, LanePolicy
from spotwise.policies.spells import SpellBook, SpellPrior, load_prior
from spotwise.policies.rules.spotwise_policy import GUARD_ALLOWANCE, on_demand_only_usd

(W_DONE, W_SPOT, W_WAIT, W_BEHIND, W_HOLD_OUT, W_HOLD_EV, W_MOVE_EV, W_HOLD_RULE, W_HOLD_BAND, W_NET2, W_NET1,
 W_KEEP_SPOT, W_GUARD, W_OUTAGE_OLD, W_WAIT_SHORT) = range(15)
LAMBDA_CAP = 10.0   # the shadow price of slack at most this many times (po - ps)


@register_policy("spotwise")
class SpotwiseSurvival(LanePolicy):
    """``cap``: reserve of slack at most ``cap`` x the work left (as the rule); ``quantile``: leave
    on-demand when P(streak lasts the breakeven length) is at least this; ``grace``, ``q_end``: idle
    below the reserve (by at most ``back_h``) while P(the outage is over within ``grace`` x d) is at
    least ``q_end`` (``grace`` 0, the default: off); ``gamma``: how much of the
    outage's expected remaining length is added to the reserve; ``weight``: the prior's weight in
    pseudo-spells against the run's own; ``prior``: a :class:`SpellPrior` (default: the shipped
    one); ``back_h``: never leave on-demand while the slack is more than ``back_h`` below the reserve;
    ``settle``: the rule's young-streak hold, used only where prices are unknown; ``guard``: the
    spend guard (off only to show in tests what it prevents); ``history_weight``: what one spell of the
    zone's history before the job (:meth:`observe_history`, where the caller has it) counts for against
    one the run sees itself (issue 19's fifth round: with a week of history, 50.2 % of the headroom in
    sample and 49.7-50.3 % leave-one-collection-out, against 48.4 / 49.3 % without)."""

    def __init__(self, *, cap: float = 0.15, weight: float = 5.0, quantile: float = 0.5, gamma: float = 0.25,
                 prior: SpellPrior | None = None, back_h: float = 0.6, settle: float = 2.0,
                 guard: bool = True, grace: float = 0.0, q_end: float = 0.5, history_weight: float = 1.0) -> None:
        for name, value in (("cap", cap), ("weight", weight), ("gamma", gamma), ("back_h", back_h),
                            ("settle", settle), ("grace", grace), ("history_weight", history_weight)):
            if not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if not 0.0 < q_end < 1.0:
            raise ValueError(f"q_end must be in (0, 1), got {q_end}")
        self.cap = cap
        self.weight = weight
        self.quantile = quantile
        self.prior = prior if prior is not None else load_prior()
        self.back_h = back_h
        self.settle = settle
        self.guard = bool(guard)
        self.gamma = gamma
        self.grace = grace
        self.q_end = q_end
        self.history_weight = history_weight
        super().__init__()

    def init_state(self, n: int) -> dict:
        # _ev rows, per lane: breakeven streak length (h), P(the streak lasts that long), slack price ($/h)
        return {"_why": np.zeros(n, dtype=np.int8), "_book": SpellBook(self.prior, n, self.weight),
                "_ev": np.zeros((3, n)), "_out": np.zeros(n), "_pend": np.zeros(n)}

    def prime_rule(self, st: dict, history: np.ndarray, tick_h: float) -> None:
        # The zone's spells before the job starts count as seen, each worth history_weight spells.
        if self.history_weight > 0:
            st["_book"].add_history(history, tick_h, self.history_weight)

    def reserve_h(self, v: Lanes, st: dict) -> np.ndarray:
        """Slack (hours) the job keeps for later: ``min((R - C)/C, cap)`` x the work left."""
        return v.work_left_h * min((v.deadline_h - v.task_h) / v.task_h, self.cap)

    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        book: SpellBook = st["_book"]
        assert v.up_h is not None and v.down_h is not None   # filled in by LanePolicy.step
        book.observe(v.has_spot, v.elapsed_h)
        work_left = v.work_left_h
        slack = v.time_left_h - work_left
        reserve = self.reserve_h(v, st)
        behind = slack < reserve - 1e-12
        old_outage = np.zeros(behind.shape, dtype=bool)
        e_out = np.zeros(behind.shape)
        out = ~v.has_spot & (v.current == IDLE)
        if self.gamma > 0 and out.any():
            e_out, _ = book.residual("outage", v.down_h, np.maximum(work_left, v.tick_h), v.tick_h)
            old_outage = out & ~behind & (slack < reserve + self.gamma * e_out - 1e-12)
            behind = behind | old_outage
        st["_out"][:] = e_out
        far = slack <= reserve - self.back_h + 1e-12
        # A short outage is waited out even below the reserve (not more than back_h below it): buying
        # on-demand for it costs a changeover now and another when spot is back.
        wait_out = np.zeros(behind.shape, dtype=bool)
        st["_pend"][:] = 0.0
        if self.grace > 0 and (out & behind & ~far).any():
            horizon = np.full(work_left.shape, self.grace * v.restart_h)
            _, p_end = book.residual("outage", v.down_h, horizon, v.tick_h)
            wait_out = out & behind & ~far & (p_end >= self.q_end)
            behind = behind & ~wait_out
            old_outage = old_outage & ~wait_out
            st["_pend"][:] = p_end
        req = np.where(v.has_spot, SPOT_CODE, np.where(behind, OD_CODE, IDLE))
        on_od = v.current == OD_CODE
        d = v.restart_h
        ask = on_od & v.has_spot
        if v.spot_price is not None and v.on_demand_price is not None:
            ps, po = float(v.spot_price), float(v.on_demand_price)
            lam = (po - ps) * np.minimum(np.maximum(reserve, 2 * d) / np.maximum(slack - 2 * d, 1e-9), LAMBDA_CAP)
            # Breakeven: a move earns (po - ps) per hour on spot and risks two changeovers (onto spot,
            # and back when the streak ends), 2d of progress valued at ps + lam per hour.
            lstar = 2.0 * d * (ps + lam) / max(po - ps, 1e-9)
            p_last = np.ones(work_left.shape)
            if ask.any():
                _, p_short = book.residual("streak", v.up_h, np.minimum(lstar, np.maximum(work_left, v.tick_h)),
                                           v.tick_h)
                p_last = 1.0 - p_short
            stay = ask & ((p_last < self.quantile) | far)
            st["_ev"][:] = np.stack([np.broadcast_to(x, work_left.shape) for x in (lstar, p_last, lam)])
            ev_known = True
        else:
            young = v.up_h < self.settle * d - 1e-9
            stay = ask & (far | young)
            ev_known = False
        hold_out = on_od & ~v.has_spot
        hold_od = hold_out | stay
        req = np.where(hold_od, OD_CODE, req)
        need2 = v.ticks_h(work_left + 2 * d)
        net2 = (v.current != SPOT_CODE) & (need2 >= v.remaining_whole_ticks_h() - 1e-9)
        req = np.where(net2, OD_CODE, req)
        before_net = req
        req = safety_net(v, req)
        net1 = req != before_net
        guard = np.zeros(req.shape, dtype=bool)
        if self.guard and v.spot_price is not None and v.on_demand_price is not None and v.spent_usd is not None:
            rest = v.spent_usd + v.spot_price * v.tick_h + v.on_demand_price * v.ticks_h(work_left + d)
            cap_usd = (1.0 + GUARD_ALLOWANCE) * on_demand_only_usd(v) + 1e-6
            productive = (v.current == SPOT_CODE) & v.has_spot & (v.restart_left_h < 1e-9)
            guard = (rest > cap_usd) & ~productive
            req = np.where(guard, OD_CODE, req)
        done = work_left <= 1e-9
        moved = ask & ~stay
        st["_why"][:] = np.select(
            [done, guard, net1 & (req == SPOT_CODE), net1, net2, hold_out, stay & far, stay & ev_known, stay,
             moved & ev_known, v.has_spot, old_outage, behind, wait_out],
            [W_DONE, W_GUARD, W_KEEP_SPOT, W_NET1, W_NET2, W_HOLD_OUT, W_HOLD_BAND, W_HOLD_EV, W_HOLD_RULE,
             W_MOVE_EV, W_SPOT, W_OUTAGE_OLD, W_BEHIND, W_WAIT_SHORT], W_WAIT)
        return np.where(done, IDLE, req)

    def explain(self, v: Lanes, st: dict, code: int) -> str:
        why = int(st["_why"][0])
        w = float(v.work_left_h[0])
        slack = float(v.time_left_h[0]) - w
        reserve = float(self.reserve_h(v, st)[0])
        d = v.restart_h
        assert v.up_h is not None and v.down_h is not None
        up, down = float(v.up_h[0]), float(v.down_h[0])
        lstar, p_last, lam = (float(x[0]) for x in st["_ev"])
        nums = f"slack {slack:.2f} h, reserve {reserve:.2f} h, work left {w:.2f} h"
        seen = int(st["_book"].seen("streak")[0])
        ev = (f"P(streak lasts another {lstar:.2f} h, the breakeven of two changeovers at slack price "
              f"${lam:.2f}/h) = {p_last:.2f} (prior + {seen} streaks seen on this run)")
        if why == W_DONE:
            return "work done: release everything"
        if why == W_GUARD:
            spent = float(v.spent_usd[0]) if v.spent_usd is not None else 0.0
            return (f"spend guard: ${spent:.2f} spent + on-demand for the rest would exceed on-demand alone "
                    f"(${on_demand_only_usd(v):.2f}); on-demand to the end")
        if why == W_KEEP_SPOT:
            return f"safety net (d): keep the productive spot cluster, it is the only way to finish ({nums})"
        if why == W_NET1:
            return f"safety net (d): work left + d no longer fits otherwise; on-demand to the end ({nums})"
        if why == W_NET2:
            return f"safety net (2d): work left + 2d no longer fits otherwise; on-demand to the end ({nums})"
        if why == W_HOLD_OUT:
            return f"spot out for {down:.2f} h: hold on-demand through the outage (re-buying costs d = {d:g} h)"
        if why == W_HOLD_BAND:
            return (f"spot back, but slack is more than {self.back_h:.2f} h below the reserve ({nums}); "
                    "stay on on-demand")
        if why == W_HOLD_EV:
            return f"spot back for {up:.2f} h: {ev} < {self.quantile:g}: stay on on-demand ({nums})"
        if why == W_MOVE_EV:
            return f"spot back for {up:.2f} h: {ev} >= {self.quantile:g}: move to spot ({nums})"
        if why == W_HOLD_RULE:
            return (f"spot back for {up:.2f} h; prices unknown, so the rule's hysteresis: stay on on-demand while "
                    f"the streak is younger than {self.settle:g}d or slack is {self.back_h:.2f} h below the reserve "
                    f"({nums})")
        if why == W_SPOT:
            return f"spot available (streak {up:.2f} h): run on spot ({nums})"
        if why == W_OUTAGE_OLD:
            e_out = float(st["_out"][0])
            return (f"spot out for {down:.2f} h, expected to stay out another {e_out:.2f} h (prior + "
                    f"{int(st['_book'].seen('outage')[0])} outages seen on this run); slack below reserve + "
                    f"{self.gamma:g} x that ({nums}): on-demand")
        if why == W_WAIT_SHORT:
            return (f"spot out for {down:.2f} h and slack below the reserve ({nums}), but P(the outage is over "
                    f"within {self.grace:g}d = {self.grace * d:.2f} h) = {float(st['_pend'][0]):.2f} (prior + "
                    f"{int(st['_book'].seen('outage')[0])} outages seen on this run) >= {self.q_end:g}: wait it out "
                    "rather than pay a changeover onto on-demand and another back")
        if why == W_BEHIND:
            return f"spot out for {down:.2f} h and slack below the reserve ({nums}): on-demand"
        return f"spot out for {down:.2f} h; slack covers the reserve ({nums}): wait for spot"
