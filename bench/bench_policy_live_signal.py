"""Issue 19: what `spotwise` is worth when it sees spot the way a live run does.

The simulator (and every headroom figure in docs/policies.md) shows the policy the true spot
availability at every tick, including while the job runs on on-demand. A live run has no such
signal: it learns whether spot is obtainable only by asking for it (a launch that answers a
capacity error, or a spot worker that runs or is preempted). This bench replays the same 210
(setting, trace) pairs with an exact optimum, 5 runs each (seed 0), 168 h of zone history, with
`spotwise` (shipped knobs) shown spot in four ways:

* ``sim``: the truth at every tick (the reference, what the headroom bench measures);
* ``live today``: the orchestrator's rule today (:meth:`spotwise.engine.run.market_watch.MarketWatch.availability`): spot
  counts as obtainable unless a spot launch failed within the last minute. On on-demand nothing is
  asked, so at the traces' ticks (150-600 s, longer than that minute) spot always looks obtainable
  there; a move to spot that finds none is abandoned and the run stays on on-demand;
* ``probe while unseen``: on on-demand the policy sees the last evidence; while that says "not
  obtainable", one spot worker is asked for each tick (a probe). Granted, spot is "obtainable" from
  then on (held, even if it goes away unseen, until a move finds none); a probe granted while the
  policy stays on on-demand is ended at once, charged one minute of spot;
* ``probe every tick``: one spot worker asked for every tick on on-demand, the same charge: the
  truth, paid for.

The settings, lanes, start points, histories, UP baseline and share are those of
``bench_policy_knob_selection.py`` (imported from it: its ``--parts oracle,noisy`` runs).

Run: ``nice -n 5 python bench/bench_policy_live_signal.py`` (2-3 min; prints shares of the
UP -> optimum headroom, per setting, misses, probes dropped per run, and the ratio to ``sim``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# bench/ is sys.path[0] when this file runs as a script
from bench_policy_knob_selection import (  # noqa: E402
    COARSE_S, HISTORY_H, SETTINGS, STARTS, _baseline, _lane_runs, _share)
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE  # noqa: E402
from spotwise.policies.rules.survival_policy import SpotwiseSurvival  # noqa: E402
from spotwise.policies.traces import load_builtin  # noqa: E402

PROBE_CHARGE_MIN = 1.0       # a granted probe the policy does not use: one billing minute of spot


class LiveSignal(SpotwiseSurvival):
    """``spotwise`` shown spot as a live run would see it (``mode``: ``today``, ``probe-unseen``,
    ``probe-every``); counts the probes it dropped per lane (``drops``)."""

    def __init__(self, mode: str, lanes: int) -> None:
        super().__init__()
        self.mode, self.drops = mode, np.zeros(lanes)

    def step(self, v, st):
        true = np.asarray(v.has_spot).copy()
        on_od = v.current == OD_CODE
        ev = st.setdefault("_live_seen", true.copy())     # the last evidence, per lane
        probe = np.zeros(true.shape, dtype=bool)
        if self.mode == "today":
            vis = np.where(on_od, True, true)
        elif self.mode == "probe-unseen":
            probe = on_od & ~ev
            ev[probe] = true[probe]
            vis = np.where(on_od, ev, true)
        else:
            probe = on_od
            vis = true
        v.has_spot = vis
        codes = super().step(v, st)
        fail = (codes == SPOT_CODE) & ~true                # asked for spot and found none
        codes = np.where(fail & on_od, OD_CODE, np.where(fail, IDLE, codes)).astype(np.int8)
        self.drops += probe & true & (codes != SPOT_CODE)
        ev[:] = np.where(on_od, ev, true)
        ev[fail] = False
        v.has_spot = true
        return codes


def _costs(traces, mode: str | None) -> dict:
    """(setting, trace key) -> (per-run cost incl. probe charges, probes dropped per run, misses), the
    lanes, start points and histories of :func:`evaluate` (the batches of :func:`_lane_runs`)."""
    out: dict = {}
    make = (lambda a8: SpotwiseSurvival()) if mode is None else (lambda a8: LiveSignal(mode, a8.shape[0]))
    for s, cfg, group, pol, r in _lane_runs(traces, make, HISTORY_H):
        drops = getattr(pol, "drops", np.zeros(r.cost_usd.shape[0]))
        cost = r.cost_usd + drops * cfg.spot_price * cfg.nodes * PROBE_CHARGE_MIN / 60
        for i, tr in enumerate(group):
            sl = slice(STARTS * i, STARTS * (i + 1))
            out[(s, (tr.collection, tr.trace_id))] = (cost[sl], drops[sl], r.missed[sl])
    return out


def main() -> None:
    t0 = time.perf_counter()
    traces = [t for t in load_builtin() if t.gap_seconds >= COARSE_S]
    modes = {"sim (the truth every tick)": None, "live today (obtainable unless a launch just failed)": "today",
             "live, probe while unseen": "probe-unseen", "live, probe every tick": "probe-every"}
    base: dict = {}
    for s in SETTINGS:
        base.update(_baseline(traces, s))
    runs = {name: _costs(traces, mode) for name, mode in modes.items()}
    exact = [k for k, v in base.items() if v["exact"]]

    def share(name: str, keys: list) -> float:
        return _share(base, keys, lambda k: runs[name][k][0])

    ref = share("sim (the truth every tick)", exact)
    print(f"{len(exact)} (setting, trace) pairs with an exact optimum, {STARTS} runs each, {HISTORY_H:g} h of history; "
          "share of the UP -> optimum headroom (ratio to sim); per setting d=0.2 h C/R 0.7/0.8/0.9, d=0.05 h ...")
    for name in modes:
        per = " / ".join(f"{100 * share(name, [k for k in exact if k[0] == s]):.0f}" for s in SETTINGS)
        miss = sum(int(runs[name][k][2].sum()) for k in base)
        drops = " / ".join(f"{np.mean(np.concatenate([runs[name][k][1] for k in exact if k[0] == s])):.1f}"
                           for s in SETTINGS)
        print(f"  {name:52s} {100 * share(name, exact):5.1f} %  x{share(name, exact) / ref:.3f}  per setting {per} %;"
              f"  misses {miss}; probes dropped per run {drops}")
    print(f"total {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
