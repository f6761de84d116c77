"""``spotwise status JOB``: the job's row and its events in words; ``--details`` adds the whole
report (what ``spotwise launch`` leaves out of its summary); ``--format json`` is unchanged
without ``--details``."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from spotwise.cli import app
from spotwise.engine.run.journal import JobRow, Journal
from spotwise.taskspec import parse_taskspec

SPEC = parse_taskspec({"name": "j", "resources": {"nodes": 2}, "training": {"steps": 10}})
REPORT = {"job_id": "job-1", "cloud": "local", "status": "succeeded", "message": None, "steps_completed": 10,
          "preemptions": 1, "resumes": 1, "final_checkpoint": "file:///c/10", "model_sha256": "abc",
          "plan": {"chosen": "local/local/local-a/local.cpu1/spot", "expected_cost_usd": 0.01},
          "attempts": [{"offer": "local/local/local-a/local.cpu1/spot", "outcome": "launched", "nodes": 2}],
          "resume_points": [{"from_step": 4, "max_step_before": 6}], "events": []}


def finished_job() -> None:
    row = JobRow(job_id="job-1", spec=SPEC, clouds=["local"], cluster_id="sw1", budget_usd=5.0)
    row.record("running")
    Journal("job-1").event("preempted", instance_id="sw8bdad92744-worker-e296d7", market="spot", zone="local-a")
    row.record("succeeded", REPORT)


def status(*args: str):
    r = CliRunner().invoke(app, ["status", *args])
    return r.exit_code, r.output


def test_status_job_says_the_events_in_words_and_details_shows_the_whole_report(database):
    finished_job()
    code, out = status("job-1")
    assert code == 0 and "preempted: spot worker sw...-e296d7 in local-a" in out and "{'" not in out
    assert "resume_points" not in out and "attempts" not in out           # the report stays in --details
    code, out = status("job-1", "--details")
    assert code == 0 and "report of job-1" in out
    for key in ("plan", "attempts", "resume_points", "local/local/local-a/local.cpu1/spot"):
        assert key in out, key
    assert "preempted: spot worker sw...-e296d7 in local-a" in out


def test_status_json_is_unchanged_without_details_and_carries_the_report_with_it(database):
    finished_job()
    code, out = status("job-1", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and "report" not in doc and doc["events"][0]["event"] == "preempted"
    code, out = status("job-1", "--details", "--format", "json")
    assert json.loads(out)["report"]["resume_points"] == REPORT["resume_points"]


def test_details_needs_a_job(database):
    from spotwise.errors import InputError

    r = CliRunner().invoke(app, ["status", "--details"])      # the CLI's main() makes it exit 2
    assert isinstance(r.exception, InputError) and "--details" in str(r.exception)
