"""Spot traces: loading the shared JSON format and cutting simulation windows from it.

A trace is a sequence of ticks of ``gap_seconds`` each; ``data[i] == 1`` means spot could be had
(or stayed alive) during ``[i*gap, (i+1)*gap)``. Multi-instance traces also carry ``counts`` (how
many of the requested instances were obtainable), so an N-node gang sees spot only where
``counts >= N`` (:meth:`Trace.available`). The traces shipped with spotwise live in
``spotwise/policies/data/traces`` (see its README for provenance); :func:`builtin_traces_dir`
points there so nothing reads outside the package at run time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spotwise.errors import InputError, Problem


def builtin_traces_dir() -> Path:
    """The directory of traces shipped as package data (one sub-folder per collection)."""
    return Path(__file__).resolve().parent / "data" / "traces"


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """One zone's spot history. Arrays are read-only numpy views; ``counts`` is None for 1-node traces."""

    trace_id: str
    collection: str
    gap_seconds: float
    data: np.ndarray                       # bool per tick: at least one instance available
    counts: np.ndarray | None = None       # int per tick: instances available (multi-instance traces)
    spot_prices: np.ndarray | None = None  # $/h per tick where the source had prices
    on_demand_price: float | None = None
    region: str | None = None
    zone: str | None = None
    metadata: dict = field(default_factory=dict)

    @property
    def num_ticks(self) -> int:
        return int(self.data.shape[0])

    @property
    def tick_h(self) -> float:
        return self.gap_seconds / 3600.0

    @property
    def duration_h(self) -> float:
        return self.num_ticks * self.tick_h

    @property
    def max_nodes(self) -> int:
        """Largest gang the trace can speak for (1 for single-instance traces)."""
        return int(self.metadata.get("instances_requested") or 1) if self.counts is not None else 1

    def available(self, nodes: int = 1) -> np.ndarray:
        """Per-tick availability for a gang of ``nodes``: ``counts >= nodes`` (``data`` for 1 node)."""
        if nodes <= 1 or self.counts is None:
            if nodes > 1 and self.counts is None:
                raise InputError(Problem("nodes", nodes, f"1 for trace {self.trace_id} (it has no per-tick counts)"))
            return self.data
        if nodes > self.max_nodes:
            raise InputError(Problem("nodes", nodes, f"1..{self.max_nodes} for trace {self.trace_id}"))
        return self.counts >= nodes

    def head(self, ticks: int) -> "Trace":
        """The first ``ticks`` ticks (e.g. the paper's 1,781-tick two-week prefix)."""
        sl = slice(0, int(ticks))
        return Trace(trace_id=self.trace_id, collection=self.collection, gap_seconds=self.gap_seconds,
                     data=self.data[sl], counts=None if self.counts is None else self.counts[sl],
                     spot_prices=None if self.spot_prices is None else self.spot_prices[sl],
                     on_demand_price=self.on_demand_price, region=self.region, zone=self.zone,
                     metadata=self.metadata)


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def load_trace(path: str | Path) -> Trace:
    """Parse one trace file; a malformed file is an :class:`InputError` naming the file and field."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(Problem("--trace", str(path), "an existing trace file or directory")) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(Problem("--trace", str(path), f"a JSON trace file ({e})")) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list) or not raw["data"]:
        raise InputError(Problem(f"{p.name}: data", type(raw.get("data") if isinstance(raw, dict) else raw).__name__,
                                 "a non-empty list of 0/1 per tick"))
    meta = raw.get("metadata") or {}
    gap = meta.get("gap_seconds")
    if not isinstance(gap, (int, float)) or gap <= 0:
        raise InputError(Problem(f"{p.name}: metadata.gap_seconds", gap, "a number of seconds > 0"))
    data = np.asarray(raw["data"])
    if data.ndim != 1 or not np.isin(data, (0, 1)).all():
        raise InputError(Problem(f"{p.name}: data", "values other than 0/1", "0 (spot unavailable) or 1 (available)"))
    counts = None
    if raw.get("counts") is not None:
        counts = np.asarray(raw["counts"], dtype=np.int64)
        if counts.shape != data.shape or (counts < 0).any():
            raise InputError(Problem(f"{p.name}: counts", f"{counts.shape[0]} values",
                                     f"{data.shape[0]} non-negative instance counts, one per tick"))
    prices = None
    if raw.get("spot_price_usd_per_hour") is not None:
        prices = np.asarray(raw["spot_price_usd_per_hour"], dtype=np.float64)
        if prices.shape != data.shape:
            prices = None   # a ragged price series is ignored rather than misaligned
    return Trace(
        trace_id=str(meta.get("trace_id") or p.stem),
        collection=str(meta.get("collection") or p.parent.name),
        gap_seconds=float(gap),
        data=_ro(data.astype(bool)),
        counts=None if counts is None else _ro(counts),
        spot_prices=None if prices is None else _ro(prices),
        on_demand_price=meta.get("on_demand_price_usd_per_hour"),
        region=meta.get("region"),
        zone=meta.get("zone"),
        metadata=meta,
    )


def trace_files(paths: list[str | Path]) -> list[Path]:
    """Expand files and directories (recursively, ``*.json`` except ``manifest.json``), sorted."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.json") if f.name != "manifest.json")
            if not found:
                raise InputError(Problem("--trace", str(raw), "a directory holding *.json trace files"))
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(Problem("--trace", str(raw), "an existing trace file or directory"))
    return out


def load_traces(paths: list[str | Path]) -> list[Trace]:
    return [load_trace(f) for f in trace_files(paths)]


def load_builtin(collection: str | None = None) -> list[Trace]:
    """Every shipped trace, or one collection of them (e.g. ``aws-1node-avail-2022-10-26``)."""
    root = builtin_traces_dir()
    if collection is None:
        return load_traces([root])
    if not (root / collection).is_dir():
        names = sorted(d.name for d in root.iterdir() if d.is_dir())
        raise InputError(Problem("collection", collection, ", ".join(names)))
    return load_traces([root / collection])
