"""What a run on on-demand knows of spot: the last thing it saw, and a probe (one spot worker asked
for every ``spot_probe_s``) while that was "not obtainable" — on the in-memory cloud of
``orchestrator_fakes`` (a launch comes up at once, an ended node is gone at once): the subject is
the orchestrator's bookkeeping, not a node's boot (these tests booted real local nodes before, about
a minute of setup each)."""

import time

import pytest
from orchestrator_fakes import FakeCloud

from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.errors import InputError
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.failover import Failover, UnavailableCache
from spotwise.taskspec import parse_taskspec

ZONES = {"local-a", "local-b"}


pytestmark = pytest.mark.usefixtures("local_home")


class Clock:
    """The failover's clock (its capacity-error memory, 3 min), moved with the times the test passes."""

    def __init__(self) -> None:
        self.t0, self.offset = time.monotonic(), 0.0

    def __call__(self) -> float:
        return self.t0 + self.offset


def _on_demand_run(policy: str) -> tuple[Orchestrator, FakeCloud]:
    """A run whose job has started, on two on-demand workers, right after spot met a capacity error."""
    clock = Clock()
    cloud = FakeCloud("local")
    o = Orchestrator(parse_taskspec({"name": "t", "resources": {"nodes": 2, "market": "auto"}, "policy": policy,
                                     "deadline_hours": 10.0, "training": {"steps": 10}}),
                     LaunchOptions(spot_probe_s=60.0),
                     factories=Factories(cloud=lambda name: cloud,
                                         failover=lambda clouds: Failover(cloud_factory=clouds,
                                                                          cache=UnavailableCache(clock=clock))))
    o.clock = clock                            # the test moves it
    o.row.record("running")                    # as the orchestrator does before training: the job runs,
    [head] = cloud.launch(LaunchRequest(cluster_id=o.cluster_id, job_id=o.job_id,   # its head is up
                                        offer=cloud.head_offer("local", "local-a"), role="head"))
    o.fleet.adopt(head)
    o.fleet.head = head
    o.driver.started = time.time()
    o.driver.snapshot = {"started_at": time.time(), "step": 1}
    cloud.spot_out.update(ZONES)
    assert o.fleet.add(2, "spot", why="test") == []          # spot: no capacity anywhere
    assert len(o.fleet.add(2, "on-demand", why="test")) == 2
    return o, cloud


@pytest.fixture
def fallback_run():
    o, cloud = _on_demand_run("spot-fallback")
    yield o, cloud
    o.fleet.teardown()


@pytest.fixture
def od_policy_run():
    o, cloud = _on_demand_run("on-demand")
    yield o, cloud
    o.fleet.teardown()


def _site(o):
    return o.fleet.site()


def _availability(o, t):
    """What the policy is shown of spot at the run's one site (:meth:`MarketWatch.availability`)."""
    return o.watch.availability([_site(o)], t, spot_running=o.fleet.spot_running())


def test_spot_stays_unobtainable_until_a_launch_is_granted(fallback_run):
    o, cloud = fallback_run
    t = time.time()
    assert _availability(o, t) == {_site(o): False}
    # long after the capacity error, nothing new was seen: still not obtainable (it used to read as
    # obtainable a minute later, which made a policy count spot spells that were never seen)
    assert _availability(o, t + 600) == {_site(o): False}


def test_a_probe_finds_spot_back_and_the_move_keeps_it(fallback_run):
    o, cloud = fallback_run
    t = time.time()
    o.consult_policy(t + 11)                  # probe: still no capacity; spot-fallback waits on on-demand
    assert o.watch.probes == {"asked": 1, "granted": 0, "kept": 0}
    assert {w.market for w in o.fleet.workers()} == {"on-demand"} and not o.journal.moves
    o.consult_policy(t + 40)                  # within spot_probe_s: not asked again
    assert o.watch.probes["asked"] == 1
    cloud.spot_out.clear()             # spot is back
    o.consult_policy(t + 80)                  # the failover still remembers the refusal (3 min): not asked
    assert o.watch.probes == {"asked": 2, "granted": 0, "kept": 0}
    o.clock.offset = 300.0
    o.consult_policy(t + 300)
    assert o.watch.probes == {"asked": 3, "granted": 1, "kept": 1}
    [move] = o.journal.moves
    assert (move["from"], move["to"]) == ("on-demand", "spot")
    spot = [w for w in o.fleet.workers() if w.market == "spot"]
    probe = next(e["instance_id"] for e in o.journal.events if e["event"] == "spot_probe_granted")
    assert len(spot) == 2 and probe in {w.instance_id for w in spot}       # the probe is one of the new workers
    assert len(o.fleet.draining) == 2                                           # the on-demand ones drain
    assert _availability(o, t + 301) == {_site(o): True}


def test_a_probe_the_policy_does_not_take_is_ended_and_billed(od_policy_run):
    o, cloud = od_policy_run
    t = time.time()
    cloud.spot_out.clear()
    o.clock.offset = 200.0                     # past the failover's memory of the refusal
    o.consult_policy(t + 11)                  # granted, but the policy stays on on-demand
    assert o.watch.probes == {"asked": 1, "granted": 1, "kept": 0}
    [probe] = [e["instance_id"] for e in o.journal.events if e["event"] == "spot_probe_granted"]
    ended = [e for e in o.journal.events if e["event"] == "spot_probe_ended"]
    assert ended and ended[0]["instance_id"] == probe and ended[0]["reason"]
    assert not o.journal.moves and {w.market for w in o.fleet.workers()} == {"on-demand"} and len(o.fleet.workers()) == 2
    # what it found stays known: spot obtainable, so no further probes
    assert _availability(o, t + 12) == {_site(o): True}
    o.consult_policy(t + 200)
    assert o.watch.probes["asked"] == 1
    # its bill is closed once the cloud no longer lists it, at the price it launched at
    deadline = time.time() + 30
    while probe in o.fleet.nodes and time.time() < deadline:
        o.check_nodes()
        time.sleep(0.2)
    assert probe not in o.fleet.nodes and probe not in o.purse.ledger.open_ids()
    from spotwise.engine.state import db

    with db.session() as s:
        rec = s.get(db.NodeRecord, probe)
        entries = s.query(db.LedgerEntry).filter_by(instance_id=probe).all()
    assert rec is not None and rec.market == "spot" and rec.terminated_at is not None
    assert entries and all(e.usd_per_hour == rec.usd_per_hour and e.market == "spot" for e in entries)


def test_no_probe_when_the_task_fixes_the_market_or_spot_was_seen(fallback_run):
    o, cloud = fallback_run
    o.watch.spot_seen = True
    assert o.probe_spot(time.time() + 100) is None
    o.watch.spot_seen = False
    o.stop.request("budget")
    assert o.probe_spot(time.time() + 100) is None
    assert o.watch.probes["asked"] == 0


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan")])
def test_a_probe_interval_that_is_not_a_positive_number_of_seconds_is_refused(bad):
    with pytest.raises(InputError) as e:
        Orchestrator(parse_taskspec({"name": "t", "training": {"steps": 10}}), LaunchOptions(spot_probe_s=bad))
    assert e.value.problems[0].field == "spot_probe_s"
