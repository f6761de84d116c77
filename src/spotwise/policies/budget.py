"""Budget caps: the rules the orchestrator calls before spending and before launching.

Three rules, all pure functions of numbers the orchestrator has:

* :func:`may_commit` — *before* committing to the next billing increment (a tick, a minute, an
  hour: whatever the cloud bills), check ``spent + increment <= cap``. If not, the run must pause:
  the orchestrator checkpoints, releases the nodes and records status ``budget_exhausted``. Checking
  before, not after, is what makes "spend never exceeds the cap" hold.
* :func:`plan_check` — before launch: can the cheapest way to finish (all work on spot at the
  cheapest spot price, plus one changeover) fit the budget at all, and can the deadline be met on
  on-demand within the budget? Says which, with the numbers, so the user can fix one in one pass.
* :func:`resolve` — a budget and a deadline in conflict (finishing on time needs on-demand the
  budget cannot pay for) are settled by the task's ``priority``: ``deadline`` keeps the deadline and
  gives up the cap, ``budget`` keeps the cap and gives up the deadline. The outcome says which.

:class:`BudgetCapped` wraps any policy with these rules so that simulations obey them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from spotwise.errors import InputError, Problem
from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Decision, Observation, Policy

BUDGET_EXHAUSTED = "budget_exhausted"
Priority = Literal["deadline", "budget"]


def may_commit(spent_usd: float, increment_usd: float, cap_usd: float | None) -> bool:
    """True when paying ``increment_usd`` more keeps total spend within ``cap_usd`` (None: no cap)."""
    if cap_usd is None:
        return True
    return spent_usd + increment_usd <= cap_usd + 1e-9


@dataclass(frozen=True, slots=True)
class PlanCheck:
    fits: bool                      # the cheapest way to finish fits the budget
    cheapest_usd: float             # all work on spot + one changeover, at the cheapest spot price
    on_demand_usd: float            # all work on on-demand + one changeover
    deadline_on_demand_fits: bool   # on-demand alone can meet the deadline within the budget
    message: str


def plan_check(*, task_h: float, restart_h: float, budget_usd: float | None, spot_usd_per_h: float,
               on_demand_usd_per_h: float, deadline_h: float | None = None) -> PlanCheck:
    """Before launch: say whether the job can finish within the budget at all, and how it stands."""
    problems = []
    if task_h <= 0:
        problems.append(Problem("task_h", task_h, "hours > 0"))
    if spot_usd_per_h < 0 or on_demand_usd_per_h <= 0:
        problems.append(Problem("prices", (spot_usd_per_h, on_demand_usd_per_h), "spot >= 0 and on-demand > 0 $/h"))
    if budget_usd is not None and budget_usd <= 0:
        problems.append(Problem("budget_usd", budget_usd, "dollars > 0 (or no budget)"))
    if problems:
        raise InputError(problems, source="budget")
    hours = task_h + restart_h
    cheapest = hours * min(spot_usd_per_h, on_demand_usd_per_h)
    od = hours * on_demand_usd_per_h
    fits = budget_usd is None or cheapest <= budget_usd + 1e-9
    od_fits = budget_usd is None or od <= budget_usd + 1e-9
    if deadline_h is not None and deadline_h < hours:
        od_fits = False
    if not fits:
        msg = (f"budget ${budget_usd:.2f} cannot pay for the cheapest way to finish: {hours:.2f} h on spot at "
               f"${spot_usd_per_h:.4f}/h = ${cheapest:.2f}")
    elif not od_fits:
        msg = (f"budget ${budget_usd:.2f} fits all-spot (${cheapest:.2f}) but not all-on-demand (${od:.2f}); "
               "the deadline is only safe while spot is available")
    else:
        msg = f"fits: all-spot ${cheapest:.2f}, all-on-demand ${od:.2f}"
    return PlanCheck(fits, cheapest, od, od_fits, msg)


@dataclass(frozen=True, slots=True)
class Resolution:
    decision: Decision
    gave_up: Literal["none", "deadline", "budget"]
    status: str | None = None        # BUDGET_EXHAUSTED when the run must pause


def resolve(obs: Observation, wanted: Decision, *, priority: Priority) -> Resolution:
    """Apply the cap to what a policy ``wanted`` for the next tick (billing increment = one tick).

    * Idle costs nothing and is always allowed.
    * If the increment fits, the decision stands.
    * Otherwise, with ``priority == "budget"`` the run pauses (``budget_exhausted``); the deadline
      is what is given up. With ``priority == "deadline"`` the run goes on, giving up the cap, but
      only where the deadline is still reachable on on-demand (else there is nothing to buy with the
      overspend and it pauses too).
    """
    if priority not in ("deadline", "budget"):
        raise InputError(Problem("priority", priority, "deadline | budget"))
    if wanted.market == NONE:
        return Resolution(wanted, "none")
    region = wanted.region if wanted.region is not None else obs.region
    prices = obs.spot_price if wanted.market == SPOT else obs.on_demand_price
    price = prices.get(region or "", None)
    if price is None:
        price = next(iter(prices.values()), 0.0) if prices else 0.0
    increment = price * obs.tick_h
    if may_commit(obs.spent_usd, increment, obs.budget_usd):
        return Resolution(wanted, "none")
    pause = Resolution(Decision(NONE, region), "deadline", BUDGET_EXHAUSTED)
    if priority == "budget":
        return pause
    reachable = obs.work_left_h + (0.0 if obs.current == wanted.market else obs.restart_h) <= obs.time_left_h + 1e-9
    if not reachable:
        return pause
    return Resolution(wanted, "budget")


class BudgetCapped(Policy):
    """Any policy, with :func:`resolve` applied to each of its decisions."""

    def __init__(self, inner: Policy, *, priority: Priority = "budget") -> None:
        self.inner = inner
        self.priority = priority
        self.last: Resolution | None = None
        self.name = f"{inner.name}+budget"

    def reset(self) -> None:
        self.inner.reset()
        self.last = None

    def decide(self, obs: Observation) -> Decision:
        self.last = resolve(obs, self.inner.decide(obs), priority=self.priority)
        return self.last.decision


__all__ = ["BUDGET_EXHAUSTED", "BudgetCapped", "PlanCheck", "Resolution", "may_commit", "plan_check", "resolve",
           "ON_DEMAND"]
