"""``greedy``: take spot whenever it is there, wait when it is not, on-demand only when forced.

Forced means the safety net: once the work left plus one changeover, in whole ticks, no longer
fits before the deadline, the job goes to on-demand and (since idling is then impossible) stays
there; a spot cluster already running with no changeover pending is kept until it is preempted,
because a productive spot tick leaves the slack unchanged. This is the paper's "greedy" baseline.
"""

from __future__ import annotations

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE, Lanes, LanePolicy


def safety_net(v: Lanes, req: np.ndarray, margin_changeovers: float = 1.0) -> np.ndarray:
    """Override ``req`` with on-demand where finishing on time needs it from now on.

    Critical when ``ticks(work_left + margin*d) >= whole ticks left``. A running spot cluster with
    no pending changeover is kept (a productive tick leaves the slack unchanged); everything else
    goes to on-demand.
    """
    need = v.ticks_h(v.work_left_h + margin_changeovers * v.restart_h)
    critical = (need >= v.remaining_whole_ticks_h() - 1e-9) & (v.work_left_h > 1e-9)
    keep_spot = (v.current == SPOT_CODE) & (v.restart_left_h < 1e-9) & v.has_spot
    return np.where(critical, np.where(keep_spot, SPOT_CODE, OD_CODE), req)


@register_policy("greedy")
class Greedy(LanePolicy):
    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        req = np.where(v.has_spot, SPOT_CODE, IDLE)
        req = np.where(v.work_left_h > 1e-9, req, IDLE)
        return safety_net(v, req)
