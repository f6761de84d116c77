"""``spot-fallback``: the walking skeleton's policy for real runs.

Run on spot while it is available; after ``max_spot_preemptions`` preemptions within
``window_h`` hours, or when only on-demand can still meet the deadline, use on-demand for the rest
of the run. Simple, predictable, and what users of spot fleets do by hand.
"""

from __future__ import annotations

from spotwise.policies.base import NONE, ON_DEMAND, SPOT, Decision, Observation, Policy, register_policy


@register_policy("spot-fallback")
class SpotFallback(Policy):
    def __init__(self, max_spot_preemptions: int = 3, window_h: float = 1.0) -> None:
        self.max_spot_preemptions = max_spot_preemptions
        self.window_h = window_h
        self.reset()

    def reset(self) -> None:
        self._preempt_times: list[float] = []
        self._seen_preemptions = 0
        self._on_demand_for_good = False

    def decide(self, obs: Observation) -> Decision:
        if obs.preemptions > self._seen_preemptions:
            self._preempt_times += [obs.elapsed_h] * (obs.preemptions - self._seen_preemptions)
            self._seen_preemptions = obs.preemptions
        recent = [t for t in self._preempt_times if obs.elapsed_h - t <= self.window_h]
        if len(recent) >= self.max_spot_preemptions:
            self._on_demand_for_good = True
        # Safety net: decisions hold for a whole tick, so if the work left plus a restart plus the
        # tick we are about to spend no longer fits before the deadline, on-demand from here on.
        if obs.work_left_h + obs.restart_h + 2 * obs.tick_h >= obs.time_left_h:
            self._on_demand_for_good = True
        if self._on_demand_for_good:
            return Decision(ON_DEMAND, obs.region)
        available = obs.spot_available.get(obs.region or "", True) if obs.spot_available else True
        return Decision(SPOT if available else NONE, obs.region)
