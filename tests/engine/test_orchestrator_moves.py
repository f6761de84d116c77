"""Where a whole-job move goes (the target picking of ``Orchestrator._maybe_migrate``), decided on
a recorded state: no node is launched and nothing moves (``_migrate`` is replaced)."""

from __future__ import annotations

import time

import pytest

from spotwise.engine.orchestrator import LaunchOptions, Orchestrator
from spotwise.engine.spot_log import SiteKey
from spotwise.policies.base import Decision, Observation
from spotwise.provisioner.base import Node
from spotwise.taskspec import parse_taskspec

HERE, CHEAP, DEAR = "aws/us-east-1", "aws/us-west-2", "gcp/us-central1"


def spot_out(orch, site: str, now: float) -> None:
    """A spot launch of one instance type in ``site`` has just met a capacity error."""
    cloud, region = site.split("/")
    orch.watch.spot_fail_t[SiteKey(cloud, region, "p4d.24xlarge")] = now


@pytest.fixture
def orch(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    o = Orchestrator(parse_taskspec({"name": "t", "resources": {"nodes": 2, "market": "auto"},
                                     "training": {"steps": 10}}), LaunchOptions())
    o._sites = [HERE, CHEAP, DEAR]
    o._head = Node(cloud="aws", instance_id="h", instance_type="m5.large", region="us-east-1", zone="us-east-1a",
                   market="on-demand", usd_per_hour=0.1, cluster_id=o.cluster_id, job_id=o.job_id, role="head")
    o._transfer_read_usd = lambda site: 0.0
    o.moved = []
    o._migrate = lambda target, market, *, reason, now: o.moved.append((target, market, reason))
    return o


def obs(**over) -> Observation:
    data = dict(elapsed_h=1.0, deadline_h=100.0, task_h=10.0, work_done_h=1.0, restart_h=0.0, tick_h=0.001,
                spot_price={HERE: 3.0, CHEAP: 1.0, DEAR: 2.0}, on_demand_price={HERE: 9.0, CHEAP: 8.0, DEAR: 7.0})
    data.update(over)
    return Observation(**data)


def test_no_move_while_this_site_has_capacity_or_nothing_is_missing(orch):
    now = time.time()
    assert orch._maybe_migrate(obs(), None, now) is False          # no capacity error here
    spot_out(orch, HERE, now)
    orch.watch.od_fail_t[HERE] = now
    orch.num_workers = 0                                            # nothing missing
    assert orch._maybe_migrate(obs(), None, now) is False and orch.moved == []


def test_capacity_move_goes_to_the_cheapest_site_not_out_of_capacity(orch):
    now = time.time()
    spot_out(orch, HERE, now)
    assert orch._maybe_migrate(obs(), None, now) is False          # on-demand may still come here
    orch.watch.od_fail_t[HERE] = now
    spot_out(orch, CHEAP, now)                            # the cheapest site is out too
    assert orch._maybe_migrate(obs(), None, now) is True
    [(target, market, why)] = orch.moved
    assert (target, market) == (DEAR, "spot") and "no spot capacity" in why and "$2.0000/h" in why


def test_policy_move_only_when_it_pays(orch):
    now = time.time()
    orch.num_workers = 0
    assert orch._maybe_migrate(obs(), Decision("spot", HERE), now) is False     # not another site
    assert orch._maybe_migrate(obs(), Decision("spot", "azure/x"), now) is False  # not a site of the plan
    assert orch._maybe_migrate(obs(), Decision("none", CHEAP), now) is False
    assert orch._maybe_migrate(obs(task_h=1.01), Decision("on-demand", DEAR), now) is False   # saving < move
    assert orch._maybe_migrate(obs(), Decision("on-demand", DEAR), now) is True
    [(target, market, why)] = orch.moved
    assert (target, market) == (DEAR, "on-demand") and "saves" in why


def test_policy_move_respects_a_market_fixed_by_the_task(orch):
    orch.spec = orch.spec.model_copy(update={"resources": orch.spec.resources.model_copy(update={"market": "spot"})})
    orch.num_workers = 0
    assert orch._maybe_migrate(obs(), Decision("on-demand", DEAR), time.time()) is False


def test_policy_move_out_of_a_site_without_capacity_needs_no_saving(orch):
    now = time.time()
    spot_out(orch, HERE, now)
    assert orch._maybe_migrate(obs(task_h=1.0), Decision("spot", DEAR, reason="spot gone here"), now) is True
    assert orch.moved == [(DEAR, "spot", "spot gone here")]


def test_no_move_once_the_run_is_stopping_or_out_of_moves(orch):
    now = time.time()
    spot_out(orch, HERE, now)
    orch.watch.od_fail_t[HERE] = now
    orch.state.stop_reason = "budget"
    assert orch._maybe_migrate(obs(), None, now) is False
    orch.state.stop_reason = None
    orch.state.migrations = [{}] * 3
    assert orch._maybe_migrate(obs(), None, now) is False and orch.moved == []


class _GoneCloud:
    """A cloud that lists no node: every node we did not end has gone (reclaimed spot)."""

    def __init__(self):
        self.ended = []

    def list_nodes(self, cluster_id):
        return []

    def was_preempted(self, node):
        return node.market == "spot"

    def terminate(self, nodes):
        self.ended += [n.instance_id for n in nodes]


def _worker(o, iid, market):
    return Node(cloud="aws", instance_id=iid, instance_type="g5.xlarge", region="us-east-1", zone="us-east-1a",
                market=market, usd_per_hour=1.0, cluster_id=o.cluster_id, job_id=o.job_id, role="worker",
                launched_at=time.time())


def test_gone_nodes_are_counted_billed_and_ended(orch):
    from spotwise.engine.ledger import Ledger

    orch._record_job(status="running")
    orch._ledger = Ledger(orch.job_id)
    cloud = orch._clouds["aws"] = _GoneCloud()
    nodes = [_worker(orch, "w-spot", "spot"), _worker(orch, "w-od", "on-demand"), _worker(orch, "w-mine", "spot")]
    for n in nodes:
        orch._nodes[n.instance_id] = n
        orch._ledger.open(n)
    orch._ending.add("w-mine")                     # one we are ending ourselves
    orch._check_nodes()
    assert orch._nodes == {} and orch._ledger.open_ids() == []
    assert orch.state.preemptions == 1 and orch.state.lost_nodes == 2 and orch._lost_at is not None
    assert [(e["event"], e["instance_id"]) for e in orch.state.events] == [("preempted", "w-spot"), ("lost", "w-od")]
    assert cloud.ended == ["w-spot", "w-od"]


def test_a_lost_head_or_too_many_lost_workers_end_the_run(orch):
    from spotwise.engine.ledger import Ledger
    from spotwise.errors import SpotwiseError

    orch._record_job(status="running")
    orch._ledger = Ledger(orch.job_id)
    orch._clouds["aws"] = _GoneCloud()
    orch.max_replacements = 0
    orch._nodes["w"] = _worker(orch, "w", "spot")
    with pytest.raises(SpotwiseError, match="giving up after 0 replacements"):
        orch._check_nodes()
    orch._nodes["h"] = orch._head
    with pytest.raises(SpotwiseError, match="head node was lost"):
        orch._check_nodes()
