"""Share of the Uniform-Progress-to-optimum gap a policy closes, in sample and out of sample (issue 19).

For the issue's six settings (C = 48 h, C/R in {0.7, 0.8, 0.9}, d in {0.2 h, 0.05 h}) and every
shipped trace, on the same start points for every policy:

* ``uniform-progress`` (UP, the baseline);
* ``omniscient``: the exact clairvoyant optimum (dynamic programming; checked against brute force
  in tests/policies/sim/test_simulator.py). It is exact on the traces with ticks of 150 s or more (at
  C/R 0.7/0.8 not on the 195-s ones) and gives only a loose lower bound elsewhere, so the share of
  the headroom is pooled over the **exact runs only** (their number is printed);
* ``spotwise-rule`` (the slack-reserve rule, ``spotwise`` until issue 19's second round) with its
  shipped defaults, and its knobs (cap; the band below the reserve within which it leaves
  on-demand, in units of d or in hours; settle) on a grid of 48, three ways:
  - *hindsight*: the best grid point per trace and per setting, chosen on the runs it is scored on
    (the ceiling of this family of rules, not a policy);
  - *tuned in sample*: one grid point per setting, chosen on all collections;
  - *leave-one-collection-out* (LOCO): for each collection, one grid point per setting chosen on
    all the *other* collections (least pooled cost, zero misses), scored on the held-out one. The
    pooled LOCO share is the honest out-of-sample figure for "tune the rule on the traces you have".
  ``--rule-grid shipped`` skips the grid (about half the time): the three columns then all show the
  shipped rule;
* ``spotwise`` (now the survival-model policy, ``spotwise/policies/rules/survival_policy.py``: the rule
  with its two bets, leaving on-demand and waiting in an outage, made by a spell-length survival
  model learned online over a prior fitted on traces): shipped (prior fitted on every collection,
  quantile 0.5, gamma 0.25: in sample) and *leave-one-collection-out*: for each collection the prior
  is refitted without it and ``gamma`` in {0, 0.25, 0.5} chosen per setting on the other
  collections, then scored on the held-out one.

* ``spotwise-value`` (``spotwise/policies/rules/value_policy.py``: every move read from a decision table
  solved by dynamic programming under the semi-Markov spell model, the likeliest of the
  per-collection spell models once the run has seen two spells end): shipped (pooled prior and
  per-collection models fitted on every collection: in sample) and *leave-one-collection-out*: the
  pooled prior refitted without the held-out collection and its own model removed from the
  candidates (no knob is tuned).

Also printed: misses (all runs, exact or not), per-collection ratios to UP (the issue's "no
collection worse than UP + 1 %"), and the per-run cost ratio to UP at the median, p95 and worst,
with the worst runs named.

Usage: ``python bench/bench_policy_headroom.py [--starts 5] [--seed 0] [--rule-grid full|shipped] [--skip-value]
[--history-hours H]`` (``--skip-value``: `spotwise-value` not run, its columns then repeat `spotwise`'s and the
output says so; ``--history-hours``: `spotwise`, shipped and in every LOCO fold, is first shown the zone's
availability over the H hours before each start, what the trace has of them, issue 19's fifth round; the
other columns are unchanged).
The grids are run on the traces with ticks >= 150 s (the others have no exact optimum, so they do
not enter the share); on the 30-34-s traces only UP, the two shipped policies and the points LOCO
picks are run (misses and the UP + 1 % check).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from spotwise.policies import get_policy
from spotwise.policies.sim.evaluate import evaluate
from spotwise.policies.sim.simulator import SimConfig
from spotwise.policies.rules import value_policy
from spotwise.policies.spells import fit_prior, load_prior, load_regimes
from spotwise.policies.rules.spotwise_policy import Spotwise
from spotwise.policies.rules.survival_policy import SpotwiseSurvival
from spotwise.policies.traces import load_builtin
from spotwise.policies.rules.value_policy import SpotwiseValue

SETTINGS = [(d, ratio) for d in (0.2, 0.05) for ratio in (0.7, 0.8, 0.9)]
# (cap, band below the reserve: "<x>d" in units of d or "<x>h" in hours, settle in d); cap 10 = UP's reserve
GRID = list(itertools.product((0.1, 0.15, 0.2, 10.0), ("2d", "4d", "8d", "0.4h", "0.6h", "0.8h"), (0.0, 2.0)))
COARSE_S = 150
SV_GRID = [(0.5, g) for g in (0.0, 0.25, 0.5)]   # spotwise (survival) LOCO: (quantile, gamma)
SHIPPED_RULE = (0.15, "0.6h", 2.0)


def _spec(p: tuple) -> str:
    return f"cap={p[0]:g} band={p[1]} settle={p[2]:g}"


def _make(p: tuple) -> Spotwise:
    band = {"back": float(p[1][:-1])} if p[1].endswith("d") else {"back_h": float(p[1][:-1])}
    return Spotwise(cap=p[0], settle=p[2], **band)


def _make_sv(prior, p: tuple, grace: float = 0.0) -> SpotwiseSurvival:
    return SpotwiseSurvival(prior=prior, quantile=p[0], gamma=p[1], grace=grace)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rule-grid", choices=("full", "shipped"), default="full",
                    help="'shipped': skip the rule's 48-point grid (about half the time); the rule's tuned / LOCO "
                         "/ hindsight columns then all show the shipped rule")
    ap.add_argument("--skip-value", action="store_true",
                    help="skip spotwise-value (about half the time of a shipped-grid run); its columns then repeat "
                         "spotwise's, and the output says so")
    ap.add_argument("--grace", type=float, default=0.0,
                    help="spotwise's short-outage grace (in units of d; 0, the default, is the shipped policy; "
                         "1 is the fourth round's measured variant)")
    ap.add_argument("--history-hours", type=float, default=0.0,
                    help="show spotwise the zone's availability over this many hours before each start (0: none)")
    args = ap.parse_args()
    grid = GRID if args.rule_grid == "full" else [SHIPPED_RULE]
    traces = load_builtin()
    coarse = [t for t in traces if t.gap_seconds >= COARSE_S]
    fine = [t for t in traces if t.gap_seconds < COARSE_S]
    cols = sorted({t.collection for t in traces})
    t0 = time.perf_counter()
    print(f"{len(traces)} traces ({len(coarse)} with ticks >= {COARSE_S} s) x {args.starts} starts, seed {args.seed}"
          + (f"; spotwise sees {args.history_hours:g} h of the zone's history before each start"
             if args.history_hours else ""))

    # cost[name][(d, ratio)] -> {trace key: per-run costs}; misses[name] -> count over all runs
    cost: dict = {}
    misses: dict = {}
    exact: dict = {}

    def run(name, policy, trs, setting) -> None:
        d, ratio = setting
        cfg = SimConfig(task_h=48, deadline_h=48 / ratio, restart_h=d)
        hist = args.history_hours if name.startswith("survival") else 0.0
        res = evaluate(policy, trs, cfg, starts=args.starts, seed=args.seed, history_h=hist)
        box = cost.setdefault(name, {}).setdefault(setting, {})
        for r in res:
            key = (r.trace.collection, r.trace.trace_id)
            box[key] = r.runs.cost_usd
            if name == "omniscient":
                exact[(setting, key)] = r.exact
            else:
                misses[name] = misses.get(name, 0) + int(r.runs.missed.sum())

    for s in SETTINGS:
        run("omniscient", "omniscient", coarse, s)
        for label, name in (("uniform-progress", "uniform-progress"), ("rule", "spotwise-rule"),
                            ("survival", "spotwise")):
            run(label, SpotwiseSurvival(grace=args.grace) if name == "spotwise" else get_policy(name), traces, s)
        for p in grid:
            run(_spec(p), _make(p), coarse, s)
        print(f"  d={s[0]} C/R={s[1]} simulated ({time.perf_counter() - t0:.0f}s)", flush=True)

    # spotwise (survival), leave-one-collection-out: prior refitted without the held-out collection,
    # knobs chosen per setting on the other collections (coarse traces), scored on the held-out one.
    priors = {c: fit_prior([t for t in traces if t.collection != c]) for c in cols}
    for c in cols:
        for s in SETTINGS:
            for r in SV_GRID:
                run(f"survival|{c}|{r}", _make_sv(priors[c], r, args.grace), coarse, s)
    print(f"  spotwise (survival) folds simulated ({time.perf_counter() - t0:.0f}s)", flush=True)

    # spotwise-value: shipped (in sample) and LOCO (pooled prior refitted without the held-out
    # collection, its own spell model removed from the candidates); tables cached per setting.
    regimes = load_regimes()
    for s in SETTINGS if not args.skip_value else []:
        value_policy.clear_tables()
        run("value", SpotwiseValue(prior=load_prior(), regimes=regimes), traces, s)
        for c in cols:
            pol = SpotwiseValue(prior=priors[c], regimes={k: v for k, v in regimes.items() if k != c})
            run(f"value|{c}", pol, [t for t in traces if t.collection == c], s)
        print(f"  spotwise-value d={s[0]} C/R={s[1]} simulated ({time.perf_counter() - t0:.0f}s)", flush=True)
    value_policy.clear_tables()
    if args.skip_value:   # the value columns then repeat spotwise's (said in the output)
        cost["value"] = cost["survival"]
        print("  --skip-value: spotwise-value not run; its columns below are NOT spotwise-value (placeholders)")

    def total(name, s, keys) -> float:
        return float(sum(cost[name][s][k].sum() for k in keys))

    def ok(name) -> bool:
        return misses.get(name, 0) == 0

    grid_names = [_spec(p) for p in grid if ok(_spec(p))]
    ckeys = {s: [k for k in cost["uniform-progress"][s] if k in cost["omniscient"][s]] for s in SETTINGS}
    ekeys = {s: [k for k in ckeys[s] if exact[(s, k)]] for s in SETTINGS}

    # choices: in sample (all collections) and LOCO (all but the held-out one), per setting
    insample = {s: min(grid_names, key=lambda n: total(n, s, ckeys[s])) for s in SETTINGS}
    loco = {(c, s): min(grid_names, key=lambda n: total(n, s, [k for k in ckeys[s] if k[0] != c]))
            for c in cols for s in SETTINGS}
    for (c, s), n in sorted(loco.items()):             # fine-tick collections: run what LOCO picked
        if fine and any(t.collection == c for t in fine) and c not in {k[0] for k in cost[n][s]}:
            run(n, _make(next(p for p in grid if _spec(p) == n)), [t for t in fine if t.collection == c], s)

    def loco_costs(s, keys) -> dict:
        return {k: cost[loco[(k[0], s)]][s][k] for k in keys}

    def sv_ok(c, r) -> bool:
        return misses.get(f"survival|{c}|{r}", 0) == 0

    sv_pick = {(c, s): min((r for r in SV_GRID if sv_ok(c, r)),
                           key=lambda r: total(f"survival|{c}|{r}", s, [k for k in ckeys[s] if k[0] != c]))
               for c in cols for s in SETTINGS}
    for (c, s), r in sorted(sv_pick.items()):           # fine-tick collections: run what LOCO picked
        if fine and any(t.collection == c for t in fine):
            run(f"survival|{c}|{r}", _make_sv(priors[c], r, args.grace), [t for t in fine if t.collection == c], s)

    def sv_loco_costs(s, keys) -> dict:
        return {k: cost[f"survival|{k[0]}|{sv_pick[(k[0], s)]}"][s][k] for k in keys}

    def val_loco_costs(s, keys) -> dict:
        if args.skip_value:
            return sv_loco_costs(s, keys)
        return {k: cost[f"value|{k[0]}"][s][k] for k in keys}

    def hindsight(s, k) -> np.ndarray:
        return min((cost[n][s][k] for n in grid_names), key=lambda a: a.sum())

    rows = {"spotwise-rule": {}, "tuned in sample": {}, "LOCO (out of sample)": {}, "hindsight per trace": {},
            "spotwise (in sample)": {}, "spotwise LOCO": {}, "value (in sample)": {}, "value LOCO": {},
            "omniscient": {}}
    tot = {r: 0.0 for r in rows}
    tot_up = 0.0
    n_exact = 0
    print("\nShare of the UP -> optimum gap closed, exact runs only (cost vs UP in brackets):")
    print(f"{'d':>5} {'C/R':>4} {'exact runs':>10}  " + "  ".join(f"{r:>22}" for r in rows))
    for s in SETTINGS:
        ek = ekeys[s]
        up = total("uniform-progress", s, ek)
        om = total("omniscient", s, ek)
        vals = {"spotwise-rule": total("rule", s, ek), "tuned in sample": total(insample[s], s, ek),
                "LOCO (out of sample)": float(sum(v.sum() for v in loco_costs(s, ek).values())),
                "hindsight per trace": float(sum(hindsight(s, k).sum() for k in ek)),
                "spotwise (in sample)": total("survival", s, ek),
                "spotwise LOCO": float(sum(v.sum() for v in sv_loco_costs(s, ek).values())),
                "value (in sample)": total("value", s, ek),
                "value LOCO": float(sum(v.sum() for v in val_loco_costs(s, ek).values())), "omniscient": om}
        runs = sum(len(cost["uniform-progress"][s][k]) for k in ek)
        n_exact += runs
        tot_up += up
        for r, v in vals.items():
            tot[r] += v
        print(f"{s[0]:>5} {s[1]:>4} {runs:>10}  " + "  ".join(
            f"{(up - v) / (up - om):>12.0%} ({v / up - 1:+.2%})" for v in vals.values()))
    gap = tot_up - tot["omniscient"]
    print(f"{'all six, pooled':>10} {n_exact:>10}  " + "  ".join(
        f"{(tot_up - v) / gap:>12.1%} ({v / tot_up - 1:+.2%})" for v in tot.values()))
    print("in-sample choices per setting: " + "; ".join(f"{s}: {insample[s]}" for s in SETTINGS))
    print("spotwise (survival) LOCO picks (quantile/gamma) per setting, one per fold: " + "; ".join(
        f"{s}: " + " ".join(f"{sv_pick[(c, s)][0]:g}/{sv_pick[(c, s)][1]:g}" for c in cols) for s in SETTINGS))

    print("\nPer collection (all runs; share over its exact runs where it has any):")
    print(f"{'collection':>30} {'runs':>5} {'exact':>5} {'rule/UP':>8} {'LOCO/UP':>8} {'share rule':>10} "
          f"{'share LOCO':>10} {'spotwise/UP':>11} {'sw LOCO/UP':>10} {'share sw LOCO':>13} {'value/UP':>8} "
          f"{'val LOCO/UP':>11} {'share val LOCO':>14}  rule LOCO picks "
          "(d=0.2 | d=0.05, C/R 0.7 0.8 0.9)")
    worst = {"spotwise": 0.0, "LOCO": 0.0, "survival": 0.0, "survival LOCO": 0.0, "value": 0.0, "value LOCO": 0.0}
    for c in cols:
        up = sw = lo = sv = svs = va = val = 0.0
        eu = es = el = eo = ev = evl = 0.0
        runs = ex = 0
        for s in SETTINGS:
            keys = [k for k in cost["uniform-progress"][s] if k[0] == c]
            lc = loco_costs(s, keys)
            vc = sv_loco_costs(s, keys)
            wc = val_loco_costs(s, keys)
            va += total("value", s, keys)
            val += float(sum(v.sum() for v in wc.values()))
            sv += float(sum(v.sum() for v in vc.values()))
            svs += total("survival", s, keys)
            up += total("uniform-progress", s, keys)
            sw += total("rule", s, keys)
            lo += float(sum(v.sum() for v in lc.values()))
            runs += sum(len(cost["uniform-progress"][s][k]) for k in keys)
            for k in keys:
                if k in cost["omniscient"][s] and exact[(s, k)]:
                    ex += len(cost["uniform-progress"][s][k])
                    eu += cost["uniform-progress"][s][k].sum()
                    es += cost["rule"][s][k].sum()
                    el += lc[k].sum()
                    ev += vc[k].sum()
                    evl += wc[k].sum()
                    eo += cost["omniscient"][s][k].sum()
        worst["spotwise"] = max(worst["spotwise"], sw / up)
        worst["LOCO"] = max(worst["LOCO"], lo / up)
        worst["survival LOCO"] = max(worst["survival LOCO"], sv / up)
        worst["survival"] = max(worst["survival"], svs / up)
        worst["value"] = max(worst["value"], va / up)
        worst["value LOCO"] = max(worst["value LOCO"], val / up)
        shw = f"{(eu - evl) / (eu - eo):>14.0%}" if ex else f"{'-':>14}"
        shs = f"{(eu - es) / (eu - eo):>10.0%}" if ex else f"{'-':>10}"
        shl = f"{(eu - el) / (eu - eo):>10.0%}" if ex else f"{'-':>10}"
        picks = " | ".join(", ".join(loco[(c, s)].replace("cap=", "").replace(" band=", "/").replace(" settle=", "/")
                                     for s in SETTINGS if s[0] == dd) for dd in (0.2, 0.05))
        shv = f"{(eu - ev) / (eu - eo):>13.0%}" if ex else f"{'-':>13}"
        print(f"{c:>30} {runs:>5} {ex:>5} {sw / up:>8.4f} {lo / up:>8.4f} {shs} {shl} {svs / up:>11.4f} {sv / up:>10.4f} "
              f"{shv} {va / up:>8.4f} {val / up:>11.4f} {shw}  {picks}")
    print(f"worst collection vs UP: spotwise-rule {worst['spotwise']:.4f}, its LOCO {worst['LOCO']:.4f}, "
          f"spotwise (survival) {worst['survival']:.4f}, its LOCO {worst['survival LOCO']:.4f}, spotwise-value "
          f"{worst['value']:.4f}, its LOCO {worst['value LOCO']:.4f} (limit 1.01)")

    print("\nPer-run cost ratio to UP (all runs, all settings) and the p95 of the cost itself:")
    for name in ("rule", "LOCO", "survival", "survival LOCO", "value", "value LOCO"):
        ratios, costs_, ups, where = [], [], [], []
        for s in SETTINGS:
            keys = list(cost["uniform-progress"][s])
            src = (loco_costs(s, keys) if name == "LOCO" else sv_loco_costs(s, keys) if name == "survival LOCO"
                   else val_loco_costs(s, keys) if name == "value LOCO" else {k: cost[name][s][k] for k in keys})
            for k in keys:
                u = cost["uniform-progress"][s][k]
                ratios.append(src[k] / u)
                costs_.append(src[k])
                ups.append(u)
                where += [(s, k[1], i) for i in range(len(u))]
        r = np.concatenate(ratios)
        cc, uu = np.concatenate(costs_), np.concatenate(ups)
        order = np.argsort(r)[::-1][:3]
        print(f"  {name}: median {np.median(r):.3f}, p95 {np.percentile(r, 95):.3f}, worst {r.max():.3f}; "
              f"p95 cost ${np.percentile(cc, 95):.2f} (UP ${np.percentile(uu, 95):.2f}), max ${cc.max():.2f} "
              f"(UP ${uu.max():.2f}); worst runs: " +
              ", ".join(f"d={where[i][0][0]} C/R={where[i][0][1]} {where[i][1]} #{where[i][2]} x{r[i]:.3f}"
                        for i in order))
    lo_miss = sum(misses.get(n, 0) for n in set(loco.values()))
    sv_miss = sum(misses.get(f"survival|{c}|{r}", 0) for (c, r) in {(c, r) for (c, _), r in sv_pick.items()})
    print(f"spotwise (survival) misses: shipped {misses.get('survival', 0)}, LOCO picks (all their runs) {sv_miss}")
    print(f"spotwise-value misses: shipped {misses.get('value', 0)}, LOCO "
          f"{sum(misses.get(f'value|{c}', 0) for c in cols)}")
    print(f"\nmisses: uniform-progress {misses.get('uniform-progress', 0)}, spotwise-rule {misses.get('rule', 0)}, "
          f"grid points LOCO picked {lo_miss} (grid points with misses are never picked: "
          f"{len(grid) - len(grid_names)})")
    print(f"elapsed {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
