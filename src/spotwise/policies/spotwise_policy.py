"""``spotwise``: a slack-reserve policy that buys less on-demand than Uniform Progress.

Why. A job's cost is about ``ps*C + (po - ps) * (work done on on-demand)`` plus changeovers, so
the game is to run as much of the work as possible on spot without missing the deadline. Write
``S = time left - work left`` for the job's *slack* (idle time it can still afford) and ``W`` for
the work left. Uniform Progress (UP) buys on-demand in an outage as soon as the job falls behind
the line ``t*C/R``; in slack terms that is ``S < W*(R-C)/C``: it keeps a reserve of slack
proportional to the work left, sized as if spot were available exactly ``C/R`` of the time.
Measured over the shipped traces (``docs/policies.md``) two things in UP waste money:

* the reserve is larger than it needs to be: on-demand bought for outages that the spot seen
  later would have made up. ``spotwise`` keeps ``reserve = scale * W*(R-C)/C`` with
  ``scale = 0.7``. A larger reserve (scale 1.2) costs 4 % more than UP; a smaller one trades
  waiting for on-demand later, and 0.6 - 0.8 is a flat optimum;
* once on on-demand, UP goes back to spot only when ``2d`` *ahead* of the line, so it keeps
  paying on-demand prices while spot is available. ``spotwise`` goes back to spot as soon as the
  slack is within ``back * d`` (``back = 2``) of the reserve: a returning spot streak usually
  lasts much longer than the two changeovers (``2d``) that a switch can cost.

Rules per tick (``d`` the changeover delay):

1. spot available: run on spot; on on-demand, stay only while ``S <= reserve - back*d``;
2. spot unavailable: idle while ``S >= reserve``; otherwise on-demand, held through the outage
   (releasing it and re-buying it would pay ``d`` each time);
3. safety nets, as in UP: when idle or on on-demand and ``work left + 2d`` (whole ticks) no longer
   fits, on-demand to the end; with ``d``, even a spot cluster is given up unless productive. They
   guarantee that no deadline is missed that on-demand alone could meet.

Only online knowledge: time, work done, the changeover delay and whether spot is available now.
What was tried and rejected (worse than this rule, measured): estimating the availability from
the trace seen so far to size the reserve (+5 % to +9 % vs UP: availability is bursty, so a short
history mis-sizes the reserve and the job then holds on-demand it did not need); waiting a fixed
time into an outage before buying on-demand (ski-rental; +0.3 % to +1 %); a lagged line (-0.4 %).
"""

from __future__ import annotations

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.greedy import safety_net
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE, Lanes, LanePolicy


def slack_reserve(v: Lanes, scale: float, back: float) -> np.ndarray:
    """The rule above for every lane (stateless: the hold on on-demand reads ``current``)."""
    work_left = v.work_left_h
    slack = v.time_left_h - work_left
    reserve = scale * work_left * (v.deadline_h - v.task_h) / v.task_h
    behind = slack < reserve - 1e-12
    req = np.where(v.has_spot, SPOT_CODE, np.where(behind, OD_CODE, IDLE))
    far_behind = slack <= reserve - back * v.restart_h + 1e-12
    hold_od = (v.current == OD_CODE) & (~v.has_spot | far_behind)
    req = np.where(hold_od, OD_CODE, req)
    need2 = v.ticks_h(work_left + 2 * v.restart_h)
    net2 = (v.current != SPOT_CODE) & (need2 >= v.remaining_whole_ticks_h() - 1e-9)
    req = np.where(net2, OD_CODE, req)
    req = safety_net(v, req)
    return np.where(work_left > 1e-9, req, IDLE)


@register_policy("spotwise")
class Spotwise(LanePolicy):
    """``scale``: reserve as a share of UP's; ``back``: how far (in ``d``) behind the reserve the
    job may be and still leave on-demand for a returning spot streak."""

    def __init__(self, *, scale: float = 0.7, back: float = 2.0) -> None:
        if not 0.0 <= scale:
            raise ValueError(f"scale must be >= 0, got {scale}")
        if not back >= 0.0:
            raise ValueError(f"back must be >= 0, got {back}")
        self.scale = scale
        self.back = back
        super().__init__()

    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        return slack_reserve(v, self.scale, self.back)
