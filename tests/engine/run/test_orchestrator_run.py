"""Whole runs through :meth:`Orchestrator.run` with recording fakes of the cloud, the head's Jobs API
and control endpoint and the runner's lease (``orchestrator_fakes.py``): no node, no Ray. They check
the wiring the parts' own tests cannot — the lease claimed before the first launch, attached after
each submit, released before the final row; the hard budget stop; a migration; SIGTERM and Ctrl-C
— and that every run ends with every node ended and every bill closed."""

from __future__ import annotations

import itertools
import json

import pytest
from orchestrator_fakes import Control, FakeCloud, Jobs, Lease

from spotwise.engine.state import db
from spotwise.engine.run import signals
from spotwise.engine.run.curves import curves
from spotwise.engine.run.joblogs import lines
from spotwise.engine.run.orchestrator import Factories, LaunchOptions, Orchestrator
from spotwise.engine.run.steering import Migrate, NoOp, Steering
from spotwise.policies.base import Decision
from spotwise.runtime.node.job import RESULT_PREFIX, SNAPSHOT_PREFIX
from spotwise.taskspec import parse_taskspec

pytestmark = pytest.mark.usefixtures("local_home")


def local_task(**over):
    data = {"name": "r", "resources": {"nodes": 2, "market": "spot"}, "training": {"steps": 10}}
    data.update(over)
    return parse_taskspec(data)


def orchestrator(spec, log: list, *, cloud_name: str = "local", jobs: Jobs | None = None,
                 opts: LaunchOptions | None = None) -> tuple[Orchestrator, FakeCloud, Jobs]:
    cloud = FakeCloud(cloud_name, log)
    jobs = jobs or Jobs(log)
    holder: dict = {}
    make = Factories(cloud=lambda name: cloud, lease=lambda job_id, budget: Lease(log, holder["o"].job_id),
                     jobs_client=lambda url, headers: jobs, control=lambda url, token: Control(log, jobs, url))
    o = Orchestrator(spec, opts or LaunchOptions(tick_s=0.01, policy_interval_s=0.05), factories=make)
    holder["o"] = o
    return o, cloud, jobs


def final_row(o: Orchestrator) -> db.Job:
    with db.session() as s:
        return s.get(db.Job, o.job_id)


def everything_ended(o: Orchestrator, cloud: FakeCloud) -> None:
    assert cloud.live == {} and o.fleet.nodes == {} and o.purse.ledger.open_ids() == []
    with db.session() as s:
        rows = s.query(db.NodeRecord).filter_by(job_id=o.job_id).all()
    assert rows and all(r.terminated_at is not None for r in rows)


def test_a_run_holds_the_lease_before_launching_attaches_it_after_submit_and_releases_it_before_the_final_row():
    log: list = []
    o, cloud, jobs = orchestrator(local_task(), log)
    rep = o.run()
    assert rep["status"] == "succeeded" and rep["steps_completed"] == 10 and rep["preemptions"] == 0
    first_launch = next(i for i, x in enumerate(log) if x[0] == "launch")
    submit = log.index(("submit", f"spotwise-{o.job_id}"))
    assert log[:2] == [("lease", "claim"), ("lease", "start")] and first_launch > 1
    [attach] = [i for i, x in enumerate(log) if x[:2] == ("lease", "attach")]
    assert attach == submit + 1 and log[attach][2] == "http://10.0.0.1:8266"        # the head's control endpoint
    stop = next(i for i, x in enumerate(log) if x[:2] == ("lease", "stop"))
    assert log[stop] == ("lease", "stop", "running")             # released before the final status is written
    assert stop > log.index(("cleanup", o.cluster_id))           # after the teardown
    assert final_row(o).status == "succeeded" and final_row(o).report["status"] == "succeeded"
    kinds = [e["event"] for e in rep["events"]]
    assert kinds[:5] == ["plan", "launched", "launched", "launched", "submitted"] and "deleted" in kinds
    assert rep["cloud_used"] == ["local"] and rep["attempts"][0]["outcome"] == "launched"
    everything_ended(o, cloud)
    # the job's own output was read from the control endpoint as it ran, in order, and copied to storage
    assert [(r["rank"], r["node"], r["line"]) for r in lines(o.job_id)] == [(r, n, text) for r, n, _, text in Control.OUTPUT]
    assert rep["output"].endswith(f"/{o.job_id}/logs/output.jsonl") and "output_tail" not in rep
    # the live display's last view (issue 33): from the last tick, while the nodes still ran
    p = o.progress
    assert (p.steps_total, p.budget_usd) == (10, o.budget) and p.step is not None and 0 < p.step <= 10, p
    assert sum(count for _, _, count in p.nodes) == 3 and {m for m, _, _ in p.nodes} <= {"spot", "on-demand"}, p


def test_the_hard_budget_stop_ends_every_node_at_once_and_the_run_is_budget_exhausted():
    log: list = []
    o, cloud, jobs = orchestrator(local_task(budget_usd=1.0), log)
    o.purse.ledger.spend = lambda now=None: 0.9999           # what is left lasts less than the margin
    rep = o.run()
    assert rep["status"] == "budget_exhausted" and o.stop.reason == "budget" and o.purse.hard_stopped
    kinds = [e["event"] for e in rep["events"]]
    assert kinds.index("budget_stop_requested") < kinds.index("budget_hard_stop")
    ends = [x for x in log if x[0] == "terminate"]
    assert len(ends[0][1]) == 3                                   # the hard stop: all three at once
    assert ("request_stop", "budget") in log
    everything_ended(o, cloud)


class StopsAtACheckpoint(Jobs):
    """A head whose training runs until asked to stop, then saves a ``stop`` checkpoint in the run's
    storage and ends, as the real job driver does: the job succeeds and its result says why it
    stopped."""

    def get_job_status(self, sid: str) -> str:
        self.polls += 1
        return "JobStatus.SUCCEEDED" if self.stop_requested else "JobStatus.RUNNING"

    def get_job_logs(self, sid: str) -> str:
        uri = "s3://ckpt/runs/r/checkpoints/000004"
        result = {"steps_completed": 4, "final_checkpoint": uri, "model_sha256": None, "stopped": "budget"}
        snap = {"step": 4, "started_at": 1.0, "checkpoints": [{"step": 4, "kind": "stop", "uri": uri}]}
        return f"{SNAPSHOT_PREFIX}{json.dumps(snap)}\n{RESULT_PREFIX}{json.dumps(result)}\n"


def test_the_budget_stop_asks_training_to_stop_at_a_checkpoint_and_the_run_is_budget_exhausted():
    """A billing minute ahead of the cap (not yet at the hard margin): training is asked once to
    stop at a checkpoint, the run ends ``budget_exhausted`` with that checkpoint to resume from,
    within the budget, and every node is ended (was an end-to-end run on the local cloud)."""
    log: list = []
    o, cloud, jobs = orchestrator(local_task(budget_usd=1.0), log, jobs=StopsAtACheckpoint(log))
    o.purse.ledger.spend = lambda now=None: 0.98             # a minute more would pass $1, 13 s would not
    rep = o.run()
    assert rep["status"] == "budget_exhausted" and not o.purse.hard_stopped, rep["message"]
    assert [x for x in log if x[0] == "request_stop"] == [("request_stop", "budget")]
    assert rep["final_checkpoint"] == "s3://ckpt/runs/r/checkpoints/000004"
    assert rep["checkpoints"][-1]["kind"] == "stop" and 0 < rep["steps_completed"] < 10
    assert "budget_hard_stop" not in [e["event"] for e in rep["events"]]
    everything_ended(o, cloud)
    # the run's curves were sampled as it went, the last point when it ended, the stop marked
    c = curves(o.job_id)
    assert c["budget_usd"] == 1.0 and c["points"][-1]["step"] == 4 and c["points"][-1]["spend_usd"] == 0.98
    [mark] = c["marks"]
    assert mark["kind"] == "budget_stop_requested" and 0 < mark["step"] <= 4     # the step reached then


class MigrateOnce(Steering):
    """The policy's answer, once training runs: move the whole job to ``target`` (once)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.target, self.asked = "", itertools.count()

    def consult(self, view):
        if next(self.asked) == 0:
            return Decision("spot", self.target), Migrate(self.target, "spot", "test: move")
        return Decision("spot"), NoOp()


def test_a_migration_stops_at_a_checkpoint_ends_the_cluster_resubmits_and_reattaches_the_lease(monkeypatch):
    monkeypatch.setenv("SPOTWISE_AWS_INSTANCE_PROFILE", "spotwise-node")     # AWS nodes' identity for s3://
    log: list = []
    spec = parse_taskspec({"name": "m", "resources": {"accelerators": "A100:8", "nodes": 1, "market": "auto",
                                                      "clouds": ["aws"], "regions": ["us-east-1", "us-west-2"]},
                           "training": {"steps": 10, "checkpoint": {"storage": "s3://bucket/ckpt"}}})
    o, cloud, jobs = orchestrator(spec, log, cloud_name="aws")
    assert len(o.sites) == 2
    here = o.fleet.site()
    target = next(s for s in o.sites if s != here)
    steer = MigrateOnce(o.steering.policy, o.steering.policy_name, transfer_read_usd=lambda site: 0.0,
                        interval_s=o.opts.policy_interval_s)
    steer.target = target
    o.steering = steer
    rep = o.run()
    assert rep["status"] == "succeeded", rep["message"]
    [mig] = rep["migrations"]
    assert (mig["from"], mig["to"], mig["market"], mig["reason"]) == (here, target, "spot", "test: move")
    kinds = [e["event"] for e in rep["events"]]
    assert kinds.index("migrate_requested") < kinds.index("migrated")
    assert ("request_stop", "migrate") in log                    # every worker was up: a stop checkpoint
    attaches = [x for x in log if x[:2] == ("lease", "attach")]
    assert len(attaches) == 2 and attaches[0][2] != attaches[1][2]   # the new head's endpoint, at once
    ended_old = next(i for i, x in enumerate(log) if x[0] == "terminate")
    assert log.index(attaches[1]) > ended_old
    assert o.stop.reason is None and len(o.driver.past) == 1
    assert rep["cloud"] == "aws" and rep["region"] == target.split("/")[1]
    everything_ended(o, cloud)


@pytest.mark.parametrize(("interrupt", "graceful"), [(signals.Terminated(), False), (KeyboardInterrupt(), True)])
def test_sigterm_ends_at_once_and_ctrl_c_stops_at_a_checkpoint(interrupt, graceful):
    log: list = []
    o, cloud, jobs = orchestrator(local_task(), log)
    calls = itertools.count()

    def poll():
        if next(calls) == 3:
            raise interrupt
        return None

    o.driver.poll = poll
    rep = o.run()
    assert rep["status"] == "cancelled"
    assert (("request_stop", "cancel") in log) is graceful
    assert ("ended without a final checkpoint" in rep["message"]) is not graceful
    assert o.stop.reason == ("cancel" if graceful else None)
    assert final_row(o).status == "cancelled"
    everything_ended(o, cloud)


def test_an_unexpected_error_is_reraised_after_the_final_row_and_the_teardown():
    log: list = []
    o, cloud, jobs = orchestrator(local_task(), log)

    def broken(now):
        raise ZeroDivisionError("a bug")

    o.top_up = broken
    with pytest.raises(ZeroDivisionError):
        o.run()
    assert final_row(o).status == "failed" and "ZeroDivisionError: a bug" in final_row(o).message
    everything_ended(o, cloud)


class UserCodeFails(Jobs):
    """A head whose training gave up on user code (``runtime.trainer``: the group after the last
    allowed attempt returns the error, with the traceback's tail): the job fails and its result
    carries that error."""

    TAIL = 'Traceback (most recent call last):\n  File "/w/pkg/train.py", line 9, in batch_fn\nValueError: bad batch at step 5\n'

    def get_job_status(self, sid: str) -> str:
        self.polls += 1
        return "JobStatus.RUNNING" if self.polls <= self.runs else "JobStatus.FAILED"

    def get_job_logs(self, sid: str) -> str:
        error = ("user code failed in 2 attempt(s) (training.max_restarts_on_errors: 1): TrainSpec.batch_fn raised "
                 f"ValueError: bad batch at step 5\n{self.TAIL}")
        result = {"steps_completed": 0, "final_checkpoint": None, "model_sha256": None, "error": error}
        snap = {"step": 4, "started_at": 1.0, "checkpoints": [], "user_errors": [{"rank": 0}, {"rank": 1}]}
        return f"{SNAPSHOT_PREFIX}{json.dumps(snap)}\n{RESULT_PREFIX}{json.dumps(result)}\n"


def test_user_code_that_gave_up_fails_the_run_with_its_traceback_and_ends_every_node():
    log: list = []
    spec = parse_taskspec({"name": "r", "resources": {"nodes": 2, "market": "spot"},
                           "training": {"entrypoint": "json:loads", "max_restarts_on_errors": 1}})
    o, cloud, jobs = orchestrator(spec, log, jobs=UserCodeFails(log))
    rep = o.run()
    assert rep["status"] == "failed" and rep["preemptions"] == 0
    assert rep["message"].startswith("user code failed in 2 attempt(s)") and UserCodeFails.TAIL in rep["message"]
    assert final_row(o).status == "failed" and UserCodeFails.TAIL in final_row(o).message
    assert not [x for x in log if x[0] == "submit"][1:]          # not retried as if it were a preemption
    everything_ended(o, cloud)
    # what the job wrote to stderr last (a user's traceback, whoever printed it) is in the report
    assert rep["output_tail"] == ["Traceback (most recent call last):", "ValueError: bad batch"]
