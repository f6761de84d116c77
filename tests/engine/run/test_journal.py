"""What a run records (:mod:`spotwise.engine.run.journal`): events, the job row, the final status and
the report's keys — the public contract docs/orchestrator.md lists."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from spotwise.engine.state import db
from spotwise.engine.run.journal import Journal, JobRow, lost_steps, outcome, report
from spotwise.engine.plan.planner import make_plan
from spotwise.provisioner.failover import Attempt
from spotwise.taskspec import parse_taskspec

SPEC = parse_taskspec({"name": "j", "resources": {"nodes": 2}, "training": {"steps": 10}})

# docs/orchestrator.md, "Report (--format json)"
REPORT_KEYS = {
    "job_id", "cluster_id", "cloud", "region", "status", "message", "steps_total", "steps_completed", "preemptions",
    "lost_nodes", "resumes", "lost_steps", "checkpoint_interval", "cost_usd", "cost_by_item", "budget_usd",
    "hours_by_market",
    "final_checkpoint", "model_sha256", "precision", "storage", "policy", "spot_history", "spot_probes", "plan",
    "attempts", "moves", "migrations", "cloud_used", "checkpoint_window", "restart_seconds", "checkpoints",
    "resume_points", "events", "loss", "eval_loss", "stop_guarantee", "interrupted", "resumed",
}


def row(job_id: str = "job-1") -> JobRow:
    return JobRow(job_id=job_id, spec=SPEC, clouds=["local"], cluster_id="sw1", budget_usd=5.0)


def result(**over):
    data = dict(steps_completed=10, final_checkpoint="file:///c/10", model_sha256="abc", stopped=None, error=None,
                precision="fp32", checkpoint_window=None)
    data.update(over)
    return SimpleNamespace(**data)


def test_an_event_is_kept_stored_and_printed_when_asked(database, capsys):
    row().record("running")
    j = Journal("job-1", progress=True)
    j.event("launched", instance_id="i-1", cloud="local")
    [ev] = j.events
    assert ev["event"] == "launched" and ev["instance_id"] == "i-1" and ev["t"] > 0
    with db.session() as s:
        [stored] = s.scalars(select(db.Event).where(db.Event.job_id == "job-1")).all()
    assert stored.kind == "launched" and stored.detail == {"instance_id": "i-1", "cloud": "local"}
    assert "] launched worker i-1\n" in capsys.readouterr().err       # a sentence (engine.sentences)
    Journal("job-1").event("quiet")
    assert capsys.readouterr().err == ""


def test_an_event_the_database_refuses_is_logged_not_fatal(database, caplog, monkeypatch):
    def down():
        raise OSError("database is gone")

    monkeypatch.setattr(db, "session", down)
    j = Journal("job-1")
    with caplog.at_level(logging.ERROR, logger="spotwise.orchestrator"):
        j.event("launched")
    assert [e["event"] for e in j.events] == ["launched"] and "could not record event launched" in caplog.text


def test_attempts_moves_and_migrations_go_into_the_report_lists_with_their_events(database):
    row().record("running")
    j = Journal("job-1")
    j.saw_attempts([Attempt(offer_key="a/spot", outcome="capacity", message="none"),
                    Attempt(offer_key="a/spot", outcome="cached"),
                    Attempt(offer_key="b/on-demand", outcome="launched", nodes=2)])
    assert j.attempts == [{"offer": "a/spot", "outcome": "capacity", "nodes": 0, "message": "none"},
                          {"offer": "b/on-demand", "outcome": "launched", "nodes": 2, "message": ""}]
    assert [(e["event"], e["offer"]) for e in j.events] == [("capacity_error", "a/spot")]
    j.moved({"t": 1.0, "from": "spot", "to": "on-demand", "reason": "r", "step": 3})
    j.migrated({"t": 2.0, "from": "aws/a", "to": "aws/b", "market": "spot", "reason": "r", "step": 4})
    assert j.moves[0]["t"] == 1.0 and j.migrations[0]["to"] == "aws/b"
    move, migrated = j.events[1:]
    assert move["event"] == "move" and "t" in move and move["from"] == "spot" and move["step"] == 3
    assert migrated["event"] == "migrated" and migrated["market"] == "spot"
    j.events += [{"event": "launched", "cloud": "aws"}, {"event": "launched", "cloud": "gcp"},
                 {"event": "launched", "cloud": "aws"}]
    assert j.clouds_used() == ["aws", "gcp"]


def test_the_job_row_is_written_running_then_with_its_outcome(database):
    r = row()
    r.record("running")
    with db.session() as s:
        job = s.get(db.Job, "job-1")
        assert (job.status, job.name, job.cloud, job.cluster_id, job.budget_usd) == ("running", "j", "local", "sw1", 5.0)
        assert job.spec["name"] == "j" and job.finished_at is None and job.report is None
    final = {"cloud": "local", "steps_completed": None, "preemptions": 1, "resumes": 2, "final_checkpoint": "c",
             "model_sha256": "x", "message": "m"}
    r.record("succeeded", final)
    with db.session() as s:
        job = s.get(db.Job, "job-1")
        assert (job.status, job.steps_completed, job.preemptions, job.resumes, job.message) == ("succeeded", 0, 1, 2, "m")
        assert job.finished_at is not None and job.report == final


@pytest.mark.parametrize(("res", "stop", "want"), [
    (result(), "budget", "budget_exhausted"),                       # the budget stop wins whatever training said
    (None, None, "failed"),
    (result(error="boom"), None, "failed"),
    (result(stopped="budget"), None, "budget_exhausted"),
    (result(stopped="cancel"), None, "failed"),
    (result(steps_completed=9), None, "failed"),
    (result(), None, "succeeded"),
    (result(), "migrate", "succeeded"),
])
def test_the_outcome_follows_the_stop_then_what_training_returned(res, stop, want):
    status, message = outcome(res, stop_reason=stop, steps=10)
    assert status == want
    assert (message is None) == (want == "succeeded")


def test_a_run_without_a_result_says_what_the_jobs_api_said_of_it():
    assert outcome(None, stop_reason=None, steps=10) == ("failed", "training did not return a result")
    status, message = outcome(None, stop_reason=None, steps=10, note="Ray: exit code 1")
    assert (status, message) == ("failed", "training did not return a result (Ray: exit code 1)")


def test_lost_steps_count_each_resume_and_the_gap_a_migration_left():
    first = {"step": 40, "resumes": [{"from_step": 10, "max_step_before": 14}]}
    second = {"step": 60, "resumes": [{"from_step": 30, "max_step_before": 30}]}
    resumes = first["resumes"] + second["resumes"]
    assert lost_steps([first], first["resumes"]) == 4
    assert lost_steps([first, second], resumes) == 4 + (40 - 30)
    assert lost_steps([first, {}], first["resumes"]) == 4       # a new driver that has not resumed yet


def test_the_report_has_exactly_the_documented_keys(database):
    row().record("running")
    j = Journal("job-1")
    plan = make_plan(SPEC, ["local"])
    drivers = [{"step": 4, "checkpoints": [{"step": 4, "kind": "periodic", "uri": "u4"}]},
               {"step": 10, "resumes": [{"from_step": 4, "max_step_before": 4}], "loss": 0.25,
                "checkpoints": [{"step": 10, "kind": "final", "uri": "u10"}]}]
    rep = report(j, status="succeeded", message=None, result=result(), job_id="job-1", cluster_id="sw1", spec=SPEC,
                 plan=plan, storage="file:///c", budget_usd=5.0, history=None, head=None, drivers=drivers,
                 hours={"spot": 0.5, "on-demand": 0.25}, probes={"asked": 1, "granted": 0, "kept": 0},
                 restart_s=[12.34])
    assert set(rep) == REPORT_KEYS
    assert rep["cloud"] == "local" and rep["plan"]["chosen"] == plan.chosen.offer.key
    assert rep["hours_by_market"] == {"spot": 0.5, "on_demand": 0.25} and rep["restart_seconds"] == [12.3]
    assert rep["checkpoints"] == [{"step": 4, "kind": "periodic"}, {"step": 10, "kind": "final"}]
    assert rep["resumes"] == 1 and rep["lost_steps"] == 0 and rep["cost_usd"] == 0.0
    assert rep["loss"] == 0.25 and rep["stop_guarantee"] == "checkpoint at the stop"
    assert rep["interrupted"] is False and rep["resumed"] == []          # never resumed
    no_result = report(j, status="failed", message="m", result=None, job_id="job-1", cluster_id="sw1", spec=SPEC,
                       plan=plan, storage="file:///c", budget_usd=None, history=None, head=None, drivers=drivers,
                       hours={}, probes={}, restart_s=[])
    assert no_result["steps_completed"] == 10 and no_result["final_checkpoint"] == "u10"
