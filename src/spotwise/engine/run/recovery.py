"""What a lost node means for the run: counted, its remains ended, the restart clock started,
and the run given up when the cloud took what it cannot go on without; and what a node under an
interruption notice means: its replacement asked for at once, when the budget pays the overlap.

:class:`~spotwise.engine.run.fleet.Fleet` notices the losses — a node its cloud no longer lists
(:meth:`Fleet.sync`), a worker whose Ray never joined (:meth:`Fleet.check_joins`) — and hands each
to :class:`Recovery`, which keeps the run's rules for them:

* the **head** lost is the end of the cluster: :class:`Interrupted` (the run fails, resumable);
* a **worker** lost counts once in ``lost_nodes`` (preempted, gone, or never in Ray alike), a
  preemption also in ``preemptions`` and, on spot, in what the market watch saw; the driver's
  restart clock starts; the orchestrator's top-up replaces it;
* more workers lost than ``max_replacements`` (``max(10, 5 × workers)``): :class:`Interrupted`.

A notice (issue 51): the head's job reports each node whose drain Ray accepted
(:mod:`spotwise.runtime.node.drains`); :meth:`Recovery.notice` takes such workers out of the
fleet's workers (:meth:`Fleet.notices`), so the top-up that follows at once asks for their
replacements while they checkpoint and wait out their window — as Karpenter launches a
replacement before it drains an interrupted node, and SkyPilot's managed jobs start recovery at
the interruption, instead of waiting for the cloud to stop listing the node. Both run, and are
billed, during the overlap: :meth:`Recovery.overlap` turns the replacement into a wait that says
why when the cap cannot pay it (:meth:`Purse.overlap_refused`), and it is asked for once the
noticed node is gone, as before. The noticed node still counts as preempted when it goes — and
when the run itself ends it first (a region move; anything but the run's own end, which
:data:`~spotwise.engine.run.fleet.OWN_ENDS` names): :meth:`Recovery.cut_short`, called by
:meth:`Fleet.end`, counts it as the preemption its cloud was making, since the node would never be
seen gone. A capacity error met by the replacement at the notice does not move the job while the
noticed node still runs (:mod:`spotwise.engine.run.steering`): it waits for the node to go.

A notice that does not end in a preemption (a rebalance recommendation, a cancelled Azure event, a
Slurm job not killed after all) leaves the noticed node up past its deadline. Its Ray node stays
drained — Ray schedules nothing on a draining node again — so the replacement, which has joined,
is the worker, and :meth:`Recovery.check_notices` ends the noticed node :data:`NOTICE_GRACE_S`
(a minute) past its deadline, its bill closed with reason ``notice passed`` (event
``notice_passed``); it is not a preemption.

Like SkyPilot's managed-jobs recovery (``sky/jobs/recovery_strategy.py``), the journal says what
was lost before anything is done about it.
"""

from __future__ import annotations

import time

from spotwise.engine.run.driver import Driver
from spotwise.engine.run.fleet import Fleet
from spotwise.engine.run.joins import Overdue
from spotwise.engine.run.journal import Journal
from spotwise.engine.run.market_watch import MarketWatch
from spotwise.engine.run.purse import Purse
from spotwise.engine.run.steering import Command, Steering, TopUp, Wait
from spotwise.errors import SpotwiseError
from spotwise.policies.base import SPOT
from spotwise.provisioner.base import Node


NOTICE_GRACE_S = 60.0     # a noticed node still up this long past its deadline was not preempted: ended


class Interrupted(SpotwiseError):
    """The cloud took what the run cannot go on without (its head, or more workers than it
    replaces): the run fails, and its report says ``interrupted`` — ``spotwise resume`` continues
    it from its last committed checkpoint, as it does a lost or budget-stopped run."""


class Recovery:
    """The run's rules for lost nodes (module docstring). ``max_replacements``: how many workers
    may be lost before the run gives up."""

    def __init__(self, *, fleet: Fleet, journal: Journal, watch: MarketWatch, driver: Driver, purse: Purse,
                 max_replacements: int, join_timeout_s: float) -> None:
        self.fleet, self.journal, self.watch, self.driver, self.purse = fleet, journal, watch, driver, purse
        self.max_replacements = max_replacements
        self.join_timeout_s = join_timeout_s
        fleet.on_cut_short = self.cut_short

    def notice(self, events: list[dict], now: float) -> None:
        """Workers under an interruption notice, from training's events (:meth:`Fleet.notices`):
        each a ``node_notice`` event, and the fleet's upkeep made due so this tick's top-up asks
        for their replacements."""
        for n in self.fleet.notices(events, now):
            self.journal.event("node_notice", instance_id=n.instance_id, market=n.market, zone=n.zone,
                               goes_in_s=round(self.fleet.noticed[n.instance_id] - now, 1))
            self.fleet.upkeep.last = float("-inf")

    def check_notices(self, now: float) -> None:
        """End the noticed workers still up :data:`NOTICE_GRACE_S` past their deadline (the module
        docstring): ``notice passed`` in the ledger, a ``notice_passed`` event."""
        late = [self.fleet.nodes[i] for i, t in self.fleet.noticed.items()
                if now - t >= NOTICE_GRACE_S and i in self.fleet.nodes]
        if late:
            self.fleet.end(late, reason="notice passed")
        for n in late:
            self.journal.event("notice_passed", instance_id=n.instance_id, market=n.market, zone=n.zone,
                               past_deadline_s=NOTICE_GRACE_S)

    def overlap(self, cmd: Command, steering: Steering, now: float) -> Command:
        """``cmd``, unless it is a replacement that would overlap a noticed worker the cap cannot
        pay for (:meth:`Fleet.overlap`, :meth:`Purse.overlap_refused`): then a :class:`Wait` that says
        why (announced once per wait, as the steering's own)."""
        if not isinstance(cmd, TopUp) or not self.fleet.noticed:
            return cmd
        usd_per_hour, overlap_s = self.fleet.overlap(cmd.market, now)
        why = self.purse.overlap_refused(cmd.count * usd_per_hour, overlap_s, now)
        if why is None:
            return cmd
        announce, steering.waiting = not steering.waiting, True
        return Wait(cmd.count, why, announce)

    def at_notice(self) -> dict:
        """What a ``replaced`` event asked for now carries while workers are under notice: which
        (``at_notice_of``) and when it was asked for (``asked_at``: a launch may take a while);
        ``{}`` without a notice."""
        if not self.fleet.noticed:
            return {}
        return {"at_notice_of": sorted(self.fleet.noticed), "asked_at": round(time.time(), 3)}

    def cut_short(self, n: Node, reason: str) -> None:
        """A worker under notice that the run ended (``reason``) before its cloud took it
        (:meth:`Fleet.end`'s callback): the preemption its cloud was making — counted, a spot site's
        loss in the market watch, a ``preempted`` event with ``ended_by``, and the restart clock
        started. Not checked against ``max_replacements`` here (the run is mid-move; the next loss checks)."""
        self.journal.preemptions += 1
        self.journal.lost_nodes += 1
        now = time.time()
        if n.market == SPOT:
            self.watch.saw_spot_lost(n, now, spot_left=any(w.market == SPOT for w in self.fleet.workers()))
        self.driver.lost(now, n.instance_id)
        self.journal.event("preempted", instance_id=n.instance_id, market=n.market, zone=n.zone, ended_by=reason)

    def lost(self, n: Node) -> None:
        """A node we did not end is gone (:meth:`Fleet.sync`'s callback): count it (preempted or
        lost), end what is left of it, and give up when the head went or too many workers did."""
        if n.role == "head":
            raise Interrupted("the Ray head node was lost; `spotwise resume` continues the run from its last "
                              "checkpoint")
        preempted = self.fleet.was_preempted(n)
        if preempted:
            self.journal.preemptions += 1
            if n.market == SPOT:
                self.watch.saw_spot_lost(n, time.time(), spot_left=any(
                    w.market == SPOT for w in self.fleet.workers() if w.instance_id != n.instance_id))
        self.journal.lost_nodes += 1
        self.driver.lost(time.time(), n.instance_id)
        self.journal.event("preempted" if preempted else "lost", instance_id=n.instance_id, market=n.market,
                           zone=n.zone)
        self.fleet.end_remains(n)
        self.check()

    def not_joined(self, o: Overdue, now: float) -> None:
        """A worker the fleet ended because its Ray was not ALIVE for the join timeout
        (:meth:`Fleet.check_joins`' callback): counted as lost, bounded like the others."""
        n = o.node
        self.journal.lost_nodes += 1
        self.driver.lost(now)
        self.journal.event("not_joined", instance_id=n.instance_id, market=n.market, zone=n.zone,
                           unseen_s=round(o.unseen_s, 1), seen=o.seen, join_timeout_s=self.join_timeout_s)
        self.check()

    def check(self) -> None:
        """Give up once more workers were lost (preempted, gone, or never in Ray) than ``max_replacements``."""
        if self.journal.lost_nodes > self.max_replacements:
            raise Interrupted(f"{self.journal.lost_nodes} worker nodes were lost; giving up after "
                              f"{self.max_replacements} replacements (`spotwise resume` continues the run)")
