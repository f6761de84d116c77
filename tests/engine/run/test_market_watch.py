"""The run's evidence of capacity (:class:`spotwise.engine.run.market_watch.MarketWatch`), on its own:
no cloud, no database, the time passed in."""

from __future__ import annotations

from spotwise.engine.run.market_watch import RETRY_SPOT_S, SITE_MEMORY_S, MarketWatch, site_of
from spotwise.engine.state.spot_log import DOWN, UP, SiteKey
from spotwise.pricing.offer import Market, Offer
from spotwise.provisioner.base import Node
from spotwise.provisioner.failover import Attempt

T = 1_700_000_000.0


def offer(region: str, market: str, itype: str = "p4d.24xlarge", zone: str = "a") -> Offer:
    return Offer(cloud="aws", instance_type=itype, accelerator="A100", accelerator_count=8, region=region,
                 zone=f"{region}{zone}", market=Market.parse(market), usd_per_hour=1.0, source="test", as_of="2026")


EAST_SPOT, EAST_OD, WEST_SPOT = offer("us-east-1", "spot"), offer("us-east-1", "on-demand"), offer("us-west-2", "spot")
EAST, WEST = site_of(EAST_SPOT), site_of(WEST_SPOT)


class FakeLog:
    """A SpotLog that records what it is told."""

    def __init__(self, tick_s: float = 5.0) -> None:
        self.tick_s = tick_s
        self.seen: list[tuple[SiteKey, int | None, float]] = []
        self.open: set[SiteKey] = set()      # like SpotLog: a key is open until a tick without evidence
        self.closed = False

    def observe(self, key, state, now):
        self.seen.append((key, state, now))
        if state is None:
            self.open.discard(key)
        else:
            self.open.add(key)

    def open_keys(self):
        return sorted(self.open, key=str)

    def close(self):
        self.closed = True


def watch(log: FakeLog | None = None) -> MarketWatch:
    return MarketWatch(offers={o.key: o for o in (EAST_SPOT, EAST_OD, WEST_SPOT)},
                       log=log or FakeLog())  # type: ignore[arg-type]


def attempt(o: Offer, outcome: str) -> Attempt:
    return Attempt(offer_key=o.key, outcome=outcome, message="x")


def node(o: Offer, iid: str = "w") -> Node:
    return Node(cloud=o.cloud, instance_id=iid, instance_type=o.instance_type, region=o.region, zone=o.zone,
                market=o.market.value, usd_per_hour=1.0, cluster_id="c", job_id="j")


def test_a_spot_capacity_error_makes_spot_unobtainable_until_a_spot_worker_is_seen():
    w = watch()
    assert w.spot_seen is None and w.availability([EAST], T, spot_running=False) == {EAST: True}  # nothing seen
    w.saw_attempts([attempt(EAST_SPOT, "launched")], T)
    assert w.spot_seen is None and not w.spot_refused(T)                                     # granted: nothing here
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T)
    assert w.spot_seen is False and w.spot_fail_t == {SiteKey("aws", "us-east-1", "p4d.24xlarge"): T}
    assert w.availability([EAST], T + 3600, spot_running=False) == {EAST: False}     # no expiry
    assert w.availability([EAST], T + 3600, spot_running=True) == {EAST: True}       # one of ours runs
    w.saw_spot_worker()
    assert w.availability([EAST], T + 3600, spot_running=False) == {EAST: True}


def test_a_cached_refusal_counts_and_on_demand_refusals_mark_the_site():
    w = watch()
    w.saw_attempts([attempt(EAST_SPOT, "cached"), attempt(EAST_OD, "capacity")], T)
    assert w.spot_seen is False and w.last_spot_failure_t == T
    assert w.od_fail_t == {EAST: T}
    w.saw_attempts([attempt(EAST_OD, "quota"), attempt(WEST_SPOT, "error")], T + 1)    # neither is capacity
    assert w.od_fail_t == {EAST: T} and w.last_spot_failure_t == T
    unknown = Attempt(offer_key="aws/x/x-a/p5/spot", outcome="capacity")                 # not an offer of the plan
    w.saw_attempts([unknown], T + 2)
    assert w.last_spot_failure_t == T + 2 and len(w.spot_fail_t) == 1


def test_spot_refused_holds_for_the_retry_interval_only():
    w = watch()
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T)
    assert w.spot_refused(T) and w.spot_refused(T + RETRY_SPOT_S - 0.01)
    assert not w.spot_refused(T + RETRY_SPOT_S)


def test_a_site_is_blocked_for_a_minute_per_market_and_several_sites_read_that():
    w = watch()
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T)
    assert w.blocked(EAST, "spot", T + SITE_MEMORY_S - 1) and not w.blocked(EAST, "spot", T + SITE_MEMORY_S)
    assert not w.blocked(EAST, "on-demand", T) and not w.blocked(WEST, "spot", T)
    assert w.blocked_pairs([EAST, WEST], T) == frozenset({(EAST, "spot")})
    assert w.availability([EAST, WEST], T, spot_running=True) == {EAST: False, WEST: True}
    assert w.availability([EAST, WEST], T + SITE_MEMORY_S, spot_running=False) == {EAST: True, WEST: True}


def test_a_spot_worker_granted_after_a_capacity_error_there_ends_the_sites_block():
    """EC2 Fleet answered one zone's capacity error, then granted spot in another zone of the same
    region: a preemption there 40 s later must not read as "no spot capacity here" (the emulated
    AWS run had moved regions without trying one replacement). A later error blocks it again."""
    w = watch()
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T)
    assert w.blocked(EAST, "spot", T + 0.5)
    w.saw_spot_worker(node(EAST_SPOT), T + 1)
    assert not w.blocked(EAST, "spot", T + 40) and w.blocked_pairs([EAST, WEST], T + 40) == frozenset()
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T + 41)
    assert w.blocked(EAST, "spot", T + 42)
    w.saw_spot_worker()                                # no site said: evidence for spot_seen only
    assert w.blocked(EAST, "spot", T + 43)


def test_losing_the_last_spot_worker_makes_spot_unobtainable_another_one_does_not():
    w = watch()
    w.saw_spot_worker()
    w.saw_spot_lost(node(EAST_SPOT), T, spot_left=True)
    assert w.spot_seen is True and w.spot_lost_t == {SiteKey("aws", "us-east-1", "p4d.24xlarge"): T}
    w.saw_spot_lost(node(EAST_SPOT), T + 5, spot_left=False)
    assert w.spot_seen is False and w.spot_lost_t[SiteKey("aws", "us-east-1", "p4d.24xlarge")] == T + 5


def test_a_probe_is_due_only_while_spot_is_unobtainable_and_not_just_asked():
    w = watch()
    assert not w.probe_due(T, 60)                            # nothing seen: obtainable, nothing to probe
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T)
    assert not w.probe_due(T + 1, 60)                        # refused just now
    assert w.probe_due(T + RETRY_SPOT_S, 60)
    w.probe_asked(T + RETRY_SPOT_S)
    assert w.probes == {"asked": 1, "granted": 0, "kept": 0}
    assert not w.probe_due(T + RETRY_SPOT_S + 59, 60) and w.probe_due(T + RETRY_SPOT_S + 60, 60)
    w.saw_spot_worker()
    assert not w.probe_due(T + 1000, 60)


def test_each_tick_records_up_where_ours_run_down_where_refused_or_lost_and_closes_the_rest():
    log = FakeLog(tick_s=5.0)
    w = watch(log)
    east, west = SiteKey("aws", "us-east-1", "p4d.24xlarge"), SiteKey("aws", "us-west-2", "p4d.24xlarge")
    w.record_tick(T, {east})
    assert log.seen == [(east, UP, T)]
    w.saw_spot_lost(node(WEST_SPOT), T + 4, spot_left=True)        # since the last tick
    w.record_tick(T + 5, set())
    assert set(log.seen[1:]) == {(east, None, T + 5), (west, DOWN, T + 5)}
    log.seen.clear()
    w.record_tick(T + 10, set())                                    # the loss is a tick old: nothing known
    assert log.seen == [(west, None, T + 10)]
    w.saw_attempts([attempt(EAST_SPOT, "capacity")], T + 11)
    log.seen.clear()
    w.record_tick(T + 15, set())
    assert log.seen == [(east, DOWN, T + 15)]
    log.seen.clear()
    w.record_tick(T + 11 + SITE_MEMORY_S, set())                     # the refusal is forgotten
    assert log.seen == [(east, None, T + 11 + SITE_MEMORY_S)]
    w.close()
    assert log.closed
