"""The run's money: billing, the budget cap, and the lease that bounds what a dead runner costs.

Rules, in the order a tick applies them (:meth:`Purse.tick`), before anything else can launch:

1. **Bill** every node up to now, once a second (:class:`~spotwise.engine.state.ledger.Ledger`: each
   second at the price the node launched at). Billing comes first: what the cap is checked
   against is then also in the ledger's rows, which is what ``gc`` and the cost report read.
2. **Stop at a checkpoint a billing minute ahead**: when spend so far plus the next minute at the
   current burn rate would pass the cap, training is asked to stop (kind ``stop``) — unless another
   stop is already under way (a cancel or a migration's checkpoint stop: its checkpoint serves).
   The request is repeated every tick until the head takes it: the control endpoint may not be up
   yet, and without the stop checkpoint the run would only end at the hard stop.
3. **End everything at once at the margin**: when less than :data:`HARD_STOP_MARGIN_S` of burn is
   left, whatever stop is under way (a migration included) — before the nodes' own dead man's
   switch would. The run's stop reason becomes ``budget``; the caller ends the nodes.

The stop reason is one latch for the whole run (:class:`StopLatch`): the first reason wins, and
only the hard stop overrides it.

The lease (:class:`~spotwise.engine.state.lease.RunnerLease`): claimed and renewing before the first
node launches (:meth:`Purse.hold`), told how to reach the nodes and the money once training is
submitted (:meth:`Purse.attach`, which renews at once — and again after a migration, for the new
cluster), and stopped before the job's final status is written (:meth:`Purse.release`), so a late
renewal cannot race it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from spotwise.engine.run.cadence import Every
from spotwise.engine.state.ledger import Ledger
from spotwise.errors import SpotwiseError

log = logging.getLogger("spotwise.orchestrator")

BILLING_INCREMENT_S = 60.0     # the budget rule looks one billing minute ahead
HARD_STOP_MARGIN_S = 13.0      # end nodes at once when less than this much budget time is left: before the
                               # nodes' own dead man's switch would (lease.SELF_END_S + ROUNDING_S = 12 s)
BILL_EVERY_S = 1.0             # how often a tick bills the open nodes


class Money(enum.Enum):
    """What the budget says this tick."""

    OK = "ok"
    STOPPING = "stopping"        # the budget stop is decided (training is asked to stop at a checkpoint)
    HARD_STOP = "hard_stop"      # end every node now


@dataclass
class StopLatch:
    """Why the run is stopping: ``budget``, ``cancel``, ``migrate`` (a move's checkpoint stop), or
    None. The first reason wins; only :meth:`force` (the hard budget stop) overrides one, and only
    a migration that went ahead :meth:`clear`\\ s it."""

    reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason

    def force(self, reason: str) -> None:
        self.reason = reason

    def clear(self) -> None:
        self.reason = None


class Lease(Protocol):
    """The runner's lease as the purse uses it (:class:`~spotwise.engine.state.lease.RunnerLease`)."""

    def claim(self) -> None: ...

    def start(self) -> Any: ...

    def attach(self, *, push: Callable[[float], object], money: Callable[[], tuple[float, float]]) -> None: ...

    def stop(self) -> None: ...


def runner_lease(job_id: str, budget_usd: float | None) -> Lease:
    """The runner's lease of ``job_id`` (:class:`~spotwise.engine.state.lease.RunnerLease`), the
    nodes' term from ``$SPOTWISE_NODE_LEASE_S``."""
    from spotwise.engine.state.lease import RunnerLease, node_lease_s

    return RunnerLease(job_id, budget_usd=budget_usd, node_term_s=node_lease_s())


def check_budget_floor(budget_usd: float | None, cluster_usd_per_hour: float) -> None:
    """Refuse, before anything launches, a budget that cannot pay for one billing minute of the
    cheapest cluster."""
    minute = cluster_usd_per_hour * BILLING_INCREMENT_S / 3600
    if budget_usd is not None and budget_usd < minute:
        raise SpotwiseError(f"budget ${budget_usd:.4f} cannot pay for even one billing minute of the "
                            f"cheapest cluster (${minute:.4f}); nothing was launched")


class Purse:
    """The ledger, the cap and the lease of one run.

    ``lease`` makes the runner's lease (called once, by :meth:`hold`); ``event`` records what the
    budget decided (``budget_stop_requested``, ``budget_hard_stop``). Nothing here ends a node:
    :meth:`check` says :attr:`Money.HARD_STOP` and the caller ends them."""

    def __init__(self, ledger: Ledger, budget_usd: float | None, *, lease: Callable[[], Lease],
                 event: Callable[..., None], bill_every_s: float = BILL_EVERY_S) -> None:
        self.ledger = ledger
        self.budget_usd = budget_usd
        self.lease: Lease | None = None
        self.budget_stop_pending = False     # the budget stop is decided but the control endpoint has not taken it yet
        self.hard_stopped = False
        self.billing = Every(bill_every_s)
        self._new_lease = lease
        self._event = event

    # -- the lease --------------------------------------------------------------------------------
    def hold(self) -> None:
        """Claim the job's lease and renew it from now on (before the first node launches)."""
        self.lease = self._new_lease()
        self.lease.claim()
        self.lease.start()

    def attach(self, push: Callable[[float], object]) -> None:
        """The nodes are reachable through ``push`` (the job's control endpoint): each renewal now
        also pushes the node lease, bounded by the money left; the first push happens at once."""
        if self.lease is not None:
            self.lease.attach(push=push, money=lambda: (self.ledger.spend(), self.ledger.rate_usd_per_hour()))

    def release(self) -> None:
        """Stop renewing (before the job's final status is written)."""
        if self.lease is not None:
            self.lease.stop()

    # -- the cap ----------------------------------------------------------------------------------
    def tick(self, now: float, stop: StopLatch, request_stop: Callable[[str], object]) -> Money:
        """One tick of the monitor: bill (every ``bill_every_s``), then :meth:`check`."""
        if self.billing.due(now):
            self.ledger.bill(now)
        return self.check(now, stop, request_stop)

    def overlap_refused(self, usd_per_hour: float, overlap_s: float, now: float) -> str | None:
        """Why the cap cannot pay a replacement at ``usd_per_hour`` asked for during an
        interruption notice, ``overlap_s`` before the noticed node goes (None: it can). Both run
        for the overlap, and the budget rule's billing minute must still be left after it: spend
        so far + the current burn over (overlap + a billing minute) + the replacement's over the
        same must stay within the cap. Refused, the replacement waits for the node to go, as a
        replacement did before issue 51."""
        if self.budget_usd is None:
            return None
        ahead_h = (max(0.0, overlap_s) + BILLING_INCREMENT_S) / 3600
        spend = self.ledger.spend(now)
        need = spend + (self.ledger.rate_usd_per_hour() + usd_per_hour) * ahead_h
        if need <= self.budget_usd:
            return None
        return (f"budget: a replacement now overlaps the noticed node for {overlap_s:.0f} s; with "
                f"${spend:,.4f} spent, ${need:,.4f} by then would pass the cap of ${self.budget_usd:,.2f}: "
                "it is asked for once the node is gone")

    def check(self, now: float, stop: StopLatch, request_stop: Callable[[str], object]) -> Money:
        """Apply the cap at ``now`` (rules 2 and 3 above); ``request_stop(reason)`` asks training
        to stop at a checkpoint and may raise (the head is not up): asked again next time."""
        if self.budget_usd is None:
            return Money.OK
        spend = self.ledger.spend(now)
        rate = self.ledger.rate_usd_per_hour()
        if stop.reason is None and spend + rate * BILLING_INCREMENT_S / 3600 > self.budget_usd:
            stop.request("budget")
            self.budget_stop_pending = True
            self._event("budget_stop_requested", spend_usd=round(spend, 6), budget_usd=self.budget_usd)
        if stop.reason == "budget" and self.budget_stop_pending:
            try:
                request_stop("budget")
                self.budget_stop_pending = False
            except Exception as e:  # noqa: BLE001 - the hard stop below still holds the cap
                log.warning("stop request failed (asked again next tick): %s", e)
        if spend + rate * HARD_STOP_MARGIN_S / 3600 >= self.budget_usd:
            stop.force("budget")
            self.hard_stopped = True
            self._event("budget_hard_stop", spend_usd=round(spend, 6), budget_usd=self.budget_usd)
            return Money.HARD_STOP
        return Money.STOPPING if stop.reason == "budget" else Money.OK
