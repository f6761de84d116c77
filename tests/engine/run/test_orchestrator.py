"""Orchestrator decisions that need no training job: planning, refusals before anything launches,
where a replacement node goes when spot capacity is gone (the in-memory cloud), workers whose Ray
never joined (real local nodes and the head's real dashboard, no Ray Train), and nodes that went
away (a cloud that lists none)."""

import time

import pytest
from orchestrator_fakes import FakeCloud

from spotwise.errors import InputError, SpotwiseError
from spotwise.provisioner.clouds.local.cloud import LocalCloud
from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.engine.plan.planner import make_plan
from spotwise.provisioner.base import LaunchRequest, Node
from spotwise.taskspec import parse_taskspec


def spec(**over):
    data = {"name": "t", "resources": {"nodes": 2, "market": "auto"}, "training": {"steps": 10}}
    data.update(over)
    return parse_taskspec(data)


pytestmark = pytest.mark.usefixtures("local_home")


def test_plan_ranks_by_expected_cost_and_respects_market():
    p = make_plan(spec(), ["local"])
    markets = [x.offer.market.value for x in p.ranked]
    assert markets[0] == "spot" and "on-demand" in markets
    assert [x.expected_cost_usd for x in p.ranked] == sorted(x.expected_cost_usd for x in p.ranked)
    assert "lowest expected total cost" in p.reason
    doc = p.to_dict()
    assert set(doc) >= {"chosen", "fallbacks", "reason"} and {"expected_hours", "expected_cost_usd"} <= set(doc["chosen"])
    assert all(x.offer.market.value == "on-demand"
               for x in make_plan(spec(resources={"nodes": 1, "market": "on-demand"}), ["local"]).ranked)
    assert all(x.offer.market.value == "spot"
               for x in make_plan(spec(resources={"nodes": 1, "market": "spot"}), ["local"]).ranked)


def test_plan_from_the_catalog_needs_no_credentials(monkeypatch):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    p = make_plan(spec(resources={"accelerators": "A100:8", "nodes": 2, "clouds": ["aws"], "regions": ["us-east-1"]},
                       training={"steps": 10, "batch_size": 16}), ["aws"])
    assert p.chosen.offer.cloud == "aws" and p.chosen.head_usd_per_hour > 0
    assert {x.offer.market.value for x in p.ranked} == {"spot", "on-demand"}


def test_max_price_below_every_offer_is_an_input_error():
    with pytest.raises(InputError) as e:
        Orchestrator(spec(resources={"nodes": 1, "max_price_per_hour": 0.01}), LaunchOptions())
    assert e.value.problems[0].field == "resources"


def test_budget_that_cannot_pay_a_billing_minute_is_refused_before_launch():
    with pytest.raises(SpotwiseError, match="nothing was launched"):
        Orchestrator(spec(), LaunchOptions(budget_usd=0.001))
    assert LocalCloud().list_nodes() == []


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_a_join_timeout_that_is_not_a_positive_number_of_seconds_is_refused(bad):
    with pytest.raises(InputError) as e:
        Orchestrator(spec(), LaunchOptions(join_timeout_s=bad))
    assert e.value.problems[0].field == "join_timeout_s"
    assert LocalCloud().list_nodes() == []


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), 301.0])
def test_a_node_poll_period_out_of_range_is_refused_naming_the_field(bad):
    with pytest.raises(InputError) as e:
        Orchestrator(spec(), LaunchOptions(node_poll_s=bad))
    assert e.value.problems[0].field == "node_poll_s" and "15-30" in e.value.problems[0].allowed


def test_unknown_cloud_and_unreachable_storage_are_clear_input_errors():
    with pytest.raises(InputError) as e:
        Orchestrator(spec(), LaunchOptions(cloud="moon"))
    assert e.value.problems[0].field == "--cloud"
    remote = spec(resources={"accelerators": "A100:8", "clouds": ["aws"], "regions": ["us-east-1"]})
    with pytest.raises(InputError) as e:
        Orchestrator(remote, LaunchOptions())
    assert e.value.problems[0].field == "training.checkpoint.storage" and "s3://" in e.value.problems[0].allowed
    with pytest.raises(InputError) as e:
        Orchestrator(remote, LaunchOptions(storage="file:///tmp/x"))
    assert e.value.problems[0].field == "--storage"


@pytest.fixture
def running(head_up):
    """An orchestrator with its job recorded and its Ray head up, as in a real run (no training)."""
    o = Orchestrator(spec(deadline_hours=1.0, policy="spot-fallback"), LaunchOptions())
    cloud = head_up(o)
    yield o, cloud
    o.fleet.teardown()


@pytest.fixture
def started():
    """The same on the in-memory cloud of ``orchestrator_fakes`` (a launch is up at once): for the
    tests whose subject is the orchestrator's choices, not a node's boot or Ray's view of it."""
    cloud = FakeCloud("local")
    o = Orchestrator(spec(deadline_hours=1.0, policy="spot-fallback"), LaunchOptions(),
                     factories=Factories(cloud=lambda name: cloud))
    o.row.record("running")
    [head] = cloud.launch(LaunchRequest(cluster_id=o.cluster_id, job_id=o.job_id,
                                        offer=cloud.head_offer("local", "local-a"), role="head"))
    o.fleet.adopt(head)
    o.fleet.head = head
    o.driver.started = time.time()
    yield o, cloud
    o.fleet.teardown()


def test_replacement_waits_for_spot_then_goes_on_demand_when_the_deadline_requires(started):
    o, cloud = started
    cloud.spot_out.update({"local-a", "local-b"})             # every spot zone is out of capacity
    now = time.time()
    o.top_up(now)                                            # policy: spot (tried) -> no capacity
    assert o.fleet.workers() == []
    assert [e["event"] for e in o.journal.events].count("capacity_error") >= 1
    o.top_up(now + 1)                                        # spot unobtainable, deadline far: wait
    assert o.fleet.workers() == [] and any(e["event"] == "waiting" for e in o.journal.events)
    o.driver.started = time.time() - 0.999 * 3600                   # the deadline is now seconds away
    o.top_up(time.time())
    ws = o.fleet.workers()
    assert len(ws) == 2 and {w.market for w in ws} == {"on-demand"}
    head_rate = o.fleet.head.usd_per_hour
    assert o.purse.ledger.rate_usd_per_hour() == pytest.approx(sum(w.usd_per_hour for w in ws) + head_rate)


def test_policy_moves_replacements_to_on_demand_after_repeated_preemptions(started):
    o, cloud = started
    o.journal.preemptions = 3                                   # spot-fallback: 3 within the hour
    o.top_up(time.time())
    assert {w.market for w in o.fleet.workers()} == {"on-demand"}


def test_a_task_with_a_deadline_is_steered_by_spotwise_unless_it_names_a_policy():
    from spotwise.policies.base import get_policy

    assert type(Orchestrator(spec(deadline_hours=5.0), LaunchOptions()).steering.policy) is type(get_policy("spotwise"))
    assert type(Orchestrator(spec(), LaunchOptions()).steering.policy) is type(get_policy("spot-fallback"))
    named = Orchestrator(spec(deadline_hours=5.0, policy="uniform-progress"), LaunchOptions())
    assert type(named.steering.policy) is type(get_policy("uniform-progress"))


def test_default_checkpoint_storage_follows_spotwise_home(local_home):
    from spotwise.engine.run.orchestrator import _storage_uri

    assert _storage_uri(spec(), LaunchOptions()) == f"file://{local_home}/checkpoints"
    assert (local_home / "checkpoints").is_dir()
    assert _storage_uri(spec(), LaunchOptions(storage="s3://b/p")) == "s3://b/p"
    with pytest.raises(InputError, match="--storage"):
        _storage_uri(spec(), LaunchOptions(storage="s3://"))
    assert _storage_uri(spec(), LaunchOptions(storage="gs://b/p")) == "gs://b/p"     # local nodes read any store
    with pytest.raises(InputError, match="(?s)--storage.*aws nodes cannot reach gs://"):
        _storage_uri(spec(), LaunchOptions(storage="gs://b/p", cloud="aws"))
    assert _storage_uri(spec(), LaunchOptions(storage="az://myaccount/ckpt/p")) == "az://myaccount/ckpt/p"
    with pytest.raises(InputError, match="(?s)--storage.*aws nodes cannot reach az://"):
        _storage_uri(spec(), LaunchOptions(storage="az://myaccount/ckpt/p", cloud="aws"))


def test_a_worker_whose_ray_is_not_in_the_cluster_is_ended_counted_and_replaced(running):
    """The join watchdog against the head's real Ray dashboard: a worker whose Ray joined is kept;
    one its cloud launched long ago whose Ray is not in the cluster (a boot that failed) is ended,
    its bill closed, counted as lost, and ``top_up`` replaces it. A dashboard that does not answer
    ends nothing; ``max_replacements`` bounds these as it bounds preemptions."""
    from spotwise.engine.run.joins import alive_instances

    o, cloud = running
    now = time.time()

    def phantom(name: str) -> Node:
        return Node(cloud="local", instance_id=f"{o.cluster_id}-worker-{name}", instance_type="local.cpu1",
                    region="local", zone="local-a", market="spot", usd_per_hour=0.9, cluster_id=o.cluster_id,
                    job_id=o.job_id, role="worker", launched_at=now - o.opts.join_timeout_s - 60)

    ghost = phantom("ghost")
    o.fleet.adopt(ghost)
    o.top_up(now)                                            # one worker missing: a real one joins
    [real] = [w for w in o.fleet.workers() if w is not ghost]
    ep = cloud.endpoint(o.cluster_id, o.fleet.head)
    assert alive_instances(ep.dashboard_url, ep.headers) == {o.fleet.head.instance_id, real.instance_id}
    assert alive_instances(ep.dashboard_url, {"Authorization": "Bearer not-the-token"}) is None

    o.fleet.dashboard = ("http://127.0.0.1:9", {})                  # the dashboard does not answer: unknown
    o.check_joins(time.time())
    assert ghost.instance_id in o.fleet.nodes and o.journal.lost_nodes == 0

    o.fleet.dashboard = (ep.dashboard_url, dict(ep.headers))
    o.check_joins(time.time())
    assert ghost.instance_id not in o.fleet.nodes and real.instance_id in o.fleet.nodes
    [ev] = [e for e in o.journal.events if e["event"] == "not_joined"]
    assert ev["instance_id"] == ghost.instance_id and ev["seen"] == "never ALIVE in Ray"
    assert ev["unseen_s"] > o.opts.join_timeout_s
    assert o.journal.lost_nodes == 1
    o.top_up(time.time())
    ws = o.fleet.workers()
    assert len(ws) == 2 and ghost not in ws and any(e["event"] == "replaced" for e in o.journal.events)
    assert o.purse.ledger.rate_usd_per_hour() == pytest.approx(sum(w.usd_per_hour for w in ws) + o.fleet.head.usd_per_hour)
    o.check_joins(time.time())                               # every worker joined: nothing to end
    assert o.journal.lost_nodes == 1 and set(o.fleet.nodes) == {o.fleet.head.instance_id, *(w.instance_id for w in ws)}

    # a worker that died: its Ray node turns DEAD, which the head's answer leaves out (Ray counts it
    # in `total`); the answer is still a complete one, so another ghost is still found
    gone = ws[0]
    cloud.kill_now(gone)
    for _ in range(90):                                       # the GCS's health checks notice it
        alive = alive_instances(ep.dashboard_url, ep.headers)
        if alive is not None and gone.instance_id not in alive:
            break
        time.sleep(1.0)
    assert alive is not None and gone.instance_id not in alive and o.fleet.head.instance_id in alive
    o.recovery.max_replacements = 1
    o.fleet.adopt(phantom("ghost2"))
    with pytest.raises(SpotwiseError, match="giving up"):
        o.check_joins(time.time())
    assert [e["instance_id"] for e in o.journal.events if e["event"] == "not_joined"][-1].endswith("ghost2")


# -- nodes that went away (moved from test_orchestrator_moves.py) --------------------------------------
class _GoneCloud:
    """A cloud that lists no node: every node we did not end has gone (reclaimed spot)."""

    listing_lag_s = 0.0          # what the fleet reads of a Cloud besides the calls below
    list_period_s = None

    def __init__(self):
        self.ended = []

    def list_nodes(self, cluster_id, *, regions=None):
        return []

    def was_preempted(self, node):
        return node.market == "spot"

    def terminate(self, nodes):
        self.ended += [n.instance_id for n in nodes]


@pytest.fixture
def gone():
    """An orchestrator whose cloud (``aws``, a :class:`_GoneCloud`) lists none of its nodes, with
    its head recorded at us-east-1; nothing launches."""
    cloud = _GoneCloud()
    o = Orchestrator(spec(), LaunchOptions(), factories=Factories(cloud=lambda name: cloud))
    o.fleet.head = Node(cloud="aws", instance_id="h", instance_type="m5.large", region="us-east-1",
                        zone="us-east-1a", market="on-demand", usd_per_hour=0.1, cluster_id=o.cluster_id,
                        job_id=o.job_id, role="head")
    o.row.record("running")
    return o, cloud


def _worker(o, iid, market):
    return Node(cloud="aws", instance_id=iid, instance_type="g5.xlarge", region="us-east-1", zone="us-east-1a",
                market=market, usd_per_hour=1.0, cluster_id=o.cluster_id, job_id=o.job_id, role="worker",
                launched_at=time.time())


def test_gone_nodes_are_counted_billed_and_ended(gone):
    o, cloud = gone
    nodes = [_worker(o, "w-spot", "spot"), _worker(o, "w-od", "on-demand"), _worker(o, "w-mine", "spot")]
    for n in nodes:
        o.fleet.nodes[n.instance_id] = n
        o.purse.ledger.open(n)
    o.fleet.ending.add("w-mine")                   # one we are ending ourselves
    o.check_nodes()
    assert o.fleet.nodes == {} and o.purse.ledger.open_ids() == []
    assert o.journal.preemptions == 1 and o.journal.lost_nodes == 2 and o.driver.lost_at is not None
    assert [(e["event"], e["instance_id"]) for e in o.journal.events] == [("preempted", "w-spot"), ("lost", "w-od")]
    assert cloud.ended == ["w-spot", "w-od"]


def test_a_lost_head_or_too_many_lost_workers_end_the_run(gone):
    o, cloud = gone
    o.recovery.max_replacements = 0
    o.fleet.nodes["w"] = _worker(o, "w", "spot")
    with pytest.raises(SpotwiseError, match="giving up after 0 replacements"):
        o.check_nodes()
    o.fleet.nodes["h"] = o.fleet.head
    with pytest.raises(SpotwiseError, match="head node was lost"):
        o.check_nodes()


def test_the_node_poll_period_comes_from_the_environment_within_bounds(monkeypatch):
    """``SPOTWISE_NODE_POLL_S`` sets the default listing period (the emulated clouds' e2e runs use
    2 s); a value that is not seconds in (0, 300] is refused naming the variable, before a launch."""
    from spotwise.engine.plan.options import NODE_POLL_S

    monkeypatch.delenv("SPOTWISE_NODE_POLL_S", raising=False)
    assert LaunchOptions().node_poll_s == NODE_POLL_S == 20.0
    monkeypatch.setenv("SPOTWISE_NODE_POLL_S", "2")
    assert LaunchOptions().node_poll_s == 2.0
    for bad in ("0", "-1", "nan", "301", "often"):
        monkeypatch.setenv("SPOTWISE_NODE_POLL_S", bad)
        with pytest.raises(InputError, match="SPOTWISE_NODE_POLL_S"):
            LaunchOptions()


def test_the_plan_asks_the_very_cloud_objects_the_run_launches_with(monkeypatch):
    """What the plan reads of a cloud (AWS: the node subnets and their route tables, for its NAT
    check) is not read again at launch: the plan asks the run's own cloud object, the one its fleet
    launches with (issue 51: reads per minute, launch included). Before, the plan made its own."""
    asked: list = []
    real = LocalCloud.offers

    def offers(self):
        asked.append(self)
        return real(self)

    monkeypatch.setattr(LocalCloud, "offers", offers)
    o = Orchestrator(spec(), LaunchOptions())
    assert asked and all(c is o.fleet.cloud("local") for c in asked)
