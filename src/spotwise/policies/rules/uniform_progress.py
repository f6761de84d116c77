"""``uniform-progress``: the Can't Be Late (NSDI'24) policy, single region.

Rules, as the paper states them, with ``cp(t)`` the work done and ``ep(t) = t * C / R`` the
uniform progress line:

1. *Uniform progress*: when idle and ``cp(t) < ep(t)``, run on on-demand.
2. *Exploitation*: use spot whenever it is available (even when behind the line) and keep it until
   it is preempted.
3. *Hysteresis*: once on on-demand, stay there while spot is unavailable, and when spot comes
   back leave only once ``cp(t) > ep(t + 2d)``; this keeps a job near the line from flapping
   between markets and paying a changeover each time. (This is the reading of the paper's
   reference simulator; it reproduces the paper's Table 3, see ``docs/policies.md``.)
4. *Safety net*: when idle or on on-demand and the work left plus ``2d`` no longer fits before the
   deadline, go (or stay) on on-demand to the end; with ``d`` instead of ``2d``, even a running
   spot cluster is given up unless it is productive.
"""

from __future__ import annotations

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.rules.greedy import safety_net
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE, Lanes, LanePolicy


def uniform_progress(v: Lanes) -> np.ndarray:
    """The paper's rules 1-4 for every lane (stateless: the hysteresis reads ``current``)."""
    rate = v.task_h / v.deadline_h
    cp = v.work_done_h
    behind = cp < v.elapsed_h * rate - 1e-12
    req = np.where(v.has_spot, SPOT_CODE, np.where(behind, OD_CODE, IDLE))
    ahead_2d = cp > (v.elapsed_h + 2 * v.restart_h) * rate + 1e-12
    hold_od = (v.current == OD_CODE) & (~v.has_spot | ~ahead_2d)
    req = np.where(hold_od, OD_CODE, req)
    on_or_idle = v.current != SPOT_CODE
    need2 = v.ticks_h(v.work_left_h + 2 * v.restart_h)
    net2 = on_or_idle & (need2 >= v.remaining_whole_ticks_h() - 1e-9)
    req = np.where(net2, OD_CODE, req)
    req = safety_net(v, req)
    return np.where(v.work_left_h > 1e-9, req, IDLE)


@register_policy("uniform-progress")
class UniformProgress(LanePolicy):
    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        return uniform_progress(v)
