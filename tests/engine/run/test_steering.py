"""Where the run should be (:class:`spotwise.engine.run.steering.Steering`), decided on a recorded
:class:`View`: no node is launched and nothing moves; the policy is a stub that answers what the
test says and counts the questions."""

from __future__ import annotations

import pytest

from spotwise.engine.run.steering import (MAX_MIGRATIONS, MarketMove, Migrate, NoOp, Steering, TopUp, View, Wait,
                                      cluster_prices)
from spotwise.policies.base import Decision, Observation
from spotwise.pricing.offer import Market, Offer

HERE, CHEAP, DEAR = "aws/us-east-1", "aws/us-west-2", "gcp/us-central1"


class Stub:
    """A policy that answers ``decision`` and counts how often it was asked."""

    def __init__(self, decision: Decision = Decision("spot")) -> None:
        self.decision, self.asked = decision, 0

    def decide(self, obs: Observation) -> Decision:
        self.asked += 1
        return self.decision


def steering(decision: Decision = Decision("spot")) -> Steering:
    return Steering(Stub(decision), "stub", transfer_read_usd=lambda site: 0.0)  # type: ignore[arg-type]


def obs(**over) -> Observation:
    data = dict(elapsed_h=1.0, deadline_h=100.0, task_h=10.0, work_done_h=1.0, restart_h=0.0, tick_h=0.001,
                spot_price={HERE: 3.0, CHEAP: 1.0, DEAR: 2.0}, on_demand_price={HERE: 9.0, CHEAP: 8.0, DEAR: 7.0})
    data.update(over)
    return Observation(**data)


def view(**over) -> View:
    """Two workers missing on a cluster up at HERE, three sites, the policy choosing the market."""
    data = dict(obs=obs(), here=HERE, sites=(HERE, CHEAP, DEAR), missing=2, current="none", worker_markets=(),
                fixed_market=None, blocked=frozenset(), spot_refused=False, stopping=False, draining=False,
                migrations=0, cluster_up=True)
    data.update(over)
    return View(**data)


def out(*pairs: tuple[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(pairs)


# -- whole-job moves (moved from test_orchestrator_moves.py) -----------------------------------------
def test_no_move_while_this_site_has_capacity_or_nothing_is_missing():
    assert not isinstance(steering().replace(view()), Migrate)                   # no capacity error here
    blocked = out((HERE, "spot"), (HERE, "on-demand"))
    assert isinstance(steering().replace(view(blocked=blocked, missing=0)), NoOp)  # nothing missing


def test_capacity_move_goes_to_the_cheapest_site_not_out_of_capacity():
    s = steering()
    assert not isinstance(s.replace(view(blocked=out((HERE, "spot")))), Migrate)   # on-demand may still come here
    cmd = s.replace(view(blocked=out((HERE, "spot"), (HERE, "on-demand"), (CHEAP, "spot"))))  # the cheapest is out too
    assert isinstance(cmd, Migrate)
    assert (cmd.target, cmd.market) == (DEAR, "spot") and "no spot capacity" in cmd.reason and "$2.0000/h" in cmd.reason
    assert s.policy.asked == 1                          # a capacity move is decided before the policy is asked


def test_policy_move_only_when_it_pays():
    def move(decision: Decision, **over) -> NoOp | Migrate | MarketMove:
        _, cmd = steering(decision).consult(view(missing=0, **over))
        return cmd

    assert isinstance(move(Decision("spot", HERE)), NoOp)                        # not another site
    assert isinstance(move(Decision("spot", "azure/x")), NoOp)                   # not a site of the plan
    assert isinstance(move(Decision("none", CHEAP)), NoOp)
    assert isinstance(move(Decision("on-demand", DEAR), obs=obs(task_h=1.01)), NoOp)   # saving < move
    cmd = move(Decision("on-demand", DEAR))
    assert isinstance(cmd, Migrate) and (cmd.target, cmd.market) == (DEAR, "on-demand") and "saves" in cmd.reason


def test_policy_move_respects_a_market_fixed_by_the_task():
    _, cmd = steering(Decision("on-demand", DEAR)).consult(view(missing=0, fixed_market="spot"))
    assert not isinstance(cmd, Migrate)


def test_policy_move_out_of_a_site_without_capacity_needs_no_saving():
    s = steering(Decision("spot", DEAR, reason="spot gone here"))
    assert s.replace(view(obs=obs(task_h=1.0), blocked=out((HERE, "spot")))) == Migrate(DEAR, "spot", "spot gone here")
    _, cmd = s.consult(view(obs=obs(task_h=1.0), blocked=out((HERE, "spot"))))
    assert cmd == Migrate(DEAR, "spot", "spot gone here")


def test_no_move_once_the_run_is_stopping_or_out_of_moves():
    blocked = out((HERE, "spot"), (HERE, "on-demand"))
    assert not isinstance(steering().replace(view(blocked=blocked, stopping=True)), Migrate)
    assert not isinstance(steering().replace(view(blocked=blocked, migrations=MAX_MIGRATIONS)), Migrate)
    assert not isinstance(steering().replace(view(blocked=blocked, draining=True)), Migrate)
    assert not isinstance(steering().replace(view(blocked=blocked, cluster_up=False)), Migrate)
    assert not isinstance(steering().replace(view(blocked=blocked, sites=(HERE,))), Migrate)
    assert isinstance(steering().replace(view(blocked=blocked)), Migrate)


def test_a_move_pays_for_the_checkpoint_read_across_too():
    cheap = steering(Decision("on-demand", DEAR))
    _, cmd = cheap.consult(view(missing=0))
    assert isinstance(cmd, Migrate)                          # saving (9 - 7) * 9 h = $18 > move 5 min at $7/h
    dear = Steering(Stub(Decision("on-demand", DEAR)), "stub", transfer_read_usd=lambda site: 20.0)  # type: ignore[arg-type]
    _, cmd = dear.consult(view(missing=0))
    assert isinstance(cmd, NoOp)


# -- replacements ----------------------------------------------------------------------------------
def test_replacements_go_where_the_policy_says_and_a_fixed_market_wins():
    assert steering(Decision("on-demand", reason="deadline")).replace(view(sites=(HERE,))) == \
        TopUp(2, "on-demand", "deadline")
    assert steering(Decision("on-demand")).replace(view(sites=(HERE,), fixed_market="spot")) == \
        TopUp(2, "spot", "policy stub chose spot")


def test_a_wait_is_announced_once_and_spot_is_tried_again_after_the_refusal():
    s = steering(Decision("none"))
    first = s.replace(view(sites=(HERE,), spot_refused=True))
    assert isinstance(first, Wait) and first.announce and first.missing == 2 and "spot unobtainable" in first.reason
    again = s.replace(view(sites=(HERE,), spot_refused=True))
    assert isinstance(again, Wait) and not again.announce
    assert s.replace(view(sites=(HERE,))) == TopUp(2, "spot", "policy stub chose spot")   # try spot again
    assert s.waiting                                    # the orchestrator ends the wait once a worker launched
    assert isinstance(s.replace(view(sites=(HERE,), missing=0)), NoOp) and not s.waiting
    assert s.replace(view(sites=(HERE,), spot_refused=True)).announce                      # a new wait


def test_a_task_fixed_on_spot_waits_out_a_refusal_without_asking_the_policy():
    s = steering()
    assert isinstance(s.replace(view(sites=(HERE,), fixed_market="spot", spot_refused=True)), NoOp)
    assert s.policy.asked == 0


# -- moves between markets ---------------------------------------------------------------------------
def test_the_policy_moves_workers_on_another_market_and_each_question_asks_it_once():
    s = steering(Decision("spot", reason="streak long enough"))
    decision, cmd = s.consult(view(sites=(HERE,), missing=0, current="on-demand",
                                   worker_markets=("on-demand", "on-demand")))
    assert decision == Decision("spot", reason="streak long enough")
    assert cmd == MarketMove("on-demand", "spot", "streak long enough") and s.policy.asked == 1


@pytest.mark.parametrize("over", [
    dict(current="spot", worker_markets=("spot", "spot")),             # already there
    dict(current="none", worker_markets=()),                          # nothing to move
    dict(current="on-demand", worker_markets=("on-demand",), spot_refused=True),   # spot just refused
])
def test_no_market_move_when_there_is_nothing_to_move_or_spot_was_just_refused(over):
    _, cmd = steering(Decision("spot")).consult(view(sites=(HERE,), missing=0, **over))
    assert isinstance(cmd, NoOp)
    _, cmd = steering(Decision("none")).consult(view(sites=(HERE,), missing=0, current="spot", worker_markets=("spot",)))
    assert isinstance(cmd, NoOp)


def test_cluster_prices_are_the_cheapest_offer_per_site_and_market_times_the_workers():
    def o(region, market, price):
        return Offer(cloud="aws", instance_type="g5", accelerator="A10G", accelerator_count=1, region=region,
                     zone=region + "a", market=Market.parse(market), usd_per_hour=price, source="t", as_of="2026")

    offers = [o("us-east-1", "spot", 1.0), o("us-east-1", "spot", 0.5), o("us-east-1", "on-demand", 2.0),
              o("us-west-2", "spot", 0.1)]
    assert cluster_prices(offers, [HERE], 3) == {"spot": {HERE: 1.5}, "on-demand": {HERE: 6.0}}
    assert cluster_prices(offers, [HERE, CHEAP], 1)["spot"] == {HERE: 0.5, CHEAP: 0.1}
