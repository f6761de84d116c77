"""How long spot spells last: a small survival model, a prior fitted on traces, updated online.

A *spell* is a maximal run of ticks with spot available (a *streak*) or unavailable (an
*outage*). On every shipped collection both have a decreasing hazard (the longer a spell has
lasted, the longer it is likely to go on) and a heavy tail (median streak 0.2-1.5 h, mean 1-15 h),
and the traces differ a lot from one another (availability 0 to 100 %). So the model is
non-parametric: a histogram of spell lengths over fixed bins (:data:`EDGES_H`, hours), keeping for
each bin the number of spells that ended in it and the sum of their lengths (so the mean length
inside a bin is exact, whatever the tick).

* The **prior** is fitted on a set of traces (:func:`fit_prior`): each collection's histogram is
  normalised to one spell, then the collections are averaged, so a long collection does not
  outweigh the others. The shipped prior (``data/spell_prior.json``, with its provenance and the
  command that made it) is fitted on every shipped trace; the benchmark refits it without the
  held-out collection for leave-one-collection-out.
* **Online**, a run adds every spell it has seen end (:class:`SpellBook`), so after a few hours
  the estimate is mostly the run's own: ``posterior = weight * prior + own counts``, ``weight``
  in pseudo-spells.
* What the policy asks (:func:`residual`): given that the current spell has lasted ``age`` hours,
  the expected remaining life capped at ``horizon`` hours, ``E[min(L - age, horizon) | L > age]``,
  and the probability that it ends before ``horizon``. Vectorised over lanes (one simulated job
  each); one call is a few numpy operations over 40 bins.

Training command (writes the shipped prior and the per-collection models of
:func:`fit_regimes`, ``data/spell_regimes.json``, provenance included)::

    python -m spotwise.policies.spells --out src/spotwise/policies/data/spell_prior.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spotwise.policies.traces import Trace, builtin_traces_dir, load_builtin

# Bin edges in hours: 5-minute bins up to 2 h (the changeover scale), then coarser; the last bin is
# open (its spells' mean length is kept, so nothing is assumed about the tail's shape).
EDGES_H = np.concatenate([np.arange(0.0, 2.0, 1.0 / 12.0), [2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, np.inf]])
NBINS = len(EDGES_H) - 1
KINDS = ("streak", "outage")
PRIOR_PATH = Path(__file__).resolve().parent / "data" / "spell_prior.json"
REGIMES_PATH = Path(__file__).resolve().parent / "data" / "spell_regimes.json"


def spells(avail: np.ndarray, tick_h: float) -> tuple[np.ndarray, np.ndarray]:
    """Complete spells of one availability series, in hours: (streaks, outages). The first and the
    last spell are cut by the ends of the series (censored), so they are left out."""
    a = np.asarray(avail, dtype=np.int8)
    if a.size == 0:
        return np.zeros(0), np.zeros(0)
    cut = np.flatnonzero(np.diff(a)) + 1
    starts = np.concatenate([[0], cut])
    lengths = np.diff(np.concatenate([starts, [a.size]])) * tick_h
    kind = a[starts]
    inner = slice(1, max(len(starts) - 1, 1))
    lengths, kind = lengths[inner], kind[inner]
    return lengths[kind == 1], lengths[kind == 0]


def known_stretches(row: np.ndarray) -> list[np.ndarray]:
    """The maximal runs of known (0 / 1) ticks of one history row (``-1`` = unknown), oldest first."""
    r = np.asarray(row, dtype=np.int8)
    known = np.concatenate([[False], r >= 0, [False]])
    edges = np.flatnonzero(np.diff(known.astype(np.int8)))
    return [r[a:b] for a, b in zip(edges[::2], edges[1::2])]


def trailing_spell(avail: np.ndarray) -> tuple[int, int]:
    """(1 / 0: spot up or down at the end of ``avail``, how many ticks it has been so); a non-empty
    series of 0 / 1 ticks."""
    last = int(avail[-1])
    change = np.flatnonzero(avail != last)
    return last, int(avail.size - (int(change[-1]) + 1 if change.size else 0))


def bin_of(length_h: np.ndarray) -> np.ndarray:
    """Bin index of spell lengths (a spell of exactly an edge goes to the bin that edge opens)."""
    return np.clip(np.searchsorted(EDGES_H, np.asarray(length_h) + 1e-9, side="right") - 1, 0, NBINS - 1)


def histogram(lengths_h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(count, sum of lengths in hours) per bin."""
    b = bin_of(lengths_h)
    return (np.bincount(b, minlength=NBINS).astype(float),
            np.bincount(b, weights=np.asarray(lengths_h, dtype=float), minlength=NBINS))


@dataclass(frozen=True, slots=True)
class SpellPrior:
    """Per kind (``streak`` / ``outage``): the share of spells ending in each bin (sums to 1) and their
    mean length there (hours). ``meta``: provenance (traces, date, command)."""

    pmf: dict[str, np.ndarray]
    mean_h: dict[str, np.ndarray]
    meta: dict

    def to_json(self) -> dict:
        return {"edges_h": [float(x) if np.isfinite(x) else "inf" for x in EDGES_H],
                **{k: {"pmf": [round(float(x), 8) for x in self.pmf[k]],
                       "mean_h": [round(float(x), 6) for x in self.mean_h[k]]} for k in KINDS},
                "meta": self.meta}

    @classmethod
    def from_json(cls, doc: dict) -> "SpellPrior":
        edges = np.array([np.inf if x == "inf" else float(x) for x in doc["edges_h"]])
        if edges.shape != EDGES_H.shape or not np.allclose(edges[:-1], EDGES_H[:-1]):
            raise ValueError("spell prior: bin edges differ from spotwise.policies.spells.EDGES_H; refit it")
        pmf = {k: np.asarray(doc[k]["pmf"], dtype=float) for k in KINDS}
        mean = {k: np.asarray(doc[k]["mean_h"], dtype=float) for k in KINDS}
        for k in KINDS:
            if pmf[k].shape != (NBINS,) or not np.isclose(pmf[k].sum(), 1.0, atol=1e-5) or (pmf[k] < 0).any():
                raise ValueError(f"spell prior: {k}.pmf must be {NBINS} shares >= 0 summing to 1")
        return cls(pmf=pmf, mean_h=mean, meta=dict(doc.get("meta") or {}))


def fit_prior(traces: list[Trace], *, command: str = "", nodes: int = 1) -> SpellPrior:
    """Pool the spells of ``traces``: normalise each collection to one spell, average collections.
    Collections with no complete spell of a kind (spot always there, or never) add nothing to it."""
    by_col: dict[str, dict[str, list[np.ndarray]]] = {}
    for tr in traces:
        up, down = spells(tr.available(min(nodes, tr.max_nodes)), tr.tick_h)
        box = by_col.setdefault(tr.collection, {"streak": [], "outage": []})
        box["streak"].append(up)
        box["outage"].append(down)
    pmf, mean = {}, {}
    for k in KINDS:
        acc_n = np.zeros(NBINS)
        acc_s = np.zeros(NBINS)
        used = 0
        for col in sorted(by_col):
            lengths = np.concatenate(by_col[col][k]) if by_col[col][k] else np.zeros(0)
            if lengths.size == 0:
                continue
            n, s = histogram(lengths)
            acc_n += n / lengths.size
            acc_s += s / lengths.size
            used += 1
        if used == 0:
            raise ValueError(f"no complete {k} in the given traces: cannot fit a spell prior")
        pmf[k] = acc_n / acc_n.sum()
        mids = np.where(np.isfinite(EDGES_H[1:]), (EDGES_H[:-1] + EDGES_H[1:]) / 2, EDGES_H[:-1] * 1.5)
        mean[k] = np.where(acc_n > 0, acc_s / np.maximum(acc_n, 1e-300), mids)
    meta = {
        "what": "share of spot streaks / outages ending in each length bin, and their mean length (hours)",
        "collections": sorted(by_col),
        "traces": len(traces),
        "weighting": "each collection normalised to one spell, then averaged; censored first/last spells left out",
        "fitted": _dt.date.today().isoformat(),
        "command": command,
        "source": "traces in spotwise/policies/data/traces (provenance: its README.md)",
    }
    return SpellPrior(pmf=pmf, mean_h=mean, meta=meta)


def fit_regimes(traces: list[Trace], *, command: str = "", nodes: int = 1) -> dict[str, SpellPrior]:
    """One spell model per collection (a *regime*: how spot behaves in one kind of market), for a policy
    that picks the likeliest one given what its run has seen. A kind a collection has no complete
    spell of (spot always there, or never) is taken from the pool of all ``traces``."""
    pooled = fit_prior(traces, command=command, nodes=nodes)
    out = {}
    for col in sorted({t.collection for t in traces}):
        mine = [t for t in traces if t.collection == col]
        pmf, mean = {}, {}
        for k in KINDS:
            lengths = [spells(t.available(min(nodes, t.max_nodes)), t.tick_h)[0 if k == "streak" else 1] for t in mine]
            flat = np.concatenate(lengths) if lengths else np.zeros(0)
            if flat.size == 0:
                pmf[k], mean[k] = pooled.pmf[k], pooled.mean_h[k]
                continue
            n, tot = histogram(flat)
            pmf[k] = n / n.sum()
            mean[k] = np.where(n > 0, tot / np.maximum(n, 1e-300), pooled.mean_h[k])
        out[col] = SpellPrior(pmf=pmf, mean_h=mean, meta={**pooled.meta, "collections": [col], "traces": len(mine)})
    return out


_REGIMES: dict[str, SpellPrior] | None = None


def load_regimes(path: str | Path | None = None) -> dict[str, SpellPrior]:
    """The shipped per-collection spell models (cached), or those in ``path``."""
    global _REGIMES
    if path is None and _REGIMES is not None:
        return _REGIMES
    doc = json.loads(Path(path or REGIMES_PATH).read_text())
    regimes = {name: SpellPrior.from_json({"edges_h": doc["edges_h"], **body, "meta": doc["meta"]})
               for name, body in doc["regimes"].items()}
    if path is None:
        _REGIMES = regimes
    return regimes


def regimes_to_json(regimes: dict[str, SpellPrior], meta: dict) -> dict:
    body = {name: {k: v for k, v in p.to_json().items() if k in KINDS} for name, p in sorted(regimes.items())}
    return {"edges_h": SpellPrior.to_json(next(iter(regimes.values())))["edges_h"], "regimes": body, "meta": meta}


_PRIOR: SpellPrior | None = None


def load_prior(path: str | Path | None = None) -> SpellPrior:
    """The shipped prior (cached), or one from ``path``."""
    global _PRIOR
    if path is not None:
        return SpellPrior.from_json(json.loads(Path(path).read_text()))
    if _PRIOR is None:
        _PRIOR = SpellPrior.from_json(json.loads(PRIOR_PATH.read_text()))
    return _PRIOR


class SpellBook:
    """The spells a set of lanes has seen end, per lane, plus the prior: the posterior histogram.

    ``observe(has, elapsed_h)`` once per tick, before asking; it records a spell when it ends (the
    first spell a lane sees is kept too: where it began before the lane's first tick, its length is
    a lower bound, which only shortens the estimate)."""

    def __init__(self, prior: SpellPrior, n: int, weight: float) -> None:
        self.prior = prior
        self.weight = float(weight)
        self.count = {k: np.zeros((n, NBINS)) for k in KINDS}
        self.total = {k: np.zeros((n, NBINS)) for k in KINDS}
        self._last = np.full(n, -1, dtype=np.int8)
        self._since = np.zeros(n)

    def observe(self, has: np.ndarray, elapsed_h: np.ndarray | float) -> None:
        h = np.asarray(has, dtype=np.int8)
        t = np.broadcast_to(np.asarray(elapsed_h, dtype=float), h.shape)
        ended = (h != self._last) & (self._last >= 0)
        if ended.any():
            idx = np.flatnonzero(ended)
            length = t[idx] - self._since[idx]
            b = bin_of(length)
            for k, code in (("streak", 1), ("outage", 0)):
                sel = self._last[idx] == code
                np.add.at(self.count[k], (idx[sel], b[sel]), 1.0)
                np.add.at(self.total[k], (idx[sel], b[sel]), length[sel])
        new = h != self._last
        self._since = np.where(new, t, self._since)
        self._last = h

    def add_history(self, history: np.ndarray, tick_h: float, weight: float = 1.0) -> None:
        """Count the complete spells of each lane's history (``[lanes, H]``, 1 / 0, ``-1`` = unknown,
        oldest first; :meth:`LanePolicy.prime <spotwise.policies.lanes.LanePolicy.prime>`) as if the
        lane had seen them, each worth ``weight`` spells; the spell the history ends with goes on into
        the job, so it is the one :meth:`observe` will see end."""
        h = np.asarray(history, dtype=np.int8)
        for i in range(h.shape[0]):
            # An unknown tick cuts the series: the spells on either side of it are censored there (a
            # live run's recorded history has gaps between runs), so each known stretch is counted
            # on its own, and only a stretch that reaches the end goes on into the job.
            segments = known_stretches(h[i])
            for seg in segments:
                for k, lengths in zip(KINDS, spells(seg, tick_h)):
                    if lengths.size:
                        n, tot = histogram(lengths)
                        self.count[k][i] += weight * n
                        self.total[k][i] += weight * tot
            if segments and h[i, -1] >= 0:
                last, age = trailing_spell(segments[-1])
                self._last[i] = last
                self._since[i] = -age * tick_h

    def seen(self, kind: str) -> np.ndarray:
        """How many spells of ``kind`` each lane has seen end."""
        return self.count[kind].sum(axis=1)

    def residual(self, kind: str, age_h: np.ndarray, horizon_h: np.ndarray,
                 tick_h: float) -> tuple[np.ndarray, np.ndarray]:
        """``(E[min(L - age + tick, horizon) | L >= age], P(L - age + tick < horizon | L >= age))`` per
        lane, under the posterior (``age`` includes the current tick). Bins whose mean length is not above ``age`` are excluded (the spell outlived them);
        beyond the last bin the spell is taken to end at ``age`` + one bin's worth (no tail assumed)."""
        pw = self.weight * self.prior.pmf[kind]
        n = pw[None, :] + self.count[kind]
        s = pw[None, :] * self.prior.mean_h[kind][None, :] + self.total[kind]
        mu = s / np.maximum(n, 1e-300)
        age = np.asarray(age_h, dtype=float)[:, None]
        hz = np.asarray(horizon_h, dtype=float)[:, None]
        # ``age`` counts the current tick, so a spell of length exactly ``age`` is still live now
        # and ends after this tick: what is left of it from now is ``L - age + tick``.
        live = (mu > age - tick_h / 2) & (n > 0)
        w = np.where(live, n, 0.0)
        z = w.sum(axis=1)
        left = np.maximum(mu - age, 0.0) + tick_h
        rem = np.minimum(left, hz)
        e = (w * rem).sum(axis=1) / np.maximum(z, 1e-300)
        p_end = (w * (left < hz)).sum(axis=1) / np.maximum(z, 1e-300)
        # Outlived every bin (longer than any spell seen): assume it lasts about as long again.
        fallback = z <= 0
        e = np.where(fallback, np.minimum(age[:, 0], hz[:, 0]), e)
        p_end = np.where(fallback, 0.5, p_end)
        return e, p_end


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Fit the spell-length prior on the shipped traces (or a subset).")
    ap.add_argument("--out", default=str(PRIOR_PATH))
    ap.add_argument("--exclude", nargs="*", default=[], help="collections to leave out")
    ap.add_argument("--regimes-out", default=str(REGIMES_PATH),
                    help="where to write the per-collection spell models (spotwise-value's regimes)")
    args = ap.parse_args(argv)
    traces = [t for t in load_builtin() if t.collection not in set(args.exclude)]
    cmd = "python -m spotwise.policies.spells --out src/spotwise/policies/data/spell_prior.json" + (
        " --exclude " + " ".join(args.exclude) if args.exclude else "")
    prior = fit_prior(traces, command=cmd)
    prior.meta["traces_dir"] = str(builtin_traces_dir().relative_to(Path(__file__).resolve().parents[2]))
    Path(args.out).write_text(json.dumps(prior.to_json(), indent=1) + "\n")
    print(f"wrote {args.out}: {len(traces)} traces, collections {', '.join(prior.meta['collections'])}")
    regimes = fit_regimes(traces, command=cmd)
    meta = {**prior.meta, "what": "per collection: share of spot streaks / outages ending in each length bin, and "
                                  "their mean length (hours); a kind a collection never completes is the pool's"}
    Path(args.regimes_out).write_text(json.dumps(regimes_to_json(regimes, meta), indent=1) + "\n")
    print(f"wrote {args.regimes_out}: {len(regimes)} regimes")


if __name__ == "__main__":
    main()
