"""The end of ``spotwise launch`` in the table format (:mod:`spotwise.engine.display.summary`): at most
15 lines of at most 80 columns that say the status and why, the steps, the wall time, the cost
against the budget and against on-demand only, what spot cost, and the final checkpoint."""

from __future__ import annotations

import copy

from spotwise.engine.plan.planner import make_plan
from spotwise.engine.display.summary import MAX_LINES, WIDTH, duration, on_demand_reference, summary_lines
from spotwise.taskspec import parse_taskspec

T = 1_700_000_000.0
# a report as `spotwise launch examples/tiny-gpt.yaml --format json` writes it (one preemption),
# trimmed of nothing the summary reads
REPORT = {
    "job_id": "tiny-gpt-20261127-114203-5d1e0a", "cluster_id": "sw8bdad92744", "cloud": "local", "region": "local",
    "status": "succeeded", "message": None, "steps_total": 200, "steps_completed": 200, "loss": 2.3113,
    "preemptions": 1, "lost_nodes": 1, "resumes": 1, "lost_steps": 7, "checkpoint_interval": 20,
    "cost_usd": 0.031962, "budget_usd": 1.0, "hours_by_market": {"spot": 0.0291, "on_demand": 0.0},
    "final_checkpoint": "file:///home/u/.spotwise/checkpoints/tiny-gpt-20261127-114203-5d1e0a/step-00000200",
    "model_sha256": "9f2c" * 16, "precision": "fp32", "storage": "file:///home/u/.spotwise/checkpoints",
    "policy": "spot-fallback", "spot_history": None, "spot_probes": {"asked": 0, "granted": 0, "kept": 0},
    "plan": {"chosen": "local/local/local-a/local.cpu1/spot", "expected_hours": 0.01679,
             "expected_cost_usd": 0.034356, "reason": "lowest expected total cost among 2 offers on local"},
    "attempts": [{"offer": "local/local/local-a/local.cpu1/spot", "outcome": "launched", "nodes": 2, "message": ""}],
    "moves": [], "migrations": [], "cloud_used": ["local"], "restart_seconds": [21.4], "checkpoint_window": None,
    "stop_guarantee": "checkpoint at the stop",
    "checkpoints": [{"step": s, "kind": "periodic"} for s in range(20, 201, 20)],
    "resume_points": [{"from_step": 86, "max_step_before": 93}],
    "events": [{"t": T, "event": "plan"}, {"t": T + 131.0, "event": "deleted", "what": "metadata server"}],
}
ON_DEMAND = {"cost_usd": 0.103667, "hours": 0.01667, "source": "planning the task on on-demand only",
             "offer": "2 x local.cpu1 on-demand in local-a"}


def check_shape(lines: list[str]) -> str:
    assert 0 < len(lines) <= MAX_LINES, lines
    assert all(len(line) <= WIDTH for line in lines), [line for line in lines if len(line) > WIDTH]
    text = "\n".join(lines)
    assert "{" not in text and "\x1b" not in text, text
    return " ".join(text.split())          # the words, whatever the wrapping


def test_a_finished_run_in_fifteen_lines_of_eighty_columns():
    text = check_shape(summary_lines(REPORT, on_demand=ON_DEMAND, wall_s=152.4))
    assert "tiny-gpt-20261127-114203-5d1e0a: succeeded" in text
    assert "200/200 trained, last loss 2.311" in text
    assert "2 min 32 s" in text
    assert "$0.0320 of the $1.00 budget (3%)" in text
    assert "$0.1037 expected for the same run on on-demand only" in text
    assert ("on on-demand only: 2 x local.cpu1 on-demand in local-a over 0.0167 h, as estimated by planning the "
            "task on on-demand only") in text                                              # and where it comes from
    assert "saving: $0.0717 (69%) against on-demand only" in text
    assert "1 preemption, 1 resume, 7 steps trained twice" in text
    assert "step-00000200" in text
    assert f"spotwise status {REPORT['job_id']} --details" in text


def test_wall_time_from_the_events_when_not_timed():
    assert "wall time: 2 min 11 s" in check_shape(summary_lines(REPORT, on_demand=ON_DEMAND))
    assert duration(42.4) == "42 s" and duration(7530) == "2 h 05 min"


def test_a_stopped_run_says_why_and_compares_pro_rata():
    rep = copy.deepcopy(REPORT)
    rep.update(status="budget_exhausted", steps_completed=93, budget_usd=0.02, cost_usd=0.0199, preemptions=2,
               message="stopped before the next billing minute would pass the budget; resumable from the final "
                       "checkpoint " + "and a long tail of words " * 20,
               final_checkpoint="s3://a-bucket-with-a-long-name/" + "deep/" * 30 + "step-00000093")
    text = check_shape(summary_lines(rep, on_demand=ON_DEMAND, wall_s=61))
    assert "budget_exhausted" in text and "why: stopped before the next billing minute" in text
    assert "93/200 trained" in text and "of the $0.0200 budget (100%)" in text
    assert "pro rata for 93/200 steps: $0.0482" in text and "$0.0283 (59%)" in text
    assert "2 preemptions" in text and "s3://a-bucket-with-a-long-name/" in text


def test_a_run_dearer_than_on_demand_says_so():
    rep = dict(REPORT, cost_usd=0.2)
    assert "saving: none: $0.0963 more than on-demand only would have cost" in check_shape(
        summary_lines(rep, on_demand=ON_DEMAND))


def test_without_a_reference_an_on_demand_plan_compares_with_itself_and_a_spot_one_says_so():
    rep = copy.deepcopy(REPORT)
    rep["plan"]["chosen"] = "aws/us-east-1/us-east-1a/p4d.24xlarge/on-demand"
    text = check_shape(summary_lines(rep))
    assert "$0.0344 expected for the same run" in text and "as estimated by the run's plan" in text
    assert "saving: $0.0024 (7%)" in text
    text = check_shape(summary_lines(dict(rep, hours_by_market={"spot": 0.0, "on_demand": 0.05})))
    assert "saving: none: the run used on-demand nodes only" in text
    text = check_shape(summary_lines(REPORT))
    assert "no on-demand offer to compare with" in text and "saving" not in text
    failed = dict(REPORT, status="failed", message="the Ray head node was lost", steps_completed=0, cost_usd=0.0,
                  budget_usd=None, final_checkpoint=None, events=[])
    text = check_shape(summary_lines(failed, on_demand=ON_DEMAND))
    assert "failed" in text and "the Ray head node was lost" in text and "(no budget)" in text
    assert "no step was trained" in text and "none committed" in text and "wall time: unknown" in text


def test_the_on_demand_reference_comes_from_the_plan_or_a_plan_on_on_demand(home):
    spot = parse_taskspec({"name": "t", "resources": {"nodes": 2, "clouds": ["local"], "market": "spot"},
                           "training": {"steps": 200}})
    plan = make_plan(spot, ["local"])
    ref = on_demand_reference(spot, plan, clouds=["local"], storage=None)
    assert ref is not None and ref["source"] == "planning the task on on-demand only" and ref["cost_usd"] > 0
    assert ref["offer"].startswith("2 x ") and "on-demand" in ref["offer"]
    auto = spot.model_copy(update={"resources": spot.resources.model_copy(update={"market": "auto"})})
    plan = make_plan(auto, ["local"])
    ref2 = on_demand_reference(auto, plan, clouds=["local"], storage=None)
    assert ref2 is not None and ref2["source"] == "the run's plan" and ref2["cost_usd"] == ref["cost_usd"]
    assert on_demand_reference(spot, plan, clouds=["no-such-cloud"], storage=None) is not None   # from the plan
    nothing = make_plan(spot, ["local"])
    assert on_demand_reference(spot, nothing, clouds=["no-such-cloud"], storage=None) is None    # never raises


def test_the_report_the_orchestrator_falls_back_to_still_reads():
    """When building the report failed, the orchestrator records a short one (no plan, no costs)."""
    short = {"job_id": "j-1", "cluster_id": "sw1", "status": "failed", "message": "x; report failed: boom",
             "steps_completed": 0, "preemptions": 0, "resumes": 0, "final_checkpoint": None, "model_sha256": None,
             "cloud": "local", "events": []}
    text = check_shape(summary_lines(short, on_demand=ON_DEMAND, wall_s=3))
    assert "j-1: failed" in text and "report failed: boom" in text and "0/? trained" in text


def test_a_failed_run_points_at_its_output_and_quotes_its_last_line():
    rep = copy.deepcopy(REPORT)
    rep.update(status="failed", message="the training raised: ValueError: bad shape (rank 1)",
               output_tail=["Traceback (most recent call last):", '  File "regress/train.py", line 9, in step',
                            "ValueError: bad shape", ""])
    lines = summary_lines(rep, on_demand=ON_DEMAND, wall_s=60.0)
    text = check_shape(lines)
    assert f"spotwise logs {rep['job_id']}; its last line: ValueError: bad shape" in text
    assert lines[-1].endswith(f"spotwise status {rep['job_id']} --details")       # still the last line
    assert "spotwise logs" not in check_shape(summary_lines(REPORT, on_demand=ON_DEMAND, wall_s=1.0))


def test_the_held_out_loss_is_in_the_summary_and_merged_over_clusters_by_step():
    from spotwise.engine.run.journal import eval_losses

    drivers = [{"eval_loss": [{"step": 0, "loss": 5.7, "train_loss": None}, {"step": 100, "loss": 4.0}]},
               {"eval_loss": [{"step": 100, "loss": 3.9, "train_loss": 3.8}, {"step": 200, "loss": 3.1}]}]
    merged = eval_losses(drivers)
    assert merged == [{"step": 0, "loss": 5.7, "train_loss": None}, {"step": 100, "loss": 3.9, "train_loss": 3.8},
                      {"step": 200, "loss": 3.1, "train_loss": None}]
    text = check_shape(summary_lines({**REPORT, "eval_loss": merged}, on_demand=ON_DEMAND))
    assert "eval loss" in text and "3.1 at step 200 (from 5.7 at step 0)" in text
    assert "eval loss" not in check_shape(summary_lines(REPORT, on_demand=ON_DEMAND))
