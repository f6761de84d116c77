"""The ``Policy`` interface: observe the run's state each tick, decide where it should run.

A policy sees only what a real system knows online (time so far, work left, deadline, whether
spot is available now and how long it has lasted, what it spent) and answers with a
:class:`Decision`: run on spot, on on-demand, or wait (``none``), optionally naming a region.
The simulator and the orchestrator both call :meth:`Policy.decide` once per tick.

Policies are found by name through :data:`POLICIES` (a :class:`~spotwise.registry.Registry`): each
policy module registers its class with :func:`register_policy`, so adding a policy is one new
module in :mod:`spotwise.policies` and no list elsewhere names it. The registry imports every
module of the package on the first lookup, so policy modules must stay cheap to import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from spotwise.registry import Registry

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

    def observe_history(self, avail: Any, tick_h: float) -> None:
        """Before the first tick of a run: the zone's availability over the ticks before the job
        starts (oldest first, 1 = spot could be had), where the caller has it (a recorded trace, or
        the orchestrator's own probes of the zone). Policies that learn how spot behaves use it; the
        default ignores it."""

    @abstractmethod
    def decide(self, obs: Observation) -> Decision: ...


#: Every policy class by name, filled by the modules of :mod:`spotwise.policies` on first lookup.
POLICIES: Registry[type[Policy]] = Registry("policy", ("spotwise.policies",), field="policy")


def register_policy(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: make the policy available as ``get_policy(name)`` (and set its ``name``)."""

    def deco(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        return POLICIES.register(name)(cls)

    return deco


def known_policies() -> list[str]:
    """Every registered policy name, sorted."""
    return POLICIES.names()


def get_policy(name: str, **kwargs: Any) -> Policy:
    """A new instance of the policy called ``name``; an unknown name is an
    :class:`~spotwise.errors.InputError` on the ``policy`` field listing the known ones."""
    return POLICIES.get(name)(**kwargs)
