"""Nodes that went away without the orchestrator ending them (``Orchestrator._check_nodes``), on a
cloud that lists none: counted, billed and ended. (Where a whole-job move goes is
``tests/engine/test_steering.py``.)"""

from __future__ import annotations

import time

import pytest

from spotwise.engine.orchestrator import LaunchOptions, Orchestrator
from spotwise.provisioner.base import Node
from spotwise.taskspec import parse_taskspec


@pytest.fixture
def orch(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path))
    monkeypatch.delenv("SPOTWISE_DATABASE_URL", raising=False)
    o = Orchestrator(parse_taskspec({"name": "t", "resources": {"nodes": 2, "market": "auto"},
                                     "training": {"steps": 10}}), LaunchOptions())
    o._head = Node(cloud="aws", instance_id="h", instance_type="m5.large", region="us-east-1", zone="us-east-1a",
                   market="on-demand", usd_per_hour=0.1, cluster_id=o.cluster_id, job_id=o.job_id, role="head")
    return o


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
    orch.row.record("running")
    cloud = orch._clouds["aws"] = _GoneCloud()
    nodes = [_worker(orch, "w-spot", "spot"), _worker(orch, "w-od", "on-demand"), _worker(orch, "w-mine", "spot")]
    for n in nodes:
        orch._nodes[n.instance_id] = n
        orch.purse.ledger.open(n)
    orch._ending.add("w-mine")                     # one we are ending ourselves
    orch._check_nodes()
    assert orch._nodes == {} and orch.purse.ledger.open_ids() == []
    assert orch.journal.preemptions == 1 and orch.journal.lost_nodes == 2 and orch.driver.lost_at is not None
    assert [(e["event"], e["instance_id"]) for e in orch.journal.events] == [("preempted", "w-spot"), ("lost", "w-od")]
    assert cloud.ended == ["w-spot", "w-od"]


def test_a_lost_head_or_too_many_lost_workers_end_the_run(orch):
    from spotwise.errors import SpotwiseError

    orch.row.record("running")
    orch._clouds["aws"] = _GoneCloud()
    orch.max_replacements = 0
    orch._nodes["w"] = _worker(orch, "w", "spot")
    with pytest.raises(SpotwiseError, match="giving up after 0 replacements"):
        orch._check_nodes()
    orch._nodes["h"] = orch._head
    with pytest.raises(SpotwiseError, match="head node was lost"):
        orch._check_nodes()
