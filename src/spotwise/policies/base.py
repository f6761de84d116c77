"""The ``Policy`` interface: observe the run's state each tick, decide where it should run.

A policy sees only what a real system knows online (time so far, work left, deadline, whether
spot is available now and how long it has lasted, what it spent) and answers with a
:class:`Decision`: run on spot, on on-demand, or wait (``none``), optionally naming a region.
The simulator and the orchestrator both call :meth:`Policy.decide` once per tick.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

SPOT = "spot"
ON_DEMAND = "on-demand"
NONE = "none"


@dataclass(slots=True, kw_only=True)
class Observation:
    """What the run knows at one tick. Hours are wall-clock hours since the job started."""

    elapsed_h: float
    deadline_h: float
    task_h: float
    work_done_h: float
    restart_h: float
    tick_h: float
    current: str = NONE                  # market the job runs on now: spot | on-demand | none
    region: str | None = None            # region/zone the job runs in now
    spot_available: dict[str, bool] = field(default_factory=dict)   # region -> available now
    spot_price: dict[str, float] = field(default_factory=dict)      # region -> $/h
    on_demand_price: dict[str, float] = field(default_factory=dict)  # region -> $/h
    spot_streak_h: dict[str, float] = field(default_factory=dict)    # region -> hours continuously available
    preemptions: int = 0
    spent_usd: float = 0.0
    budget_usd: float | None = None
    restart_left_h: float = 0.0          # changeover delay still to pay on the current cluster
    spot_down_h: dict[str, float] = field(default_factory=dict)      # region -> hours continuously unavailable

    @property
    def work_left_h(self) -> float:
        return max(0.0, self.task_h - self.work_done_h)

    @property
    def time_left_h(self) -> float:
        return self.deadline_h - self.elapsed_h


@dataclass(frozen=True, slots=True)
class Decision:
    market: str                  # spot | on-demand | none
    region: str | None = None    # None: stay where we are / the only region
    reason: str = ""             # why, in words with the numbers behind it (for a live run's report)


class Policy(ABC):
    """Decides each tick. Stateful across ticks of one run; :meth:`reset` starts a new run."""

    name: str = ""

    def reset(self) -> None:
        """Forget everything about the previous run."""

    @abstractmethod
    def decide(self, obs: Observation) -> Decision: ...


_REGISTRY: dict[str, Callable[..., Policy]] = {}
_MODULES: dict[str, str] = {}


def register_policy(name: str) -> Callable[[type[Policy]], type[Policy]]:
    def deco(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_all() -> None:
    importlib.import_module("spotwise.policies.builtin")


def known_policies() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_policy(name: str, **kwargs) -> Policy:
    _load_all()
    if name not in _REGISTRY:
        from spotwise.errors import InputError, Problem

        raise InputError(Problem("policy", name, ", ".join(sorted(_REGISTRY))))
    return _REGISTRY[name](**kwargs)
