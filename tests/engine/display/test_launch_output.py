"""``spotwise launch``'s output around a run (the run itself faked): the table format ends with the
summary (:mod:`spotwise.engine.display.summary`), ``--format json`` prints the report as it is."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from spotwise.cli import app
from spotwise.engine.run.orchestrator import Orchestrator

EXAMPLE = str(Path(__file__).resolve().parents[3] / "examples" / "tiny-gpt.yaml")
REPORT = {"job_id": "tiny-gpt-1", "status": "succeeded", "message": None, "steps_total": 200,
          "steps_completed": 200, "preemptions": 1, "resumes": 1, "lost_steps": 7, "cost_usd": 0.032,
          "budget_usd": 1.0, "hours_by_market": {"spot": 0.03, "on_demand": 0.0}, "final_checkpoint": "file:///c/200",
          "plan": {"chosen": "local/local/local-a/local.cpu1/spot", "expected_cost_usd": 0.0344, "reason": "r"},
          "attempts": [{"offer": "local/local/local-a/local.cpu1/spot", "outcome": "launched"}],
          "events": [{"t": 1.0, "event": "plan"}, {"t": 2.0, "event": "deleted", "what": "x"}]}


def launch(monkeypatch, *args: str):
    monkeypatch.setattr(Orchestrator, "run", lambda self: dict(REPORT))
    return CliRunner().invoke(app, ["launch", EXAMPLE, *args])


def test_the_table_format_ends_with_the_summary(database, monkeypatch):
    r = launch(monkeypatch)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("job:        tiny-gpt-1: succeeded") and len(lines) <= 15
    assert all(len(line) <= 80 for line in lines)
    assert "as estimated by planning the task on on-demand only" in " ".join(r.output.split())
    assert "attempts" not in r.output and "{" not in r.output            # the rest is --details' and json's
    assert "\x1b" not in r.output            # off a terminal: no live display, no control code (issue 33)


def test_json_prints_the_report_unchanged(database, monkeypatch):
    r = launch(monkeypatch, "--format", "json")
    assert r.exit_code == 0 and json.loads(r.output) == REPORT
