"""The cluster's nodes (:class:`spotwise.engine.run.fleet.Fleet`) on an in-memory cloud through the real
failover: launching, the node filters, what went away, drains, ends and the teardown, each bill
closed with its reason."""

from __future__ import annotations

import logging
import time

import pytest
from orchestrator_fakes import FakeCloud
from sqlalchemy import select

from spotwise.engine.state import db
from spotwise.engine.run import fleet as fleet_module
from spotwise.engine.run.fleet import DRAIN_DEADLINE_S, Fleet
from spotwise.engine.run.journal import Journal, JobRow
from spotwise.engine.state.ledger import Ledger
from spotwise.engine.run.market_watch import MarketWatch
from spotwise.engine.state.spot_log import SiteKey, SpotLog
from spotwise.errors import SpotwiseError
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.boot.script import instance_label_value
from spotwise.provisioner.failover import Failover
from spotwise.taskspec import parse_taskspec

JOB = "job-f"


def offer(market: str, price: float, zone: str = "r1a") -> Offer:
    return Offer(cloud="fake", instance_type="gpu.x", accelerator="A10G", accelerator_count=1, region="r1",
                 zone=zone, market=Market.parse(market), usd_per_hour=price, source="fake", as_of="2026")


OFFERS = [offer("spot", 1.0), offer("on-demand", 3.0)]


@pytest.fixture
def made(database):
    """A fleet of 2 workers on the fake cloud, its job row written; (fleet, cloud, factory calls)."""
    JobRow(job_id=JOB, spec=parse_taskspec({"name": "f", "training": {"steps": 1}}), clouds=["fake"],
           cluster_id="c1", budget_usd=None).record("running")
    cloud, calls = FakeCloud("fake"), []

    def make(name):
        calls.append(name)
        return cloud

    f = Fleet(cluster_id="c1", job_id=JOB, workers=2, offers=OFFERS, default_site="fake/r1", cloud=make,
              failover=lambda clouds: Failover(cloud_factory=clouds), bills=Ledger(JOB), journal=Journal(JOB),
              watch=MarketWatch(offers={o.key: o for o in OFFERS}, log=SpotLog(JOB, 5.0)), join_timeout_s=60.0)
    return f, cloud, calls


def end_reasons() -> dict[str, str | None]:
    with db.session() as s:
        return dict(s.execute(select(db.NodeRecord.instance_id, db.NodeRecord.end_reason)).all())


def kinds(f: Fleet) -> list[str]:
    return [e["event"] for e in f.journal.events]


def test_one_cloud_per_name_shared_with_the_failover(made):
    f, cloud, calls = made
    assert f.cloud("fake") is cloud and f.failover.cloud("fake") is cloud and f.cloud("fake") is cloud
    assert calls == ["fake"]


def test_provision_prepares_the_site_once_then_the_head_and_the_workers_each_billed(made):
    f, cloud, _ = made
    assert f.site() == "fake/r1" and f.current_market() == "none"      # before: the plan's site
    f.provision()
    assert f.head is not None and f.head.role == "head" and f.site() == "fake/r1"
    assert [w.market for w in f.workers()] == ["spot", "spot"] and f.missing() == 0
    assert cloud.log[0] == ("prepare", "r1") and f.prepared == {("fake", "r1")}
    assert sorted(f.bills.open_ids()) == sorted(f.nodes) and len(f.nodes) == 3
    assert kinds(f) == ["launched"] * 3 and f.watch.spot_seen is True
    assert [a["outcome"] for a in f.journal.attempts] == ["launched", "launched"]
    f.prepare_site("fake", "r1")
    assert cloud.log.count(("prepare", "r1")) == 1


def test_a_replacement_stays_on_the_market_asked_and_says_what_it_could_not_get(made):
    f, cloud, _ = made
    f.provision()
    cloud.spot_out.add("r1a")
    assert f.add(1, "spot", why="test") == []
    assert f.watch.spot_seen is False and kinds(f)[-2:] == ["capacity_error", "no_capacity"]
    [od] = f.add(1, "on-demand", why="test")
    assert od.market == "on-demand" and od.instance_id in f.bills.open_ids()
    assert f.current_market() == "spot"                                  # 2 spot, 1 on-demand: the majority


def test_three_node_filters_workers_spot_running_and_the_spot_record(made):
    f, cloud, _ = made
    f.provision()
    a, b = f.workers()
    [probe] = f.add(1, "spot", why="probe")
    f.probing.add(probe.instance_id)
    f.drain([a], time.time())
    assert f.workers() == [b] and f.missing() == 1                       # neither drained nor probing
    assert f.spot_running()
    f.ending.add(b.instance_id)
    assert not f.spot_running()                                          # the one left is being ended
    key = SiteKey("fake", "r1", "gpu.x")
    assert f.spot_sites() == {key}                                       # drained and probing ones count
    f.ending.update({a.instance_id, probe.instance_id})
    assert f.spot_sites() == set()


def test_nodes_gone_from_the_cloud_are_forgotten_billed_and_handed_over_unless_we_ended_them(made):
    f, cloud, _ = made
    f.provision()
    a, b = f.workers()
    cloud.reclaim(a.instance_id)
    cloud.reclaim(b.instance_id)
    f.ending.add(b.instance_id)
    lost = []
    f.sync(lost.append, time.time())
    assert lost == [a] and a.instance_id not in f.nodes and b.instance_id not in f.nodes
    reasons = end_reasons()
    assert reasons[a.instance_id] == "gone" and reasons[b.instance_id] == "ended" and reasons[f.head.instance_id] is None
    assert f.was_preempted(a)                                            # spot: the default rule
    f.end_remains(a)
    assert cloud.log[-1] == ("terminate", [a.instance_id])
    cloud.fail_terminate = True
    f.end_remains(a)                                                     # logged, not raised


def test_a_loss_handler_that_gives_up_leaves_the_rest_for_later(made):
    f, cloud, _ = made
    f.provision()
    for w in f.workers():
        cloud.reclaim(w.instance_id)

    def give_up(node):
        raise RuntimeError("too many")

    with pytest.raises(RuntimeError):
        f.sync(give_up, time.time())
    assert len(f.workers()) == 1                                         # the second is handed over next time


def test_the_cloud_is_listed_every_node_poll_only_in_the_nodes_regions_and_at_once_when_ray_lost_a_worker(
        made, monkeypatch):
    f, cloud, _ = made
    f.provision()
    t0 = time.time()
    lost: list = []
    ran = [f.poll(t0 + i * 0.25, lost.append) for i in range(int(60 / 0.25))]   # a minute of 4 ticks a second
    assert sum(ran) == 60 / fleet_module.NODE_POLL_S == 3                   # 3 listings a minute, not 60
    assert cloud.lists == [("c1", ("r1",))] * 3                              # the cluster's tag, its own region
    # Ray lost a worker (the join watch asks the head, not the cloud): the next tick lists at once
    a, b = f.workers()
    f.dashboard = ("http://head:8265", {})
    answers = [{instance_label_value(n.instance_id) for n in (f.head, a, b)},
               {instance_label_value(n.instance_id) for n in (f.head, b)}]
    monkeypatch.setattr(fleet_module, "alive_instances", lambda url, headers: answers.pop(0))
    f.check_joins(t0 + 45, lambda o: None)
    assert not f.poll(t0 + 45.25, lost.append)                               # all ALIVE: no reason to list early
    cloud.reclaim(a.instance_id)
    f.check_joins(t0 + 50, lambda o: None)
    assert f.poll(t0 + 50.25, lost.append) and lost == [a]                  # found within a tick, not 20 s


def test_a_cloud_that_lists_without_an_api_keeps_its_own_period(made):
    """The local cloud reads its own state files: listed every second, whatever node_poll_s says."""
    f, cloud, _ = made
    cloud.list_period_s = 1.0
    f.provision()
    t0 = time.time()
    assert sum(f.poll(t0 + i * 0.25, lambda n: None) for i in range(240)) == 60
    from spotwise.provisioner.clouds.local.cloud import LocalCloud

    assert LocalCloud.list_period_s == 1.0


def test_a_node_launched_moments_ago_that_the_cloud_does_not_list_yet_is_not_gone(made):
    """EC2 may list an instance late after CreateFleet: a replacement not yet listed is not preempted."""
    f, cloud, _ = made
    cloud.listing_lag_s = 60.0                                               # as EC2's
    f.provision()
    a, b = f.workers()
    del cloud.live[a.instance_id]                                            # not listed (yet)
    lost: list = []
    f.sync(lost.append, f.adopted_at[a.instance_id] + 59)
    assert lost == [] and a.instance_id in f.nodes
    f.sync(lost.append, f.adopted_at[a.instance_id] + 60)
    assert lost == [a]                                                      # still missing after the grace: gone


def test_a_young_node_a_listing_has_shown_is_gone_when_it_is_missing(made):
    """The grace is for an instance the listing has not shown yet: a spot worker reclaimed in its
    first minute, listed before, is gone at the first listing that lacks it (not 60 s after launch)."""
    f, cloud, _ = made
    cloud.listing_lag_s = 60.0                                               # as EC2's
    f.provision()
    a, b = f.workers()
    lost: list = []
    f.sync(lost.append, f.adopted_at[a.instance_id] + 5)                     # both listed
    assert lost == [] and {a.instance_id, b.instance_id} <= f.listed
    del cloud.live[a.instance_id]                                            # reclaimed at 20 s
    f.sync(lost.append, f.adopted_at[a.instance_id] + 20)
    assert lost == [a] and a.instance_id not in f.listed and a.instance_id not in f.nodes
    assert b.instance_id in f.nodes


def test_a_listing_that_fails_is_unknown_never_gone(made, caplog):
    f, cloud, _ = made
    f.provision()

    def refuse(cluster_id=None, *, regions=None):
        raise SpotwiseError("aws describe_instances in r1 failed: RequestLimitExceeded")

    real = cloud.list_nodes
    cloud.list_nodes = refuse
    later = time.time()
    lost: list = []
    for i in range(3):
        f.sync(lost.append, later + i)
    assert lost == [] and len(f.workers()) == 2 and "could not list fake nodes" in caplog.text
    assert kinds(f).count("list_failed") == 1                                # one event per failing streak
    cloud.list_nodes = real
    cloud.reclaim(f.workers()[0].instance_id)
    f.sync(lost.append, later + 5)
    assert len(lost) == 1 and f.list_failures == {}


def test_drained_nodes_end_at_the_deadline_or_once_a_preemption_checkpoint_is_committed(made):
    f, cloud, _ = made
    f.provision()
    a, b = f.workers()
    t = time.time()
    f.drain([a, b], t)
    f.finish_drains(t + 1, [{"t": t - 5, "kind": "preemption"}, {"t": t + 0.5, "kind": "periodic"}])
    assert set(f.draining) == {a.instance_id, b.instance_id}             # nothing yet
    f.finish_drains(t + 1, [{"t": t + 0.5, "kind": "preemption"}])
    assert f.draining == {} and f.workers() == [] and end_reasons()[a.instance_id] == "moved"
    [c] = f.add(1, "spot", why="t")
    f.drain([c], t)
    f.finish_drains(t + DRAIN_DEADLINE_S, [])
    assert f.draining == {} and end_reasons()[c.instance_id] == "moved"


def test_a_worker_whose_ray_never_joined_is_ended_and_handed_over(made, monkeypatch):
    f, cloud, _ = made
    f.provision()
    a, b = f.workers()
    a.launched_at = b.launched_at = time.time() - 120                    # past the 60 s join timeout
    ended = []
    f.check_joins(time.time(), ended.append)                             # no dashboard yet: nothing known
    assert ended == []
    f.dashboard = ("http://head:8265", {})
    answers = {"http://head:8265": {instance_label_value(f.head.instance_id), instance_label_value(b.instance_id)}}
    monkeypatch.setattr(fleet_module, "alive_instances", lambda url, headers: answers.get(url))
    cloud.fail_terminate = True                                          # the cloud refuses: still ours
    f.check_joins(time.time(), ended.append)
    assert ended == [] and a.instance_id in f.nodes and a.instance_id not in f.ending
    cloud.fail_terminate = False
    f.check_joins(time.time(), ended.append)
    assert [o.node for o in ended] == [a] and a.instance_id not in f.nodes
    assert end_reasons()[a.instance_id] == "not joined"


def test_teardown_ends_what_the_cloud_lists_and_what_we_know_and_closes_every_bill(made, caplog):
    f, cloud, _ = made
    f.provision()
    [stray] = cloud.launch(LaunchRequest(cluster_id="c1", job_id=JOB, offer=OFFERS[1]))   # listed, never adopted
    f.teardown()
    assert cloud.live == {} and f.nodes == {} and f.bills.open_ids() == []
    assert stray.instance_id in cloud.log[-2][1] and cloud.log[-1] == ("cleanup", "c1")
    assert [e["what"] for e in f.journal.events if e["event"] == "deleted"] == ["fake: the cluster's network"]
    assert set(end_reasons().values()) == {"teardown"}


def test_a_teardown_the_cloud_refuses_still_closes_the_bills(made, caplog):
    f, cloud, _ = made
    f.provision()
    cloud.fail_terminate = True
    with caplog.at_level(logging.ERROR, logger="spotwise.orchestrator"):
        f.teardown()
    assert "gc will" in caplog.text and f.bills.open_ids() == [] and f.nodes == {}
