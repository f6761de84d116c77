"""``spotwise simulate --history-hours H``: the policy is first shown H hours of each zone's past."""

from __future__ import annotations

import json

import numpy as np

from spotwise.cli import main
from spotwise.policies.sim.evaluate import evaluate, summarise
from spotwise.policies.sim.simulator import SimConfig
from spotwise.policies.traces import builtin_traces_dir, load_traces

TRACE = str(builtin_traces_dir() / "aws-1node-avail-2022-10-26" / "aws_us-west-2a_v100_8_2022-10-26.json")
ARGS = ["simulate", "--trace", TRACE, "--policy", "spotwise", "--task-hours", "12", "--deadline-hours", "16",
        "--restart-hours", "0.2", "--starts", "12", "--seed", "3", "--format", "json"]


def _json(capsys, *extra: str) -> dict:
    assert main([*ARGS, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_history_hours_reaches_evaluate_and_the_output(capsys) -> None:
    plain = _json(capsys)
    zero = _json(capsys, "--history-hours", "0")
    week = _json(capsys, "--history-hours", "168")
    assert "history_hours" not in plain and zero == plain
    assert week["history_hours"] == 168.0
    cfg = SimConfig(task_h=12, deadline_h=16, restart_h=0.2)
    want = summarise("spotwise", evaluate("spotwise", load_traces([TRACE]), cfg, starts=12, seed=3,
                                          history_h=168.0), cfg)
    assert {k: v for k, v in week.items() if k != "history_hours"} == json.loads(json.dumps(want))
    assert week["mean_cost_usd"] != plain["mean_cost_usd"]   # this trace's history does change spotwise


def test_history_hours_in_the_table_title(capsys) -> None:
    assert main([*ARGS[:-2], "--history-hours", "24"]) == 0
    assert "24.0 h of history" in capsys.readouterr().out


def test_negative_history_hours_is_an_input_error(capsys) -> None:
    assert main([*ARGS, "--history-hours", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--history-hours" in err and "Traceback" not in err


def test_history_hours_with_multi_region_is_refused_by_name(capsys) -> None:
    other = str(builtin_traces_dir() / "aws-1node-avail-2022-10-26" / "aws_us-west-2b_v100_8_2022-10-26.json")
    multi = ["simulate", "--trace", TRACE, other, "--policy", "spotwise", "--task-hours", "4", "--deadline-hours",
             "6", "--restart-hours", "0.2", "--starts", "3", "--multi-region", "--format", "json"]
    assert main([*multi, "--history-hours", "24"]) == 2
    err = capsys.readouterr().err
    assert "--history-hours" in err and "--multi-region" in err and "Traceback" not in err
    assert main([*multi, "--history-hours", "0"]) == 0     # 0 is the default: allowed
    assert np.isfinite(json.loads(capsys.readouterr().out)["mean_cost_usd"])
