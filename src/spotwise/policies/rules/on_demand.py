"""``on-demand``: never touch spot. The cost ceiling every other policy is measured against."""

from __future__ import annotations

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.lanes import IDLE, OD_CODE, Lanes, LanePolicy


@register_policy("on-demand")
class OnDemand(LanePolicy):
    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        return np.where(v.work_left_h > 1e-9, OD_CODE, IDLE)
