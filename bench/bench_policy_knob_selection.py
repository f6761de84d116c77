"""Can `spotwise` pick its own knobs per zone? (issue 19, sixth round; a negative result, kept reproducible).

The issue notes that the rule's knobs "tuned in hindsight per trace and setting" reach 59 % of the
Uniform-Progress-to-optimum headroom. This bench asks whether any of that is reachable online, i.e.
whether a zone's best knobs are a property of the zone that persists, or noise of the runs they were
picked on. For `spotwise` with 168 h of the zone's history (the shipped policy as of the fifth round),
over a grid of 27 knob sets (``cap`` x ``quantile`` x ``gamma``), on the 39 traces with ticks >= 150 s,
the issue's six settings, 5 start points per trace (seed 0: the start points of every earlier round),
the share of the headroom pooled over the runs where the optimum is exact:

* the shipped knobs (the baseline; the fifth round's 50.2 %);
* *hindsight* ceilings: the best knob set per trace and setting, per collection and setting, per
  setting, each picked on the very runs it is scored on (not policies);
* *split sample*: per trace and setting, the knobs picked on some start points of the same trace and
  scored on the others (the same zone and period, the future included: an upper bound on what
  persists within a zone);
* *backtest on the zone's last week* (an online policy: no foresight): before each run, every knob
  set is simulated on ``--windows`` job windows inside the 168 h before its start (each shown the
  history before its own start; ticks from the run's start on are never read), and the run uses the
  knob set with the least mean backtest cost (``--margin``: only when it beats the shipped knobs by
  that fraction), over the whole grid and over three one-knob sub-grids;
* *foresight* (part ``oracle``, not policies): ``spotwise`` told the truth about the current outage's
  remaining length, or whether the returning streak lasts its breakeven ``L*``, or both;
* *noisy foresight* (part ``noisy``, issue 19's seventh round): the ``L*`` answer wrong with
  probability ``1 - q`` (q = 0.72, 0.8, 0.9), the error drawn once per streak (it stays wrong while
  the streak lasts) or afresh at every tick (a bound the other way: a wrong answer is soon asked
  again): how good a forecast of young streaks would have to be;
* *what other zones show* (part ``crosstrace``, issue 19's eighth round): the forecast of the
  streak in progress (part ``forecast``) with 8 more features of the traces recorded alongside it
  (the other zones and instance types of its collection, same ticks): fitted on the first half of
  each period, scored on the second;
* how predictable an outage's length is from what is known when it starts (Spearman rank
  correlation, over the complete outages of those traces): the previous outage's length, the
  previous streak's, and the share of ticks with spot over the 6 h and 1 h before.

Usage: ``python bench/bench_policy_knob_selection.py [--windows 4] [--history-hours 168]`` (about
10 minutes on a 2-core machine). Prints each share and its ratio to the shipped knobs' share.

``bench_policy_live_signal.py`` imports the settings, runs and baseline from here (``SETTINGS``,
``STARTS``, ``SEED``, ``HISTORY_H``, ``COARSE_S``, :func:`_lane_runs`, :func:`_baseline`, :func:`_share`):
a change to them changes both benches.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np

from spotwise.policies.sim.evaluate import evaluate
from spotwise.policies.sim.simulator import SimConfig, history_windows, run_batch, start_points, windows
from spotwise.policies.rules.survival_policy import SpotwiseSurvival
from spotwise.policies.traces import Trace, load_builtin

SETTINGS = [(d, ratio) for d in (0.2, 0.05) for ratio in (0.7, 0.8, 0.9)]
GRID = list(itertools.product((0.08, 0.15, 0.3), (0.35, 0.5, 0.65), (0.0, 0.25, 0.75)))   # cap, quantile, gamma
SHIPPED = (0.15, 0.5, 0.25)
STARTS, SEED, HISTORY_H, COARSE_S = 5, 0, 168.0, 150


def _policy(g: tuple) -> SpotwiseSurvival:
    return SpotwiseSurvival(cap=g[0], quantile=g[1], gamma=g[2])


def _cfg(s: tuple) -> SimConfig:
    return SimConfig(task_h=48, deadline_h=48 / s[1], restart_h=s[0])


def _baseline(traces: list[Trace], s: tuple) -> dict:
    """(setting, trace key) -> {"exact", "opt", "up"}: whether the optimum is exact, and the optimum's and
    Uniform-Progress's per-run costs, for setting ``s``."""
    cfg = _cfg(s)
    out: dict = {}
    for o, u in zip(evaluate("omniscient", traces, cfg, starts=STARTS, seed=SEED),
                    evaluate("uniform-progress", traces, cfg, starts=STARTS, seed=SEED)):
        out[(s, (o.trace.collection, o.trace.trace_id))] = {"exact": o.exact, "opt": o.runs.cost_usd,
                                                             "up": u.runs.cost_usd}
    return out


def _share(base: dict, keys: list, cost) -> float:
    """The share of the UP -> optimum headroom (``base`` from :func:`_baseline`) taken by the per-run
    costs ``cost(key)``, pooled over ``keys``."""
    num = sum(float((base[k]["up"] - cost(k)).sum()) for k in keys)
    den = sum(float((base[k]["up"] - base[k]["opt"]).sum()) for k in keys)
    return num / den


def _backtest(traces: list[Trace], s: tuple, history_h: float, nwin: int) -> dict:
    """(trace key, run index) -> knob set -> mean cost over ``nwin`` windows inside the run's history."""
    cfg = _cfg(s)
    groups: dict[float, list[Trace]] = {}
    for tr in traces:
        groups.setdefault(tr.gap_seconds, []).append(tr)
    out: dict = {}
    for gap, group in groups.items():
        horizon = cfg.horizon_ticks(gap)
        back = int(round(history_h * 3600 / gap))
        wd = int(math.ceil(cfg.deadline_h * 3600 / gap))
        rows, hists, owners = [], [], []
        for tr in group:
            av = tr.available(cfg.nodes).astype(np.int8)
            if av.shape[0] - wd <= 0:          # start points wrap: no history (as history_windows)
                continue
            for i, s0 in enumerate(start_points(tr, cfg, STARTS, SEED)):
                room = back - wd
                if s0 < back or room < 0:      # not a whole history before this start: shipped knobs
                    continue
                for k in range(nwin):
                    b = s0 - back + (room * k) // max(nwin - 1, 1)
                    idx = b + np.arange(horizon)
                    # the window ends by the run's start at the deadline; any tick past it (never
                    # reached by a run that meets its deadline) reads as available, never the future
                    rows.append(np.where(idx < s0, av[np.minimum(idx, av.shape[0] - 1)], 1))
                    hists.append(history_windows(av, np.array([b]), back, cfg, gap)[0])
                    owners.append(((tr.collection, tr.trace_id), i))
        if not rows:
            continue
        avail, hist = np.stack(rows).astype(bool), np.stack(hists)
        for g in GRID:
            r = run_batch(_policy(g), avail, cfg, gap, history=hist)
            for owner, c, m in zip(owners, r.cost_usd, r.missed):
                out.setdefault(owner, {}).setdefault(g, []).append(float(c) + (1e4 if m else 0.0))
    return {k: {g: float(np.mean(v)) for g, v in d.items()} for k, d in out.items()}


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    xs = x[order]
    r = np.empty(len(x))
    i = 0
    while i < len(xs):                     # ties get their mean rank
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2
        i = j + 1
    return r


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(_rank(a), _rank(b))[0, 1])


def _spell_starts(a: np.ndarray) -> np.ndarray:
    """The tick each spell of a 0 / 1 series starts at."""
    return np.r_[0, np.flatnonzero(np.diff(a)) + 1]


def _outage_predictors(traces: list[Trace]) -> None:
    length, prev_streak, prev_outage, avail6, avail1 = [], [], [], [], []
    for tr in traces:
        a = tr.available(1).astype(np.int8)
        g = tr.gap_seconds / 3600
        b = _spell_starts(a)
        kinds, lens = a[b], np.diff(np.r_[b, len(a)]) * g
        for i in range(2, len(b) - 1):     # complete spells with two complete ones before
            if kinds[i] == 0:
                st = b[i]
                length.append(lens[i])
                prev_streak.append(lens[i - 1])
                prev_outage.append(lens[i - 2])
                avail6.append(a[max(0, st - int(6 / g)):st].mean())
                avail1.append(a[max(0, st - int(1 / g)):st].mean())
    L = np.array(length)
    print(f"\nHow predictable is an outage's length when it starts? Spearman rank correlation over {len(L)} "
          "complete outages:")
    for name, x in (("the previous outage's length", prev_outage), ("the previous streak's length", prev_streak),
                    ("share of ticks with spot, last 6 h", avail6), ("share of ticks with spot, last 1 h", avail1)):
        print(f"  {name:38s} {_spearman(np.array(x), L):+.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=4, help="backtest windows inside each run's history")
    ap.add_argument("--history-hours", type=float, default=HISTORY_H)
    ap.add_argument("--parts", default="knobs,oracle,noisy,forecast",
                    help="comma-separated: knobs (the grid, hindsight, split sample, backtest; most of the time), "
                         "oracle, noisy (the streak oracle right only q of the time), forecast, crosstrace "
                         "(the streak forecast with what other zones and instance types showed at the time)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= {"knobs", "oracle", "noisy", "forecast", "crosstrace"}:
        raise SystemExit(f"--parts: {args.parts!r}; allowed: knobs, oracle, noisy, forecast, crosstrace "
                         "(comma-separated)")
    t0 = time.perf_counter()
    traces = [t for t in load_builtin() if t.gap_seconds >= COARSE_S]
    H = args.history_hours
    base: dict = {}     # (setting, key) -> {"exact", "opt", "up"}
    grid: dict = {}     # knob set -> (setting, key) -> per-run costs
    for s in SETTINGS:
        cfg = _cfg(s)
        base.update(_baseline(traces, s))
        for g in (GRID if "knobs" in parts else [SHIPPED]):
            for r in evaluate(_policy(g), traces, cfg, starts=STARTS, seed=SEED, history_h=H):
                assert not r.runs.missed.any(), (g, s, r.trace.trace_id)
                grid.setdefault(g, {})[(s, (r.trace.collection, r.trace.trace_id))] = r.runs.cost_usd
        print(f"  d={s[0]} C/R={s[1]}: optimum, UP and {len(grid)} knob set(s) simulated "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)
    exact = [k for k, v in base.items() if v["exact"]]

    def share(cost) -> float:
        return _share(base, exact, cost)

    ref = share(lambda k: grid[SHIPPED][k])
    rows: list[tuple[str, float]] = []

    def report(name: str, value: float) -> None:
        rows.append((name, value))
        print(f"  {name:72s} {100 * value:5.1f} %   x{value / ref:.3f}", flush=True)

    print(f"\n{len(exact)} (setting, trace) pairs with an exact optimum, {STARTS} runs each; "
          f"spotwise sees {H:g} h of the zone's history. Share of the headroom (ratio to the shipped knobs):")
    report("shipped knobs (cap 0.15, quantile 0.5, gamma 0.25)", ref)
    if "knobs" in parts:
        _knobs(traces, grid, base, share, report, H, args.windows)
    if "oracle" in parts:
        for name, oracle, kw in (("the current outage's remaining length (gamma 1)", "o", {"gamma": 1.0}),
                                 ("whether the current streak lasts the breakeven L*", "s", {}),
                                 ("both", "os", {"gamma": 1.0})):
            costs = _oracle_costs(traces, oracle, kw, H)
            report(f"FORESIGHT (not a policy): spotwise told {name}", share(lambda k: costs[k]))
    if "noisy" in parts:
        for mode, what in (("spell", "once per streak"), ("tick", "afresh every tick")):
            for q in (0.72, 0.8, 0.9):
                costs = _lane_costs(traces, lambda a8, q=q, mode=mode: _NoisyOracle(a8, q, mode), H)
                report(f"FORESIGHT, noisy: the L* answer right {100 * q:.0f} % of the time, drawn {what}",
                       share(lambda k: costs[k]))
    if "forecast" in parts:
        _outage_predictors(traces)
        _streak_forecast(traces, H)
    if "crosstrace" in parts:
        _streak_forecast(traces, H, cross=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")


def _knobs(traces, grid, base, share, report, H, nwin) -> None:
    """The grid, the hindsight ceilings, the split sample and the backtest on the zone's last week."""
    by: dict = {}
    for k in base:
        by.setdefault(("trace", k), []).append(k)
        by.setdefault(("collection", (k[0], k[1][0])), []).append(k)
        by.setdefault(("setting", k[0]), []).append(k)
    for level in ("setting", "collection", "trace"):
        pick = {key[1]: min(GRID, key=lambda g: sum(float(grid[g][k].sum()) for k in keys))
                for key, keys in by.items() if key[0] == level}
        sel = {"trace": lambda k: k, "collection": lambda k: (k[0], k[1][0]), "setting": lambda k: k[0]}[level]
        report(f"hindsight: best knobs per {level}" + ("" if level == "setting" else " and setting")
               + ", picked on the runs scored",
               share(lambda k: grid[pick[sel(k)]][k]))
    for a, b in (([0, 1], [2, 3, 4]), ([0, 2, 4], [1, 3])):
        def split(k, a=a, b=b):
            ga = min(GRID, key=lambda g: float(grid[g][k][a].sum()))
            gb = min(GRID, key=lambda g: float(grid[g][k][b].sum()))
            out = grid[SHIPPED][k].copy()
            out[b], out[a] = grid[ga][k][b], grid[gb][k][a]
            return out
        report(f"split sample per trace: runs {b} scored with knobs picked on runs {a} (and back)", share(split))
    t0 = time.perf_counter()
    bt = {s: _backtest(traces, s, H, nwin) for s in SETTINGS}
    print(f"  (backtests simulated in {time.perf_counter() - t0:.0f}s)", flush=True)
    subs = {"whole grid": GRID, "quantile only": [g for g in GRID if g[0] == 0.15 and g[2] == 0.25],
            "gamma only": [g for g in GRID if g[0] == 0.15 and g[1] == 0.5],
            "cap only": [g for g in GRID if g[1] == 0.5 and g[2] == 0.25]}
    for name, sub in subs.items():
        for margin in ((0.0, 0.01) if name == "whole grid" else (0.0,)):
            def chosen(k, sub=sub, margin=margin):
                out = grid[SHIPPED][k].copy()
                for i in range(len(out)):
                    m = bt[k[0]].get((k[1], i))
                    if not m:
                        continue
                    best = min(sub, key=lambda g: m[g])
                    if m[best] < m[SHIPPED] * (1 - margin):
                        out[i] = grid[best][k][i]
                return out
            report(f"backtest on the zone's last {H:g} h, {nwin} windows, {name}, margin {margin:g}",
                   share(chosen))


class _Told:
    """A :class:`SpellBook` stand-in that answers ``residual`` for the told kinds with the truth (the
    remaining length of the current spell, read from the trace: foresight), the rest from the book."""

    def __init__(self, book, policy: "_Oracle") -> None:
        self.book, self.policy = book, policy

    def __getattr__(self, name):
        return getattr(self.book, name)

    def residual(self, kind, age_h, horizon_h, tick_h):
        if kind[0] not in self.policy.told:
            return self.book.residual(kind, age_h, horizon_h, tick_h)
        left = self.policy.remaining[:, self.policy.t] * tick_h
        hz = np.broadcast_to(np.asarray(horizon_h, dtype=float), left.shape)
        return np.minimum(left, hz), (left < hz).astype(float)


class _Oracle(SpotwiseSurvival):
    """``spotwise`` with a perfect forecast of the current outage (``told`` has "o") and / or streak
    ("s"): the value of forecasting each, the most a better forecaster could add inside this rule."""

    def __init__(self, told: str, remaining: np.ndarray, **kw) -> None:
        super().__init__(**kw)
        self.told, self.remaining, self.t = told, remaining, 0

    def rule(self, v, st):
        self.t = int(round(float(v.elapsed_h) / v.tick_h))
        if not isinstance(st["_book"], _Told):
            st["_book"] = _Told(st["_book"], self)
        return super().rule(v, st)

    def prime_rule(self, st, history, tick_h) -> None:
        book = st["_book"].book if isinstance(st["_book"], _Told) else st["_book"]
        book.add_history(history, tick_h, self.history_weight)


def _remaining(avail: np.ndarray) -> np.ndarray:
    """Per lane and tick: ticks left of the spell in progress, counting this one."""
    n, T = avail.shape
    out = np.ones((n, T + 1), dtype=np.int64)
    for t in range(T - 2, -1, -1):
        out[:, t] = np.where(avail[:, t + 1] == avail[:, t], out[:, t + 1] + 1, 1)
    return out


def _oracle_costs(traces: list[Trace], told: str, kw: dict, H: float) -> dict:
    """(setting, trace key) -> per-run costs of ``spotwise`` told the truth about ``told``."""
    return _lane_costs(traces, lambda a8: _Oracle(told, _remaining(a8), **kw), H)


class _NoisyTold(_Told):
    """The streak answer of :class:`_Told`, wrong with probability ``1 - q``: drawn once per spell
    (``spell``: the forecast of a streak stays wrong while it lasts) or afresh every tick (``tick``)."""

    def residual(self, kind, age_h, horizon_h, tick_h):
        if kind[0] != "s":
            return self.book.residual(kind, age_h, horizon_h, tick_h)
        p = self.policy
        left = p.remaining[:, p.t] * tick_h
        hz = np.broadcast_to(np.asarray(horizon_h, dtype=float), left.shape)
        u = p.u[np.arange(left.shape[0]), p.spell[:, p.t]] if p.mode == "spell" else p.rng.random(left.shape[0])
        return np.minimum(left, hz), ((left < hz) ^ (u > p.q)).astype(float)


class _NoisyOracle(_Oracle):
    def __init__(self, a8: np.ndarray, q: float, mode: str, seed: int = 0) -> None:
        super().__init__("s", _remaining(a8))
        self.q, self.mode, self.rng = q, mode, np.random.default_rng(seed)
        spell = np.concatenate([np.zeros((a8.shape[0], 1), dtype=np.int64),
                                np.cumsum(a8[:, 1:] != a8[:, :-1], axis=1)], axis=1)
        self.spell = np.concatenate([spell, spell[:, -1:]], axis=1)
        self.u = self.rng.random((a8.shape[0], int(self.spell.max()) + 1))

    def rule(self, v, st):
        self.t = int(round(float(v.elapsed_h) / v.tick_h))
        if not isinstance(st["_book"], _NoisyTold):
            st["_book"] = _NoisyTold(st["_book"], self)
        return SpotwiseSurvival.rule(self, v, st)


def _lane_runs(traces: list[Trace], make, H: float):
    """Per setting and tick length, one batch: the traces of that tick length, ``STARTS`` lanes each
    (trace ``i``'s runs are lanes ``STARTS * i`` to ``STARTS * (i + 1)``), with the start points and
    ``H`` hours of history of :func:`evaluate`, run by the policy ``make(avail)`` builds (``avail``: the
    lanes' availability, int8). Yields ``(setting, cfg, traces, policy, result)``; misses are kept."""
    for s in SETTINGS:
        cfg = _cfg(s)
        groups: dict[float, list[Trace]] = {}
        for tr in traces:
            groups.setdefault(tr.gap_seconds, []).append(tr)
        for gap, group in groups.items():     # the same lanes, start points and histories as evaluate()
            horizon, back = cfg.horizon_ticks(gap), int(round(H * 3600 / gap))
            starts = [start_points(tr, cfg, STARTS, SEED) for tr in group]
            avail = np.concatenate([windows(tr.available(cfg.nodes), st, horizon) for tr, st in zip(group, starts)])
            hist = np.concatenate([history_windows(tr.available(cfg.nodes), st, back, cfg, gap)
                                   for tr, st in zip(group, starts)])
            policy = make(avail.astype(np.int8))
            yield s, cfg, group, policy, run_batch(policy, avail, cfg, gap, history=hist)


def _lane_costs(traces: list[Trace], make, H: float) -> dict:
    """(setting, trace key) -> per-run costs of the policy ``make(avail)`` builds for each batch of
    :func:`_lane_runs` (none may miss its deadline)."""
    out: dict = {}
    for s, _, group, _, r in _lane_runs(traces, make, H):
        assert not r.missed.any(), s
        for i, tr in enumerate(group):
            out[(s, (tr.collection, tr.trace_id))] = r.cost_usd[STARTS * i:STARTS * (i + 1)]
    return out


def _fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 30) -> tuple:
    """L2-regularised logistic regression by Newton steps on standardised features."""
    mu, sd = X.mean(0), X.std(0)
    mu[0], sd[0] = 0.0, 1.0
    Z = (X - mu) / np.where(sd > 0, sd, 1.0)
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-Z @ w))
        w -= np.linalg.solve(Z.T @ (Z * (p * (1 - p))[:, None]) + l2 * np.eye(len(w)), Z.T @ (p - y) + l2 * w)
    return w, mu, np.where(sd > 0, sd, 1.0)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def _peers(traces: list[Trace]) -> dict[str, list[Trace]]:
    """Trace id -> the other traces of its collection recorded over the same ticks (same start time,
    tick length and number of ticks): what other zones and instance types showed at the same time."""
    out: dict[str, list[Trace]] = {}
    for tr in traces:
        key = (tr.collection, (tr.metadata or {}).get("start_time"), tr.gap_seconds, len(tr.available(1)))
        out[tr.trace_id] = [o for o in traces if o is not tr and key == (
            o.collection, (o.metadata or {}).get("start_time"), o.gap_seconds, len(o.available(1)))]
    return out


def _cross_features(tr: Trace, peers: list[Trace], ts: np.ndarray, lx: float) -> np.ndarray:
    """At ticks ``ts``: the share of the peer traces with spot now, over the last 1 h and 6 h, of those
    in the same zone and of those of the same instance type (others' zone) now, and the share that
    changed state in the last hour; two of them times log x."""
    g = tr.gap_seconds / 3600
    P = np.stack([o.available(1).astype(np.int8) for o in peers])
    cs = np.concatenate([np.zeros((len(P), 1)), np.cumsum(P, axis=1)], axis=1)

    def mean_over(rows: np.ndarray, hours: float) -> np.ndarray:
        n = max(int(round(hours / g)), 1)
        lo = np.maximum(ts + 1 - n, 0)
        return ((cs[rows][:, ts + 1] - cs[rows][:, lo]) / (ts + 1 - lo)).mean(0)

    every = np.arange(len(P))
    zone = np.array([i for i, o in enumerate(peers) if o.zone == tr.zone]) if tr.zone else np.array([], int)
    itype = np.array([i for i, o in enumerate(peers)
                      if (o.metadata or {}).get("instance_type") == (tr.metadata or {}).get("instance_type")])
    now = P[:, ts].mean(0)
    same_zone = P[zone][:, ts].mean(0) if zone.size else now
    same_type = P[itype][:, ts].mean(0) if itype.size else now
    h1 = max(int(round(1 / g)), 1)
    changed = (P[:, ts] != P[:, np.maximum(ts - h1, 0)]).mean(0)
    f1, f6 = mean_over(every, 1), mean_over(every, 6)
    return np.stack([now, f1, f6, same_zone, same_type, changed, now * lx, f1 * lx], axis=1)


def _streak_forecast(traces: list[Trace], H: float, per_trace: int = 1500, seed: int = 1, cross: bool = False) -> None:
    """Does the streak in progress last another x hours? ``spotwise``'s survival model (prior + the
    zone's complete spells of the last ``H`` hours) against a logistic regression on 16 online features,
    fitted leave-one-collection-out, on ticks sampled from the traces where spot is up. ``cross``: only
    on the traces recorded alongside others (:func:`_peers`), and a third column, the regression with 8
    more features of what those others showed (:func:`_cross_features`): do other zones and instance
    types say whether this zone's streak lasts?"""
    from spotwise.policies.spells import SpellBook, load_prior

    prior = load_prior()
    rng = np.random.default_rng(seed)
    xs = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
    peers = _peers(traces)
    cols, feats, extra, model_p, labels, pos = [], [], [], [], [], []
    for tr in traces:
        if cross and not peers[tr.trace_id]:
            continue
        a = tr.available(1).astype(np.int8)
        g, T = tr.gap_seconds / 3600, len(a)
        B = int(round(H / g))
        left = _remaining(a[None, :])[0, :T]
        cand = np.flatnonzero((a == 1) & (np.arange(T) >= B))
        if cand.size == 0:
            continue
        ts = np.sort(rng.choice(cand, size=min(per_trace, cand.size), replace=False))
        starts = _spell_starts(a)
        k = np.searchsorted(starts, ts, side="right") - 1
        age = (ts - starts[k] + 1) * g
        prev_out = np.where(k >= 1, (starts[k] - starts[np.maximum(k - 1, 0)]) * g, 1.0)
        prev_str = np.where(k >= 2, (starts[np.maximum(k - 1, 0)] - starts[np.maximum(k - 2, 0)]) * g, 1.0)
        cs = np.r_[0, np.cumsum(a)]
        cc = np.r_[0, np.cumsum(np.r_[0, np.abs(np.diff(a))])]

        def frac(hours: float) -> np.ndarray:
            lo = np.maximum(ts + 1 - max(int(round(hours / g)), 1), 0)
            return (cs[ts + 1] - cs[lo]) / (ts + 1 - lo)
        changes6 = cc[ts + 1] - cc[np.maximum(ts + 1 - int(round(6 / g)), 0)]
        book = SpellBook(prior, len(ts), 5.0)
        book.add_history(np.stack([a[t - B + 1:t + 1] for t in ts]), g, 1.0)
        f1, f6, f24 = frac(1), frac(6), frac(24)
        for x in xs:
            _, p_short = book.residual("streak", age, np.full(len(ts), x), g)
            known = (ts + left[ts] < T) | (left[ts] * g >= x)      # censored at the trace's end: dropped
            la, lx, lp = np.log(age), np.log(x), _logit(1 - p_short)
            X = np.stack([np.ones_like(age), lp, la, np.full_like(age, lx), la * lx, np.log(prev_out),
                          np.log(prev_str), f1, f6, f24, np.log1p(changes6), np.full_like(age, np.log(g)),
                          lp * lx, f6 * lx, la * la, np.full_like(age, lx * lx)], axis=1)
            cols += [tr.collection] * int(known.sum())
            feats.append(X[known])
            if cross:
                extra.append(_cross_features(tr, peers[tr.trace_id], ts, lx)[known])
            model_p.append(1 - p_short[known])
            labels.append((left[ts] * g >= x)[known].astype(float))
            pos.append((ts / T)[known])
    col, X, pm, y = np.array(cols), np.concatenate(feats), np.concatenate(model_p), np.concatenate(labels)
    age = np.exp(X[:, 2])
    late = np.concatenate(pos) >= 0.5

    def fitted(Xf: np.ndarray) -> np.ndarray:
        """Leave-one-collection-out; with ``cross`` (only four collections to learn from), fitted on
        the first half of every trace's period and scored on the second (no collection held out)."""
        p = np.zeros_like(pm)
        for c in ([None] if cross else sorted(set(cols))):
            train, test = (~late, late) if c is None else (col != c, col == c)
            w, mu, sd = _fit_logistic(Xf[train], y[train])
            p[test] = 1 / (1 + np.exp(-np.clip(((Xf[test] - mu) / sd) @ w, -50, 50)))
        return p
    preds = [("survival model", pm), ("regression, 16 features", fitted(X))]
    if cross:
        preds.append(("regression + 8 cross-trace features",
                      fitted(np.concatenate([X, np.concatenate(extra)], axis=1))))

    def logloss(p: np.ndarray, yy: np.ndarray) -> float:
        p = np.clip(p, 1e-6, 1 - 1e-6)
        return float(-np.mean(yy * np.log(p) + (1 - yy) * np.log(1 - p)))
    where = (f"on the {len(set(cols))} collections whose traces were recorded alongside others, scored on the "
             "second half of each trace's period" if cross else "")
    print(f"\nDoes the spot streak in progress last another x h (x in {xs})? {len(y)} labelled ticks {where}; "
          f"right at 0.5 / log loss, {' vs '.join(n for n, _ in preds)}:")
    for lo, hi, what in ((0, 0.25, "streak age <= 0.25 h (where spotwise decides to leave on-demand)"),
                         (0.25, 1.0, "0.25 h < age <= 1 h"), (1.0, np.inf, "age > 1 h")):
        sel = (age > lo) & (age <= hi) & (X[:, 3] >= np.log(0.2) - 1e-9) & (late if cross else True)
        print(f"  {what:66s} n={int(sel.sum()):6d}  right "
              + " / ".join(f"{np.mean((p[sel] >= 0.5) == y[sel]):.3f}" for _, p in preds) + "   log loss "
              + " / ".join(f"{logloss(p[sel], y[sel]):.3f}" for _, p in preds))


if __name__ == "__main__":
    main()
