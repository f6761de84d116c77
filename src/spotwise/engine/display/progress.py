"""A run's progress as the few lines ``spotwise launch`` keeps redrawn on a terminal.

The orchestrator builds a :class:`Progress` on every monitor tick from what it already knows (the
driver's last snapshot: step and loss; the ledger's spend; the fleet's nodes; the task's deadline):
nothing here asks a cloud or the job anything. :func:`progress_lines` turns it into text; the CLI
only renders that text (:mod:`spotwise.commands.run.live`), so what the display says is tested here,
without a terminal.

Contract of :func:`progress_lines`: at most two lines, each at most ``width`` characters (cut with
``...``), ASCII only (the same rule as :mod:`spotwise.engine.display.sentences`: any terminal encoding shows
it), never a ``{`` from a dict; a value not known yet shows as ``-``, never as ``None``.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from spotwise.provisioner.base import Node

#: how far back the pace (steps/s) looks: long enough to smooth one slow step, short enough to show
#: a resume's restart within a minute
PACE_WINDOW_S = 30.0


@dataclass(frozen=True, slots=True)
class Progress:
    """What the display shows at ``t`` (epoch seconds). ``nodes``: ``(market, zone, count)`` of the
    running nodes, head included; ``deadline_at``: epoch seconds, ``None`` without a deadline."""

    t: float
    steps_total: int
    spend_usd: float
    step: int | None = None
    loss: float | None = None
    eval_loss: float | None = None       # the newest held-out loss (training.eval)
    steps_per_s: float | None = None
    budget_usd: float | None = None
    deadline_at: float | None = None
    nodes: tuple[tuple[str, str, int], ...] = ()
    tokens_per_s: float | None = None     # the run's speed (spotwise.engine.run.views.speed)
    mfu: float | None = None
    peak_memory_bytes: float | None = None


class Pace:
    """Training's pace in steps per second over the last :data:`PACE_WINDOW_S` seconds of samples.
    A step below the last one (training resumed from a checkpoint) starts the window again."""

    def __init__(self, window_s: float = PACE_WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, int]] = deque()

    def add(self, t: float, step: int | None) -> float | None:
        """Record ``step`` at ``t``; the pace (``None`` until two samples with a step apart)."""
        if step is None:
            return self.rate()
        if self._seen and step < self._seen[-1][1]:
            self._seen.clear()
        if not self._seen or self._seen[-1] != (t, step):
            self._seen.append((t, step))
        while len(self._seen) > 2 and t - self._seen[1][0] >= self.window_s:
            self._seen.popleft()
        return self.rate()

    def rate(self) -> float | None:
        if len(self._seen) < 2:
            return None
        (t0, s0), (t1, s1) = self._seen[0], self._seen[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def nodes_by_place(nodes: Iterable[Node]) -> tuple[tuple[str, str, int], ...]:
    """Running nodes counted by ``(market, zone)``, the largest group first."""
    counts = Counter((n.market, n.zone) for n in nodes if n.state not in ("terminated", "stopped"))
    return tuple((m, z, c) for (m, z), c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def duration(seconds: float) -> str:
    """``45 s``, ``1 min 20 s``, ``2 h 05 min``, ``3 d 4 h``: the two largest units."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _si(v: float) -> str:
    """``950``, ``12.3k``, ``4.56M``: three significant digits."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def _usd(usd: float) -> str:
    return f"${usd:,.4f}" if abs(usd) < 1 else f"${usd:,.2f}"


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[:max(0, width - 3)] + "..."


def last_eval(snapshot: dict) -> float | None:
    """The newest held-out loss of a control snapshot (its ``eval_loss`` by step), or None."""
    evals = [e for e in snapshot.get("eval_loss") or [] if isinstance(e.get("loss"), (int, float))]
    return float(max(evals, key=lambda e: e["step"])["loss"]) if evals else None


def progress_lines(p: Progress, width: int = 80) -> list[str]:
    """The display: ``step 120/400 | loss 2.31 | eval 2.40 | 3.4 steps/s | $0.0210 of $1.00 | ETA 1 min 20 s``,
    ``deadline in 5 h 00 min | nodes: 2 spot in local-a, 1 on-demand in local-b`` and, once
    training measured them, ``412k tok/s | MFU 41% | peak mem 61.2 GiB``. The fields
    come in the order they matter (the spend before the ETA), so a narrow terminal cuts the least.
    The ETA is the steps left at the recent pace (:class:`Pace`)."""
    step = "-" if p.step is None else str(p.step)
    loss = "-" if p.loss is None or not math.isfinite(p.loss) else f"{p.loss:.4g}"
    parts = [f"step {step}/{p.steps_total}", f"loss {loss}"]
    if p.eval_loss is not None and math.isfinite(p.eval_loss):
        parts.append(f"eval {p.eval_loss:.4g}")
    if p.steps_per_s:
        parts.append(f"{p.steps_per_s:.3g} steps/s")
    parts.append(_usd(p.spend_usd) + (f" of {_usd(p.budget_usd)}" if p.budget_usd is not None else ""))
    if p.steps_per_s and p.step is not None:
        parts.append(f"ETA {duration(max(0, p.steps_total - p.step) / p.steps_per_s)}")
    where = "nodes: " + (", ".join(f"{c} {m} in {z}" for m, z, c in p.nodes) or "none running")
    if p.deadline_at is not None:
        left = p.deadline_at - p.t
        due = f"deadline in {duration(left)}" if left > 0 else f"deadline passed {duration(-left)} ago"
        where = f"{due} | {where}"
    fast = [f"{_si(p.tokens_per_s)} tok/s"] if p.tokens_per_s else []
    if p.mfu is not None:
        fast.append(f"MFU {p.mfu:.0%}")
    if p.peak_memory_bytes:
        fast.append(f"peak mem {p.peak_memory_bytes / 2**30:.3g} GiB")
    lines = [" | ".join(parts), where] + ([" | ".join(fast)] if fast else [])
    return [_fit(line.encode("ascii", "replace").decode(), width) for line in lines]
