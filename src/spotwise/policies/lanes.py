"""Policies written once, run both online (one job) and vectorised (thousands of simulated jobs).

A :class:`LanePolicy` expresses its rule over numpy arrays, one element per *lane* (one simulated
job each). :meth:`LanePolicy.decide` wraps a single :class:`Observation` into a one-lane view, so
the orchestrator and the per-tick reference simulator call exactly the same code as the
vectorised simulator; the two simulators then cross-check each other's accounting in the tests.

Market codes inside lanes: ``0`` none (idle), ``1`` spot, ``2`` on-demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Decision, Observation, Policy

IDLE, SPOT_CODE, OD_CODE = 0, 1, 2
CODE_TO_MARKET = {IDLE: NONE, SPOT_CODE: SPOT, OD_CODE: ON_DEMAND}
MARKET_TO_CODE = {v: k for k, v in CODE_TO_MARKET.items()}
EPS_H = 1e-9


@dataclass(slots=True)
class Lanes:
    """What every lane knows at the start of one tick (hours; arrays of one element per lane)."""

    elapsed_h: np.ndarray | float     # one clock for every lane (a scalar) or one per lane
    work_done_h: np.ndarray
    restart_left_h: np.ndarray
    current: np.ndarray          # market code running now (after any preemption)
    has_spot: np.ndarray         # bool: spot can be had for this tick
    preemptions: np.ndarray
    deadline_h: float
    task_h: float
    restart_h: float
    tick_h: float
    # Filled in by LanePolicy.step from the policy's own history (or from ``given_*`` below):
    up_h: np.ndarray | None = None     # hours spot has been continuously available (0 if not now)
    down_h: np.ndarray | None = None   # hours spot has been continuously unavailable (0 if available)
    # What the caller knows better than the policy's own history (a live run that began before the
    # policy saw its first tick): Observation.spot_streak_h / spot_down_h of the market in use.
    given_up_h: np.ndarray | None = None
    given_down_h: np.ndarray | None = None
    # Prices ($/h) and what the job has spent so far, where known (the simulators always pass them;
    # a live caller through Observation.spot_price / on_demand_price / spent_usd). Rules that
    # bound their spend (``spotwise``: at most 1.05 x on-demand alone + one spot tick) need them;
    # without them such a bound is simply not applied.
    spot_price: float | None = None
    on_demand_price: float | None = None
    spent_usd: np.ndarray | None = None

    @property
    def work_left_h(self) -> np.ndarray:
        return np.maximum(self.task_h - self.work_done_h, 0.0)

    @property
    def time_left_h(self) -> np.ndarray:
        # a scalar when the clock is one scalar for all lanes (it broadcasts like an array)
        return cast(np.ndarray, self.deadline_h - self.elapsed_h)

    def ticks_h(self, hours: np.ndarray) -> np.ndarray:
        """Round a duration up to whole ticks (what it really takes in a tick-billed world)."""
        return np.ceil(hours / self.tick_h - 1e-9) * self.tick_h

    def remaining_whole_ticks_h(self) -> np.ndarray:
        """Time to the deadline, rounded down to whole ticks."""
        return np.floor(self.time_left_h / self.tick_h + 1e-9) * self.tick_h


class LanePolicy(Policy):
    """A policy whose rule is vectorised over lanes; ``decide`` is the one-lane special case."""

    def __init__(self) -> None:
        self._state: dict[str, Any] = self.new_state(1)

    # -- to implement ----------------------------------------------------------------------------
    def init_state(self, n: int) -> dict[str, Any]:
        """Per-lane memory of the rule (arrays of length ``n``)."""
        return {}

    def rule(self, v: Lanes, st: dict[str, Any]) -> np.ndarray:
        """Market codes for this tick. May request spot only where ``v.has_spot``."""
        raise NotImplementedError

    # -- machinery -------------------------------------------------------------------------------
    def new_state(self, n: int) -> dict[str, Any]:
        st = self.init_state(n)
        st["_up_since"] = np.zeros(n)
        st["_down_since"] = np.zeros(n)
        st["_last_has"] = np.zeros(n, dtype=np.int8) - 1   # -1: no observation yet
        return st

    def prime(self, st: dict[str, Any], history: np.ndarray, tick_h: float) -> None:
        """Before the first tick: ``history`` (``[lanes, H]`` int8, 1 / 0, ``-1`` = unknown; oldest
        first) is the zone's availability before each job starts. The spell it ends with goes on
        into the job, so the streak / outage ages start at its age; rules that learn from history
        override :meth:`prime_rule`."""
        h = np.asarray(history, dtype=np.int8)
        if h.ndim != 2 or h.shape[0] != st["_last_has"].shape[0]:
            raise ValueError(f"history must be [lanes, ticks], got shape {h.shape}")
        if h.shape[1] == 0:
            return
        last = h[:, -1]
        differs = h != last[:, None]
        # ticks since the last tick that differs from the final one (the whole row if none does)
        rev_first = np.where(differs[:, ::-1].any(axis=1), differs[:, ::-1].argmax(axis=1), h.shape[1])
        known = last >= 0
        age_h = rev_first * tick_h
        st["_last_has"] = np.where(known, last, st["_last_has"]).astype(np.int8)
        st["_up_since"] = np.where(known & (last == 1), -age_h, st["_up_since"])
        st["_down_since"] = np.where(known & (last == 0), -age_h, st["_down_since"])
        self.prime_rule(st, h, tick_h)

    def prime_rule(self, st: dict[str, Any], history: np.ndarray, tick_h: float) -> None:
        """Learn from the history :meth:`prime` was given (default: nothing)."""

    def observe_history(self, avail: Any, tick_h: float) -> None:
        row = np.asarray(avail, dtype=np.int8).reshape(1, -1)
        self.prime(self._state, row, tick_h)

    def step(self, v: Lanes, st: dict[str, Any]) -> np.ndarray:
        """Update the availability history, then apply the rule (both simulators and decide)."""
        has = v.has_spot.astype(np.int8)
        new_up = has != st["_last_has"]
        st["_up_since"] = np.where(new_up & (has == 1), v.elapsed_h, st["_up_since"])
        st["_down_since"] = np.where(new_up & (has == 0), v.elapsed_h, st["_down_since"])
        st["_last_has"] = has
        v.up_h = np.where(has == 1, v.elapsed_h - st["_up_since"] + v.tick_h, 0.0)
        v.down_h = np.where(has == 0, v.elapsed_h - st["_down_since"] + v.tick_h, 0.0)
        if v.given_up_h is not None:
            v.up_h = np.where(has == 1, np.maximum(v.given_up_h, v.tick_h), 0.0)
        if v.given_down_h is not None:
            v.down_h = np.where(has == 0, np.maximum(v.given_down_h, v.tick_h), 0.0)
        codes = np.asarray(self.rule(v, st), dtype=np.int8)
        return np.where((codes == SPOT_CODE) & ~v.has_spot, IDLE, codes).astype(np.int8)

    def explain(self, v: Lanes, st: dict[str, Any], code: int) -> str:
        """Why lane 0 got ``code`` this tick (``decide`` puts it in ``Decision.reason``). Rules that
        record their reasons override this; the default names the market only."""
        return {IDLE: "wait", SPOT_CODE: "spot", OD_CODE: "on-demand"}[code]

    def reset(self) -> None:
        self._state = self.new_state(1)

    def decide(self, obs: Observation) -> Decision:
        """One lane. With several regions: spot is "available" if any region has it; the region is
        the current one while it has spot (moving costs a changeover), else the cheapest with spot;
        on-demand stays where it runs, or starts in the cheapest on-demand region."""
        region = obs.region
        spot_region = od_region = region
        if len(obs.spot_available) > 1:
            with_spot = [r for r, a in obs.spot_available.items() if a]
            has = bool(with_spot)
            if region in with_spot and obs.current == SPOT:
                spot_region = region
            elif with_spot:
                spot_region = min(with_spot, key=lambda r: (obs.spot_price.get(r, 0.0), r != region))
            if obs.current != ON_DEMAND or region is None:
                od_region = min(obs.spot_available, key=lambda r: (obs.on_demand_price.get(r, 0.0), r != region))
        elif region is not None and region in obs.spot_available:
            has = bool(obs.spot_available[region])
        elif len(obs.spot_available) == 1:
            has = bool(next(iter(obs.spot_available.values())))
            spot_region = od_region = region if region is not None else next(iter(obs.spot_available))
        else:
            has = False
        _check_observation(obs)
        # The streak ages the caller measured (a live run may have watched the zone before this
        # policy's first tick); absent for the region in question: the policy's own history.
        key = spot_region if has else region
        if key is None and len(obs.spot_available) == 1:
            key = next(iter(obs.spot_available))
        one = key is not None and len(obs.spot_available) <= 1
        given_up = obs.spot_streak_h.get(key) if (one and has and key is not None) else None
        given_down = obs.spot_down_h.get(key) if (one and not has and key is not None) else None
        ps = obs.spot_price.get(spot_region) if spot_region is not None else None
        po = obs.on_demand_price.get(od_region) if od_region is not None else None
        if ps is None and len(obs.spot_price) == 1:
            ps = next(iter(obs.spot_price.values()))
        if po is None and len(obs.on_demand_price) == 1:
            po = next(iter(obs.on_demand_price.values()))
        v = Lanes(
            elapsed_h=np.array([obs.elapsed_h]),
            work_done_h=np.array([obs.work_done_h]),
            restart_left_h=np.array([obs.restart_left_h]),
            current=np.array([MARKET_TO_CODE.get(obs.current, IDLE)], dtype=np.int8),
            has_spot=np.array([has]),
            preemptions=np.array([obs.preemptions]),
            deadline_h=obs.deadline_h, task_h=obs.task_h, restart_h=obs.restart_h, tick_h=obs.tick_h,
            given_up_h=None if given_up is None else np.array([float(given_up)]),
            given_down_h=None if given_down is None else np.array([float(given_down)]),
            spot_price=None if ps is None else float(ps), on_demand_price=None if po is None else float(po),
            spent_usd=np.array([float(obs.spent_usd)]),
        )
        code = int(self.step(v, self._state)[0])
        where = spot_region if code == SPOT_CODE else od_region if code == OD_CODE else region
        return Decision(CODE_TO_MARKET[code], where, self.explain(v, self._state, code))


def _check_observation(obs: Observation) -> None:
    """Bad numbers from the caller are an InputError naming the field, not a silent wrong move."""
    from spotwise.errors import InputError, Problem

    problems = []
    for name in ("elapsed_h", "work_done_h", "restart_h"):
        x = getattr(obs, name)
        if not (isinstance(x, (int, float, np.floating, np.integer)) and np.isfinite(x) and x >= 0):
            problems.append(Problem(f"Observation.{name}", x, "a finite number of hours >= 0"))
    for name in ("task_h", "deadline_h", "tick_h"):
        x = getattr(obs, name)
        if not (isinstance(x, (int, float, np.floating, np.integer)) and np.isfinite(x) and x > 0):
            problems.append(Problem(f"Observation.{name}", x, "a finite number of hours > 0"))
    if obs.current not in MARKET_TO_CODE:
        problems.append(Problem("Observation.current", obs.current, ", ".join(sorted(MARKET_TO_CODE))))
    if not (isinstance(obs.spent_usd, (int, float, np.floating, np.integer)) and np.isfinite(obs.spent_usd)
            and obs.spent_usd >= 0):
        problems.append(Problem("Observation.spent_usd", obs.spent_usd, "a finite amount of $ >= 0"))
    for name in ("spot_price", "on_demand_price"):
        for r, x in getattr(obs, name).items():
            if not (isinstance(x, (int, float, np.floating, np.integer)) and np.isfinite(x) and x >= 0):
                problems.append(Problem(f"Observation.{name}[{r!r}]", x, "a finite price in $/h >= 0"))
    for name in ("spot_streak_h", "spot_down_h"):
        for r, x in getattr(obs, name).items():
            if not (isinstance(x, (int, float, np.floating, np.integer)) and np.isfinite(x) and x >= 0):
                problems.append(Problem(f"Observation.{name}[{r!r}]", x, "a finite number of hours >= 0"))
    if problems:
        raise InputError(problems, source="policy observation")
