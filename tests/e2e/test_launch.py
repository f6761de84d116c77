"""End to end on the local cloud: the README's main job, preempted twice and steered by spotwise,
on a real Ray cluster of local node processes (slow). Ctrl-C: tests/e2e/test_kill_runner.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e.conftest import EXAMPLE, Launch

pytestmark = pytest.mark.slow


def test_main_job_survives_two_preemptions_bitwise_steered_by_spotwise(reference, tmp_path):
    """The main job on spot, preempted twice, ends with the weights of the uninterrupted run.

    It runs as a deadline task with ``market: auto`` and no ``policy``, so the survival-model
    policy steers it live (the default a user gets with a deadline), and every market choice it
    makes carries its own reason. (This was two runs before: the bitwise run under spot-fallback
    and a deadline run; one run proves both, and spot-fallback's choices are held in
    tests/engine.)"""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["resources"]["market"] = "auto"
    spec["deadline_hours"] = 0.2
    task = tmp_path / "deadline.yaml"
    task.write_text(yaml.safe_dump(spec))
    run = Launch(tmp_path, task, "--preempt-at", "4,8", "--storage", f"file://{tmp_path}/ckpt", terminal=True)
    rep = run.report()
    assert rep["status"] == "succeeded", rep
    assert rep["policy"] == "spotwise"
    live_display_was_shown_in_place(run)
    assert rep["steps_completed"] == rep["steps_total"] == reference["steps_total"]
    assert rep["preemptions"] == 2
    assert rep["resumes"] == rep["preemptions"]
    assert rep["lost_steps"] <= rep["checkpoint_interval"]
    assert rep["model_sha256"] == reference["model_sha256"]
    assert rep["hours_by_market"]["spot"] > 0
    kinds = [c["kind"] for c in rep["checkpoints"]]
    assert kinds[-1] == "final"
    assert Path(rep["final_checkpoint"].removeprefix("file://")).exists()
    chosen = [e for e in rep["events"] if e["event"] in ("replaced", "move")]
    assert chosen, [e["event"] for e in rep["events"]]
    # spotwise's own reasons (its rule and numbers), not the orchestrator's "policy X chose Y"
    assert all(e.get("reason") and "chose" not in e["reason"] for e in chosen), chosen
    # spend is in the ledger, at the launch prices, and shows up in the cost report
    env = dict(os.environ, SPOTWISE_HOME=str(tmp_path))
    cr = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "cost-report", "--job", rep["job_id"],
                                    "--format", "json"], capture_output=True, text=True, env=env,
                                   check=True).stdout)
    assert cr["total_usd"] == pytest.approx(rep["cost_usd"], abs=1e-5)
    st = json.loads(subprocess.run([sys.executable, "-m", "spotwise.cli", "status", rep["job_id"], "--format",
                                    "json"], capture_output=True, text=True, env=env, check=True).stdout)
    assert st["status"] == "succeeded" and st["preemptions"] == 2
    # the run's curves were sampled as it went: the plot has the loss up to the last step, the spend up
    # to the cost, and both preemptions marked (issue 33: status --plot)
    plot = tmp_path / "curves.png"
    drawn = subprocess.run([sys.executable, "-m", "spotwise.cli", "status", rep["job_id"], "--plot", str(plot)],
                           capture_output=True, text=True, env=env, check=True).stderr
    assert plot.read_bytes()[:4] == b"\x89PNG", drawn
    cv = json.loads(subprocess.run([sys.executable, "-c", "import json, sys; from spotwise.engine.curves import "
                                    "curves; print(json.dumps(curves(sys.argv[1])))", rep["job_id"]],
                                   capture_output=True, text=True, env=env, check=True).stdout)
    steps = [p["step"] for p in cv["points"] if p["step"] is not None]
    assert steps == sorted(steps) and steps[-1] == rep["steps_total"], steps
    assert cv["points"][-1]["spend_usd"] == pytest.approx(rep["cost_usd"], abs=1e-4)
    assert [m["kind"] for m in cv["marks"]].count("preempted") == 2, cv["marks"]


def live_display_was_shown_in_place(run: Launch) -> None:
    """Issue 33: with stderr a terminal (an 80x24 pty read by a terminal emulator), the run's progress
    was redrawn in place on it — one screen row showed several steps, with cursor-up codes, and no
    update scrolled up as a line of its own — within 80 columns, with the step, loss and spend; stdout
    (``--format json``) is the report alone."""
    tty = run.tty
    assert tty is not None
    assert "\x1b" not in run.out and json.loads(run.out)["job_id"]
    shown = [line for _, line in tty.display_rows]
    assert any(re.fullmatch(r"step \d+/\d+ \| loss \d[\d.e+-]* \| .*\$\d+\.\d+.*", line) for line in shown), shown
    steps_by_row: dict[int, set[str]] = {}
    for row, line in tty.display_rows:
        steps_by_row.setdefault(row, set()).add(line.split()[1])
    assert any(len(steps) >= 3 for steps in steps_by_row.values()), tty.display_rows
    assert re.search(rb"\x1b\[\d*A", bytes(tty.raw))                      # the cursor went back up to redraw
    assert not [line for line in tty.text().splitlines() if line.startswith("step ")]   # nothing scrolled
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(tty.raw).decode(errors="replace"))
    drawn = [seg for seg in re.split(r"[\r\n]", plain) if seg.startswith(("step ", "deadline "))]
    assert drawn and all(len(seg) <= 80 for seg in drawn), max(drawn, key=len)
    assert any(re.search(r"^deadline in .* \| nodes: \d+ (spot|on-demand) in \S+", seg) for seg in drawn), drawn
