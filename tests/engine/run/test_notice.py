"""Issue 51: the replacement is asked for at the interruption notice, not when the cloud stops
listing the node. The fleet's rules (a noticed worker is no longer a worker; each notice counts
once; ours to drain or end are not notices), the budget check before the overlap, and the
orchestrator's order of events — the replacement requested while the noticed node is still up and
billed — on the in-memory cloud, with the head's ``node_draining`` events as the job reports them
(:mod:`spotwise.runtime.node.drains`)."""

from __future__ import annotations

import time

import pytest
from orchestrator_fakes import FakeCloud

from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.engine.run.purse import BILLING_INCREMENT_S, Purse
from spotwise.provisioner.base import LaunchRequest
from spotwise.provisioner.boot.script import instance_label_value
from spotwise.runtime.node.drains import EVENT, DrainReporter
from spotwise.taskspec import parse_taskspec

pytestmark = pytest.mark.usefixtures("local_home")


def spec(**over):
    data = {"name": "t", "resources": {"nodes": 2, "market": "spot"}, "training": {"steps": 10}}
    data.update(over)
    return parse_taskspec(data)


def draining(node, deadline: float) -> dict:
    """The event the head's job reports when Ray accepted the node's drain (its notice)."""
    return {"t": time.time(), "event": EVENT, "instance": instance_label_value(node.instance_id),
            "node_id": "ab" * 28, "deadline_ms": int(deadline * 1000)}


def started(budget: float | None = None):
    cloud = FakeCloud("local")
    o = Orchestrator(spec(), LaunchOptions(budget_usd=budget), factories=Factories(cloud=lambda name: cloud))
    o.row.record("running")
    [head] = cloud.launch(LaunchRequest(cluster_id=o.cluster_id, job_id=o.job_id,
                                        offer=cloud.head_offer("local", "local-a"), role="head"))
    o.fleet.adopt(head)
    o.fleet.head = head
    o.driver.started = time.time()
    o.top_up(time.time())
    assert len(o.fleet.workers()) == 2
    return o, cloud


def kinds(o) -> list[str]:
    return [e["event"] for e in o.journal.events]


def test_a_noticed_worker_is_replaced_while_it_is_still_up_and_billed_and_its_loss_asks_for_nothing_more():
    o, cloud = started()
    try:
        a, b = o.fleet.workers()
        now = time.time()
        o.recovery.notice([draining(a, now + 30)], now)
        assert o.fleet.workers() == [b] and o.fleet.missing() == 1 and a.instance_id in o.fleet.noticed
        [ev] = [e for e in o.journal.events if e["event"] == "node_notice"]
        assert ev["instance_id"] == a.instance_id and 25 < ev["goes_in_s"] <= 30
        o.recovery.notice([draining(a, now + 30)], now + 1)                       # the same notice again: once
        assert kinds(o).count("node_notice") == 1
        o.top_up(now)
        [rep] = [e for e in o.journal.events if e["event"] == "replaced"][-1:]
        assert rep["at_notice_of"] == [a.instance_id] and now - 0.001 <= rep["asked_at"] <= rep["t"]
        assert len(o.fleet.workers()) == 2 and a.instance_id in o.fleet.nodes   # both up: the overlap
        assert a.instance_id in o.purse.ledger.open_ids()                       # still billed until gone
        launched = kinds(o).count("launched")
        cloud.reclaim(a.instance_id)                                     # the cloud takes it at the deadline
        o.check_nodes()
        o.top_up(time.time())
        assert kinds(o).count("launched") == launched                    # nothing more to ask for
        assert o.journal.preemptions == 1 and o.fleet.noticed == {} and o.fleet.missing() == 0
        order = kinds(o)
        assert order.index("node_notice") < len(order) - 1 - order[::-1].index("replaced") < order.index("preempted")
    finally:
        o.fleet.teardown()


def test_notices_of_nodes_the_run_ends_or_drains_itself_or_of_the_head_or_strangers_are_not_notices():
    o, cloud = started()
    try:
        a, b = o.fleet.workers()
        now = time.time()
        o.fleet.drain([a], now)                                          # a market move of ours
        stranger = {"event": EVENT, "instance": "i-not-ours", "deadline_ms": int((now + 30) * 1000)}
        other = {"event": "worker_started", "instance": instance_label_value(b.instance_id)}
        assert o.fleet.notices([draining(a, now + 30), draining(o.fleet.head, now + 30), stranger, other],
                               now) == []
        assert o.fleet.noticed == {}
        # no deadline in the drain: the node's cloud's notice window from now
        [n] = o.fleet.notices([draining(b, 0) | {"deadline_ms": None}], now)
        assert n is b and o.fleet.noticed[b.instance_id] == pytest.approx(now + (cloud.notice_window_s or 0.0))
    finally:
        o.fleet.teardown()


def test_an_overlap_the_cap_cannot_pay_waits_for_the_node_to_go_and_says_why():
    o0, _ = started()
    rate = o0.purse.ledger.rate_usd_per_hour()                           # head + 2 spot workers
    worker = o0.fleet.workers()[0].usd_per_hour
    o0.fleet.teardown()
    # enough for the budget rule's minute, not for a third worker over a 30 s overlap on top
    budget = rate * (BILLING_INCREMENT_S + 5) / 3600
    assert (rate + worker) * (30 + BILLING_INCREMENT_S) / 3600 > budget
    o, cloud = started(budget=budget)
    try:
        a, b = o.fleet.workers()
        first = kinds(o).count("replaced")                               # the first two workers
        now = time.time()
        o.recovery.notice([draining(a, now + 30)], now)
        o.top_up(now)
        o.top_up(now + 1)
        assert len(o.fleet.nodes) == 3 and kinds(o).count("replaced") == first
        [wait] = [e for e in o.journal.events if e["event"] == "waiting"]      # said once, with why
        assert wait["reason"].startswith("budget:") and f"${budget:,.2f}" in wait["reason"]
        cloud.reclaim(a.instance_id)
        o.check_nodes()
        o.top_up(time.time())                                            # gone: replaced as before issue 51
        rep = [e for e in o.journal.events if e["event"] == "replaced"][-1]
        assert kinds(o).count("replaced") == first + 1 and "at_notice_of" not in rep and len(o.fleet.workers()) == 2
    finally:
        o.fleet.teardown()


class Books:
    def __init__(self, spend: float, rate: float) -> None:
        self._spend, self._rate = spend, rate

    def spend(self, now=None) -> float:
        return self._spend

    def rate_usd_per_hour(self) -> float:
        return self._rate


def purse(budget, spend=1.0, rate=3.6) -> Purse:
    return Purse(Books(spend, rate), budget, lease=lambda: None, event=lambda *a, **k: None)  # type: ignore[arg-type]


def test_the_overlap_is_paid_when_spend_the_burn_and_the_replacement_fit_under_the_cap():
    # 1.0 spent, 3.6 $/h burning, a 3.6 $/h replacement for 60 s of overlap + the billing minute: 1.24
    assert purse(None).overlap_refused(3.6, 60, 0) is None
    assert purse(1.25).overlap_refused(3.6, 60, 0) is None
    why = purse(1.23).overlap_refused(3.6, 60, 0)
    assert why is not None and "$1.2400" in why and "$1.23" in why and "60 s" in why


def test_the_head_reports_each_draining_node_once_with_its_instance_and_deadline():
    """What Ray's GCS says is draining (node id -> deadline ms, 0 for none), as ``node_draining``
    events named by the nodes' ``spotwise-instance`` labels; a GCS that does not answer is asked
    again and reports nothing meanwhile."""
    got: list = []
    answers: list = [{"n1": 1_700_000_030_000}, RuntimeError("GCS busy"), {"n1": 1_700_000_030_000, "n2": 0}]

    def ask():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    r = DrainReporter(lambda kind, **kw: got.append((kind, kw)), draining=ask,
                      labels=lambda: {"n1": "i-1", "n2": "i-2"})
    assert r.check() == ["n1"] and r.check() == [] and r.check() == ["n2"]
    assert got == [(EVENT, {"instance": "i-1", "node_id": "n1", "deadline_ms": 1_700_000_030_000}),
                   (EVENT, {"instance": "i-2", "node_id": "n2", "deadline_ms": None})]


def test_a_notice_that_passes_without_a_preemption_ends_the_drained_node_within_a_minute_and_the_ledger_says_so():
    """An interruption that does not come (a rebalance recommendation, a cancelled Azure event, a
    Slurm job not killed after all): the noticed node's Ray is drained — nothing is scheduled on it
    again — so the replacement, already joined, is the worker, and the noticed node is ended a minute
    past its deadline (ledger reason ``notice passed``): not counted as a preemption."""
    from sqlalchemy import select

    from spotwise.engine.run.recovery import NOTICE_GRACE_S
    from spotwise.engine.state import db

    o, cloud = started()
    try:
        a, b = o.fleet.workers()
        now = time.time()
        o.recovery.notice([draining(a, now + 30)], now)
        o.top_up(now)
        [c] = [w for w in o.fleet.workers() if w.instance_id not in (a.instance_id, b.instance_id)]
        assert NOTICE_GRACE_S <= 60
        o.recovery.check_notices(now + 30 + NOTICE_GRACE_S - 1)
        assert a.instance_id in o.fleet.nodes and a.instance_id in o.purse.ledger.open_ids()
        o.recovery.check_notices(now + 30 + NOTICE_GRACE_S)
        assert a.instance_id not in o.fleet.nodes and o.fleet.noticed == {}
        assert {w.instance_id for w in o.fleet.workers()} == {b.instance_id, c.instance_id} and o.fleet.missing() == 0
        with db.session() as s:
            reason = s.execute(select(db.NodeRecord.end_reason)
                               .where(db.NodeRecord.instance_id == a.instance_id)).scalar_one()
        assert reason == "notice passed"
        [ev] = [e for e in o.journal.events if e["event"] == "notice_passed"]
        assert ev["instance_id"] == a.instance_id and ev["past_deadline_s"] == NOTICE_GRACE_S
        assert o.journal.preemptions == 0 and ("terminate", [a.instance_id]) in cloud.log
    finally:
        o.fleet.teardown()


# -- the emulated AWS e2e's finding (issue 51): a noticed node ended by the run, and a capacity error at
#    the notice -------------------------------------------------------------------------------------
def end_reason(instance_id: str) -> str | None:
    from sqlalchemy import select

    from spotwise.engine.state import db

    with db.session() as s:
        return s.execute(select(db.NodeRecord.end_reason).where(db.NodeRecord.instance_id == instance_id)).scalar_one()


def test_a_noticed_worker_the_run_ends_itself_before_its_deadline_counts_as_preempted_and_its_bill_says_so():
    """A region move (or any end of the run's own but its clean end) that takes a worker under notice
    before its cloud does: the cloud was taking it anyway, so it is a preemption — counted, a
    ``preempted`` event saying what ended it, its bill closed ``preempted (REASON)``, and its spot
    site's loss in the market watch — and the workers the move ends beside it are not."""
    o, cloud = started()
    try:
        a, b = o.fleet.workers()
        now = time.time()
        o.recovery.notice([draining(a, now + 30)], now)
        o.fleet.end_all("migrated")
        assert o.journal.preemptions == 1 and o.fleet.noticed == {}
        [ev] = [e for e in o.journal.events if e["event"] == "preempted"]
        assert ev["instance_id"] == a.instance_id and ev["ended_by"] == "migrated"
        assert end_reason(a.instance_id) == "preempted (migrated)" and end_reason(b.instance_id) == "migrated"
        assert any(k.region == a.region for k in o.watch.spot_lost_t)
    finally:
        o.fleet.teardown()


@pytest.mark.parametrize("end", ["budget", "teardown"])
def test_the_runs_own_end_of_a_noticed_worker_is_not_a_preemption(end):
    """The run is over (the budget's hard stop, the teardown): every node goes because of that, a
    noticed one too; nothing is counted."""
    o, cloud = started()
    a, _ = o.fleet.workers()
    now = time.time()
    o.recovery.notice([draining(a, now + 30)], now)
    if end == "budget":
        o.fleet.end_all("budget")
    o.fleet.teardown()
    assert o.journal.preemptions == 0 and "preempted" not in kinds(o)
    assert end_reason(a.instance_id) == end


def started_in_two_regions(monkeypatch):
    """As :func:`started`, on a cloud with two regions of the plan (the emulated AWS e2e's shape):
    a head and two spot workers in the plan's first region; :meth:`Orchestrator.migrate` records
    what it was asked instead of moving."""
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")     # AWS nodes' identity for s3://
    cloud = FakeCloud("aws")
    task = spec(resources={"accelerators": "A100:8", "nodes": 2, "market": "spot", "clouds": ["aws"],
                           "regions": ["us-east-1", "us-west-2"]},
                training={"steps": 10, "batch_size": 16, "checkpoint": {"storage": "s3://bucket/ckpt"}})
    o = Orchestrator(task, LaunchOptions(), factories=Factories(cloud=lambda name: cloud))
    assert len(o.sites) == 2
    o.row.record("running")
    first = o.plan.chosen.offer
    [head] = cloud.launch(LaunchRequest(cluster_id=o.cluster_id, job_id=o.job_id,
                                        offer=cloud.head_offer(first.region, first.zone), role="head"))
    o.fleet.adopt(head)
    o.fleet.head = head
    o.driver.started = time.time()
    moves: list = []
    o.migrate = lambda cmd, now: moves.append(cmd)          # type: ignore[method-assign]
    o.top_up(time.time())
    assert len(o.fleet.workers()) == 2
    return o, cloud, moves


def test_a_capacity_error_at_the_notice_does_not_move_the_job_before_the_noticed_node_is_gone(monkeypatch):
    """The emulated AWS e2e's finding: at the notice the victim's region runs out of spot, so the
    replacement asked for at the notice meets a capacity error in every offer of that region. The
    noticed worker still runs and checkpoints: the job waits for it (one ``waiting`` event saying
    why) rather than moving at once, which had ended the noticed node uncounted. Once its cloud has
    taken it — a preemption, counted — the capacity move goes as before issue 51."""
    o, cloud, moves = started_in_two_regions(monkeypatch)
    try:
        a, b = o.fleet.workers()
        here = o.fleet.site()
        cloud.spot_out |= {x.zone for x in o.plan.offers if x.region == a.region}   # the region is out of spot
        now = time.time()
        o.recovery.notice([draining(a, now + 30)], now)
        o.top_up(now)                                             # the replacement at the notice: refused
        assert any(e["event"] == "capacity_error" for e in o.journal.events) and "no_capacity" in kinds(o)
        o.top_up(now + 1)
        o.top_up(now + 2)
        assert moves == [] and a.instance_id in o.fleet.nodes and a.instance_id in o.fleet.noticed
        [wait] = [e for e in o.journal.events if e["event"] == "waiting"]          # said once, with why
        assert "interruption notice" in wait["reason"] and "no spot capacity" in wait["reason"]
        cloud.reclaim(a.instance_id)                              # the cloud takes it at its deadline
        o.check_nodes()
        assert o.journal.preemptions == 1 and end_reason(a.instance_id) == "gone"
        o.top_up(time.time())                                     # gone: the capacity move, as before
        [mig] = moves
        assert mig.target != here and mig.market == "spot" and "no spot capacity" in mig.reason
        order = kinds(o)
        assert order.index("node_notice") < order.index("capacity_error") < order.index("preempted")
    finally:
        o.fleet.teardown()


def steering_view(**over):
    """A recorded view: a cluster up at HERE, another site of the plan that is cheaper, one worker missing."""
    from spotwise.engine.run.steering import View
    from spotwise.policies.base import Observation

    o = dict(elapsed_h=1.0, deadline_h=100.0, task_h=1.0, work_done_h=1.0, restart_h=0.0, tick_h=0.001,
             spot_price={HERE: 3.0, THERE: 1.0}, on_demand_price={HERE: 9.0, THERE: 8.0})
    data = dict(obs=Observation(**o), here=HERE, sites=(HERE, THERE), missing=1, current="spot",
                worker_markets=("spot",), fixed_market=None, blocked=frozenset({(HERE, "spot")}),
                spot_refused=True, stopping=False, draining=False, migrations=0, cluster_up=True)
    return View(**(data | over))


HERE, THERE = "aws/us-east-1", "aws/us-west-2"


def test_steering_never_moves_the_job_while_every_missing_worker_is_still_up_under_notice():
    """:meth:`Steering.replace` and :meth:`Steering.consult` on recorded views: a site out of the
    run's market with workers missing moves the job — unless every missing worker is one still up
    under an interruption notice (``View.noticed``): then a wait that says why, announced once; the
    same view without the notice (the node gone), or with another worker gone too, moves as before."""
    from spotwise.engine.run.steering import Migrate, Steering, Wait
    from spotwise.policies.base import Decision

    def steering():
        return Steering(Stub(), "stub", transfer_read_usd=lambda site: 0.0)  # type: ignore[arg-type]

    class Stub:
        def decide(self, obs):
            return Decision("spot", THERE)

    s = steering()
    first = s.replace(steering_view(noticed=1, fixed_market="spot"))
    again = s.replace(steering_view(noticed=1, fixed_market="spot"))
    assert isinstance(first, Wait) and first.announce and isinstance(again, Wait) and not again.announce
    assert first.missing == 1 and "interruption notice" in first.reason and "no spot capacity" in first.reason
    gone = steering().replace(steering_view(noticed=0, fixed_market="spot"))
    assert isinstance(gone, Migrate) and gone.target == THERE
    assert isinstance(steering().replace(steering_view(missing=2, noticed=1, fixed_market="spot")), Migrate)
    # the periodic question: the policy naming another site is no move out of a site without capacity
    # while the missing worker is still up (and here no move pays: no work is left to save on)
    _, cmd = steering().consult(steering_view(noticed=1))
    assert not isinstance(cmd, Migrate)
    _, cmd = steering().consult(steering_view(noticed=0))
    assert isinstance(cmd, Migrate) and cmd.target == THERE


def test_a_noticed_worker_gone_before_its_deadline_is_a_preemption_whatever_its_cloud_says_of_it():
    """A Slurm job ends itself once the notice's checkpoint is committed (its batch script's
    ``scancel``: Slurm then says CANCELLED, not PREEMPTED); a node that goes while under its
    interruption notice is the preemption that notice announced, on every cloud."""
    o, cloud = started()
    try:
        a, b = o.fleet.workers()
        cloud.was_preempted = lambda node: False          # the cloud's own account: not a preemption
        now = time.time()
        o.recovery.notice([draining(a, now + 30)], now)
        o.top_up(now)
        cloud.reclaim(a.instance_id)
        cloud.reclaim(b.instance_id)                       # gone without a notice: lost, as before
        o.check_nodes()
        gone = {e["instance_id"]: e["event"] for e in o.journal.events if e["event"] in ("preempted", "lost")}
        assert gone == {a.instance_id: "preempted", b.instance_id: "lost"}
        assert o.journal.preemptions == 1 and o.journal.lost_nodes == 2 and o.fleet.noticed == {}
    finally:
        o.fleet.teardown()
