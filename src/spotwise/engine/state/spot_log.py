"""What runs see of spot in a zone, kept for the runs after them (the zone history, live).

Why: ``spotwise`` forecasts spot spells better when it is shown the zone's recent history
(docs/policies.md, issue 19's fifth round: 1-2 points of the headroom with a week of it). A user
rarely has a trace file of the zone, but the orchestrator watches spot in every run it drives. So
each run writes down what it saw, and a later run at the same site and instance type is shown the
last ``spot_history_hours`` of it when its task names no ``spot_history`` file
(:func:`recorded_history`, called by the orchestrator before its first policy tick).

What counts as seen, once per policy tick, per (cloud, region, instance type) — :meth:`SpotLog.observe`:

* **1, obtainable**: a spot worker of that type is running there (as the traces' ``counts >= 1``);
* **0, not obtainable**: none is running, and a spot launch of that type there answered a capacity
  error within the orchestrator's site memory (60 s), or a spot worker of it was preempted since
  the last tick;
* otherwise **nothing is written**: the tick is unknown (``-1``) in a later run's history. The
  survival model counts only spells that both start and end on known ticks
  (:meth:`~spotwise.policies.spells.SpellBook.add_history`), so the hours between runs do not
  glue two runs' spells into one.

Storage: one :class:`~spotwise.engine.state.db.SpotObservation` row per stretch of one state. A stretch's
row is written when it opens and its end moved forward at most every :data:`FLUSH_S` while it
lasts, so a crash of this process loses at most that much of it. A failed write is logged and the
run goes on: the history is a hint for later runs, never a reason to stop this one.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select

from spotwise.engine.state import db

log = logging.getLogger("spotwise.spot_log")

FLUSH_S = 60.0        # the open stretch's end is written at least this often
GAP_TICKS = 2.5       # evidence later than this many ticks after the last one starts a new stretch
UP, DOWN = 1, 0


@dataclass(frozen=True, slots=True)
class SiteKey:
    """Where spot was seen: the availability of one instance type in one region of one cloud."""

    cloud: str
    region: str
    instance_type: str

    def __str__(self) -> str:
        return f"{self.cloud}/{self.region}/{self.instance_type}"

    @property
    def site(self) -> str:
        """The site (``cloud/region``) a Ray cluster of this instance type would live in."""
        return f"{self.cloud}/{self.region}"


@dataclass
class _Stretch:
    state: int
    t_start: float
    t_last: float            # time of the newest tick in it
    row_id: int | None = None
    written_end: float = 0.0


class SpotLog:
    """One run's writer. ``tick_s``: how often :meth:`observe` is called (the policy interval);
    a tick at time ``t`` covers ``[t, t + tick_s)``."""

    def __init__(self, job_id: str, tick_s: float) -> None:
        if not (tick_s > 0 and math.isfinite(tick_s)):
            raise ValueError(f"tick_s must be a positive number of seconds, got {tick_s!r}")
        self.job_id = job_id
        self.tick_s = float(tick_s)
        self._open: dict[SiteKey, _Stretch] = {}
        self.failed_writes = 0

    def observe(self, key: SiteKey, state: int | None, now: float) -> None:
        """This tick's evidence at ``key``: :data:`UP`, :data:`DOWN` or None (none either way)."""
        cur = self._open.get(key)
        if cur is not None and (state != cur.state or now - cur.t_last > GAP_TICKS * self.tick_s):
            self._close(key, cur)
            cur = None
        if state is None:
            return
        if state not in (UP, DOWN):
            raise ValueError(f"state must be {UP}, {DOWN} or None, got {state!r}")
        if cur is None:
            cur = self._open[key] = _Stretch(state=state, t_start=now, t_last=now)
            self._write(key, cur)
            return
        cur.t_last = now
        if self._end(cur) - cur.written_end >= FLUSH_S:
            self._write(key, cur)

    def open_keys(self) -> list[SiteKey]:
        """The keys with a stretch still open (their next tick without evidence closes it)."""
        return list(self._open)

    def close(self) -> None:
        """Write every open stretch's end (the run is over)."""
        for key, cur in list(self._open.items()):
            self._close(key, cur)

    def _end(self, cur: _Stretch) -> float:
        return cur.t_last + self.tick_s

    def _close(self, key: SiteKey, cur: _Stretch) -> None:
        self._open.pop(key, None)
        if cur.written_end != self._end(cur) or cur.row_id is None:
            self._write(key, cur)

    def _write(self, key: SiteKey, cur: _Stretch) -> None:
        """Insert the stretch, or move its end. Through :func:`db.write` (the write lock taken up
        front, a lost race run again): a plain session read the row, then wrote, and SQLite
        answered ``database is locked`` at once when another writer (the ledger, the curves) had
        committed in between, seen on a local launch."""
        end = self._end(cur)

        def upsert(s) -> int:
            row = s.get(db.SpotObservation, cur.row_id) if cur.row_id is not None else None
            if row is None:
                row = db.SpotObservation(cloud=key.cloud, region=key.region, instance_type=key.instance_type,
                                         job_id=self.job_id, state=cur.state, t_start=cur.t_start, t_end=end)
                s.add(row)
                s.flush()
            else:
                row.t_end = end
            return int(row.id)

        try:
            cur.row_id = db.write(upsert)
            cur.written_end = end
        except Exception as e:  # noqa: BLE001 - a hint for later runs: this run goes on without it
            self.failed_writes += 1
            log.warning("could not record spot availability at %s: %s", key, e)


def recorded_history(key: SiteKey, *, now: float, hours: float, tick_s: float) -> np.ndarray:
    """The last ``hours`` before ``now`` at ``key``, one entry per ``tick_s`` (oldest first): 1 / 0
    where some run saw spot obtainable / not, ``-1`` where none saw either. Where runs overlapped and
    disagree, obtainable wins (one of them had spot there). Feed to ``Policy.observe_history``."""
    if not (tick_s > 0 and math.isfinite(tick_s)) or not (hours >= 0 and math.isfinite(hours)):
        raise ValueError(f"hours must be >= 0 and tick_s > 0, got {hours!r}, {tick_s!r}")
    n = int(math.ceil(hours * 3600 / tick_s - 1e-9))
    out = np.full(n, -1, dtype=np.int8)
    if n == 0:
        return out
    t0 = now - n * tick_s
    T = db.SpotObservation
    with db.session() as s:
        rows = s.execute(select(T.state, T.t_start, T.t_end).where(
            T.cloud == key.cloud, T.region == key.region, T.instance_type == key.instance_type,
            T.t_end > t0, T.t_start < now)).all()
    for state in (DOWN, UP):               # obtainable written last: it wins an overlap
        for st, a, b in rows:
            if st != state:
                continue
            i0 = max(0, int(round((a - t0) / tick_s)))
            i1 = min(n, max(i0 + 1, int(round((b - t0) / tick_s))))
            out[i0:i1] = state
    return out
