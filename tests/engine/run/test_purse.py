"""The run's money (:mod:`spotwise.engine.run.purse`): the budget stop, the hard stop, billing before
the check, the budget during a migration, and the lease's wiring — on a recorded ledger, with no
cloud and no training job."""

from __future__ import annotations

import pytest

from spotwise.engine.run.purse import (BILLING_INCREMENT_S, HARD_STOP_MARGIN_S, Money, Purse, StopLatch,
                                   check_budget_floor)
from spotwise.errors import SpotwiseError

T = 1_700_000_000.0


class Books:
    """A ledger whose spend and burn rate the test sets; records what was asked of it, in order."""

    def __init__(self, spend: float = 0.0, rate: float = 3.6) -> None:
        self._spend, self._rate = spend, rate
        self.calls: list[tuple[str, float | None]] = []

    def bill(self, now: float | None = None) -> None:
        self.calls.append(("bill", now))

    def spend(self, now: float | None = None) -> float:
        self.calls.append(("spend", now))
        return self._spend

    def rate_usd_per_hour(self) -> float:
        self.calls.append(("rate", None))
        return self._rate


class Lease:
    """A runner lease that records what the purse did with it."""

    def __init__(self, log: list) -> None:
        self.log = log

    def claim(self):
        self.log.append("claim")

    def start(self):
        self.log.append("start")
        return self

    def attach(self, *, push, money):
        self.log.append(("attach", push, money()))

    def stop(self):
        self.log.append("stop")


class Control:
    """The job's control endpoint: down (every request fails) until ``up``."""

    def __init__(self, up: bool = True) -> None:
        self.up, self.taken = up, []

    def request_stop(self, reason: str) -> None:
        if not self.up:
            raise ConnectionRefusedError("nothing listens there")
        self.taken.append(reason)


def purse(books: Books, budget: float | None, leases: list | None = None) -> tuple[Purse, list]:
    events: list = []
    p = Purse(books, budget, lease=lambda: Lease(leases if leases is not None else []),  # type: ignore[arg-type]
              event=lambda kind, **d: events.append((kind, d)))
    return p, events


def at_margin(rate: float, seconds: float) -> float:
    """A spend that leaves ``seconds`` of burn at ``rate`` $/h under a budget of 1 dollar."""
    return 1.0 - rate * seconds / 3600


# -- the stop latch ----------------------------------------------------------------------------------
def test_the_first_stop_reason_wins_and_only_a_force_overrides_it():
    s = StopLatch()
    s.request("cancel")
    s.request("budget")
    assert s.reason == "cancel"
    s.force("budget")
    assert s.reason == "budget"
    s.clear()
    assert s.reason is None


# -- the cap ------------------------------------------------------------------------------------------
def test_no_budget_no_stop_whatever_is_spent():
    p, events = purse(Books(spend=1e9), None)
    assert p.tick(T, StopLatch(), Control().request_stop) is Money.OK and events == []


def test_a_billing_minute_ahead_of_the_cap_training_is_asked_to_stop_once():
    rate = 3.6                                                   # $0.001 per second
    p, events = purse(Books(spend=at_margin(rate, BILLING_INCREMENT_S - 1), rate=rate), 1.0)
    stop, control = StopLatch(), Control()
    assert p.check(T, stop, control.request_stop) is Money.STOPPING
    assert stop.reason == "budget" and control.taken == ["budget"] and not p.budget_stop_pending
    assert [k for k, _ in events] == ["budget_stop_requested"] and events[0][1]["budget_usd"] == 1.0
    assert p.check(T + 1, stop, control.request_stop) is Money.STOPPING
    assert control.taken == ["budget"] and len(events) == 1          # asked once it was taken
    p2, _ = purse(Books(spend=at_margin(rate, BILLING_INCREMENT_S + 1), rate=rate), 1.0)
    assert p2.check(T, StopLatch(), control.request_stop) is Money.OK   # more than a minute left


def test_a_budget_stop_the_head_could_not_take_is_asked_again():
    """The stop request may come before the job's control endpoint is up: it is asked again every
    tick until it is taken (else the run would go to the hard stop without a stop checkpoint).
    (Moved from test_orchestrator.py, where it ran on a real local head.)"""
    p, _ = purse(Books(spend=0.0, rate=0.1), 0.001)               # the next billing minute passes the cap
    stop, control = StopLatch(), Control(up=False)
    assert p.check(T, stop, control.request_stop) is not Money.HARD_STOP
    assert stop.reason == "budget" and p.budget_stop_pending is True
    control.up = True                                             # the endpoint came up
    p.check(T + 1, stop, control.request_stop)
    assert control.taken == ["budget"] and p.budget_stop_pending is False
    p.check(T + 2, stop, control.request_stop)
    assert control.taken == ["budget"], "asked once it was taken"


@pytest.mark.parametrize("under_way", [None, "budget", "cancel", "migrate"])
def test_the_hard_stop_fires_at_the_margin_whatever_stop_is_under_way(under_way):
    rate = 3.6
    p, events = purse(Books(spend=at_margin(rate, HARD_STOP_MARGIN_S - 0.5), rate=rate), 1.0)
    stop, control = StopLatch(under_way), Control()
    assert p.check(T, stop, control.request_stop) is Money.HARD_STOP
    assert stop.reason == "budget" and p.hard_stopped
    assert events[-1][0] == "budget_hard_stop" and events[-1][1]["budget_usd"] == 1.0


def test_during_a_migration_the_budget_asks_no_stop_of_its_own_but_still_hard_stops():
    """A migration's checkpoint stop is under way (reason ``migrate``): the budget does not ask for
    another stop a minute ahead (the move's checkpoint serves), but the hard stop still holds the
    cap, and the run's stop reason becomes ``budget`` so the migration gives up."""
    rate = 3.6
    books = Books(spend=at_margin(rate, BILLING_INCREMENT_S - 1), rate=rate)
    p, events = purse(books, 1.0)
    stop, control = StopLatch("migrate"), Control()
    assert p.check(T, stop, control.request_stop) is Money.OK
    assert stop.reason == "migrate" and control.taken == [] and events == [] and not p.budget_stop_pending
    books._spend = at_margin(rate, HARD_STOP_MARGIN_S - 1)
    assert p.check(T + 1, stop, control.request_stop) is Money.HARD_STOP
    assert stop.reason == "budget" and control.taken == [] and [k for k, _ in events] == ["budget_hard_stop"]


def test_a_tick_bills_before_it_checks_and_bills_once_a_second():
    books = Books(spend=0.0, rate=3.6)
    p, _ = purse(books, 1.0)
    stop, control = StopLatch(), Control()
    p.tick(T, stop, control.request_stop)
    assert books.calls == [("bill", T), ("spend", T), ("rate", None)]
    books.calls.clear()
    p.tick(T + 0.5, stop, control.request_stop)                  # within the second: checked, not billed
    assert books.calls == [("spend", T + 0.5), ("rate", None)]
    books.calls.clear()
    p.tick(T + 1.0, stop, control.request_stop)
    assert books.calls[0] == ("bill", T + 1.0)


def test_a_budget_below_one_billing_minute_of_the_cheapest_cluster_is_refused():
    check_budget_floor(None, 100.0)
    check_budget_floor(0.05, 3.0)                                 # one minute at $3/h is $0.05
    with pytest.raises(SpotwiseError, match="nothing was launched"):
        check_budget_floor(0.0499, 3.0)


# -- the lease ----------------------------------------------------------------------------------------
def test_the_lease_is_held_then_attached_to_the_nodes_and_the_money_then_released():
    log: list = []
    books = Books(spend=0.25, rate=2.0)
    p, _ = purse(books, 1.0, leases=log)
    p.attach(print)                                               # nothing held yet: nothing to attach
    p.release()
    assert log == [] and p.lease is None
    p.hold()
    assert log == ["claim", "start"]                              # claimed, then renewing
    push = Control().request_stop
    p.attach(push)
    assert log[2] == ("attach", push, (0.25, 2.0))                # the money as the ledger says it now
    books._spend = 0.5
    p.attach(print)                                               # a migration's new cluster
    assert log[3] == ("attach", print, (0.5, 2.0))
    p.release()
    assert log[-1] == "stop"
