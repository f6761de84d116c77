"""``spotwise``: a slack-reserve policy that buys less on-demand than Uniform Progress.

Why. A job's cost is about ``ps*C + (po - ps) * (work done on on-demand)`` plus changeovers, so
the game is to run as much of the work as possible on spot without missing the deadline. Write
``S = time left - work left`` for the job's *slack* (idle time it can still afford) and ``W`` for
the work left. Slack only ever shrinks: an idle tick spends a tick of it, a changeover spends
``d``; a productive tick (spot or on-demand) leaves it as it is. Uniform Progress (UP) buys
on-demand in an outage as soon as the job falls behind the line ``t*C/R``; in slack terms that is
``S < W*(R-C)/C``: it keeps a reserve of slack proportional to the work left, sized as if spot
could be missing ``(R-C)/R`` of the remaining time. Measured over the shipped traces
(``docs/policies.md``) three things in UP waste money:

* with a generous deadline the reserve is larger than the outages still to come: on-demand is
  bought for outages that spot seen later would have made up. ``spotwise`` caps the reserve at
  ``cap * W`` (``cap = 0.2``): ``reserve = W * min((R-C)/C, cap)``. With a tight deadline
  (``C/R = 0.9``) this is UP's own reserve; at ``C/R = 0.7`` it is about half of it;
* once on on-demand, UP goes back to spot only when ``2d`` *ahead* of the line, so it keeps
  paying on-demand prices while spot is available. ``spotwise`` goes back to spot as soon as the
  slack is within ``back * d`` (``back = 4``) of the reserve;
* but it does not jump at a spot streak that has only just begun: a switch from on-demand to
  spot that is preempted soon after costs two changeovers (``2d`` of slack and of billing), and
  young streaks are the ones that die young. It waits until spot has been available for
  ``settle * d`` (``settle = 2``) before leaving on-demand. An idle job takes spot at once (it
  risks only the changeover's spot price, and idling spends the same slack).

Rules per tick (``d`` the changeover delay):

1. spot available: run on spot; on on-demand, stay while ``S <= reserve - back*d`` or while the
   spot streak is younger than ``settle*d``;
2. spot unavailable: idle while ``S >= reserve``; otherwise on-demand, held through the outage
   (releasing it and re-buying it would pay ``d`` each time);
3. safety nets, as in UP: when idle or on on-demand and ``work left + 2d`` (whole ticks) no longer
   fits, on-demand to the end; with ``d``, even a spot cluster is given up unless productive. They
   guarantee that no deadline is missed that on-demand alone could meet.

Only online knowledge: time, work done, the changeover delay, whether spot is available now and
how long it has been (the streak's age). How far this can go: the exact clairvoyant optimum is
only about 7 % below UP on these traces, and even choosing this rule's knobs per trace with
hindsight reaches about 4 % (``docs/policies.md`` § "How far below Uniform Progress an online
policy can go"). Tried and rejected (measured worse): sizing the reserve from the availability
seen so far in the run (+5 % to +9 % vs UP: availability is bursty, a short history mis-sizes it);
waiting a fixed time into an outage before buying on-demand (+0.3 % to +1 %); a lagged line; a
fixed floor under the reserve; a Markov-chain MDP (fitted availability model, solved by backward
induction), which tied this rule at best.
"""

from __future__ import annotations

import numpy as np

from spotwise.policies.base import register_policy
from spotwise.policies.greedy import safety_net
from spotwise.policies.lanes import IDLE, OD_CODE, SPOT_CODE, Lanes, LanePolicy


def slack_reserve(v: Lanes, cap: float, back: float, settle: float) -> np.ndarray:
    """The rule above for every lane (stateless: the hold on on-demand reads ``current``)."""
    work_left = v.work_left_h
    slack = v.time_left_h - work_left
    reserve = work_left * min((v.deadline_h - v.task_h) / v.task_h, cap)
    behind = slack < reserve - 1e-12
    req = np.where(v.has_spot, SPOT_CODE, np.where(behind, OD_CODE, IDLE))
    far_behind = slack <= reserve - back * v.restart_h + 1e-12
    young = v.up_h < settle * v.restart_h - 1e-9     # up_h: filled in by LanePolicy.step
    hold_od = (v.current == OD_CODE) & (~v.has_spot | far_behind | young)
    req = np.where(hold_od, OD_CODE, req)
    need2 = v.ticks_h(work_left + 2 * v.restart_h)
    net2 = (v.current != SPOT_CODE) & (need2 >= v.remaining_whole_ticks_h() - 1e-9)
    req = np.where(net2, OD_CODE, req)
    req = safety_net(v, req)
    return np.where(work_left > 1e-9, req, IDLE)


@register_policy("spotwise")
class Spotwise(LanePolicy):
    """``cap``: the reserve of slack at most ``cap`` x the work left; ``back``: how far (in ``d``)
    behind the reserve the job may be and still leave on-demand for spot; ``settle``: how long (in
    ``d``) a spot streak must have lasted before the job leaves on-demand for it."""

    def __init__(self, *, cap: float = 0.2, back: float = 4.0, settle: float = 2.0) -> None:
        for name, value in (("cap", cap), ("back", back), ("settle", settle)):
            if not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.cap = cap
        self.back = back
        self.settle = settle
        super().__init__()

    def rule(self, v: Lanes, st: dict) -> np.ndarray:
        return slack_reserve(v, self.cap, self.back, self.settle)
