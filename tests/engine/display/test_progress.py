"""The live display's text (:mod:`spotwise.engine.display.progress`): the fields a person reads, within the
terminal's width, never a Python repr; and the pace that gives steps/s and the ETA."""

from __future__ import annotations

import pytest

from spotwise.engine.display.progress import Pace, Progress, duration, nodes_by_place, progress_lines
from spotwise.provisioner.base import Node


def node(market: str, zone: str, role: str = "worker", state: str = "running") -> Node:
    return Node(cloud="local", instance_id=f"i-{market}-{zone}-{role}", instance_type="local.cpu1",
                region="local", zone=zone, market=market, usd_per_hour=0.01, cluster_id="c", job_id="j",
                role=role, state=state)


def test_the_display_says_step_loss_pace_spend_eta_deadline_and_nodes_in_80_columns():
    nodes = nodes_by_place([node("spot", "local-a"), node("spot", "local-a", "head"),
                            node("on-demand", "local-b")])
    p = Progress(t=1000.0, steps_total=400, spend_usd=0.021, step=120, loss=2.3141, steps_per_s=3.5,
                 budget_usd=1.0, deadline_at=1000.0 + 5 * 3600, nodes=nodes)
    lines = progress_lines(p, width=80)
    assert lines == ["step 120/400 | loss 2.314 | 3.5 steps/s | $0.0210 of $1.00 | ETA 1 min 20 s",
                     "deadline in 5 h 00 min | nodes: 2 spot in local-a, 1 on-demand in local-b"]
    assert all(len(line) <= 80 for line in lines)


def test_before_training_reports_the_display_shows_dashes_not_none():
    p = Progress(t=0.0, steps_total=200, spend_usd=0.0)
    lines = progress_lines(p)
    assert lines == ["step -/200 | loss - | $0.0000", "nodes: none running"]
    assert "None" not in " ".join(lines) and "{" not in " ".join(lines)


def test_a_narrow_terminal_gets_lines_cut_to_its_width():
    p = Progress(t=0.0, steps_total=10**9, spend_usd=12345.678, step=10**8, loss=float("nan"),
                 steps_per_s=0.001, budget_usd=99999.0, deadline_at=-7200.0,
                 nodes=tuple(("spot", f"zone-{i}", 1) for i in range(20)))
    for width in (20, 40, 80):
        lines = progress_lines(p, width=width)
        assert len(lines) == 2 and all(len(line) <= width for line in lines), lines
        assert all(line.isascii() and "{" not in line for line in lines)
    assert progress_lines(p, width=200)[1].startswith("deadline passed 2 h 00 min ago | nodes: 1 spot in zone-0")
    assert "loss -" in progress_lines(p, width=200)[0]


def test_terminated_nodes_are_not_counted():
    assert nodes_by_place([node("spot", "a"), node("spot", "a", state="terminated")]) == (("spot", "a", 1),)


@pytest.mark.parametrize("seconds,text", [(0, "0 s"), (45.4, "45 s"), (80, "1 min 20 s"), (120, "2 min"),
                                          (3600 + 300, "1 h 05 min"), (86400 * 3 + 4 * 3600, "3 d 4 h")])
def test_durations_read_in_their_two_largest_units(seconds, text):
    assert duration(seconds) == text


def test_the_pace_is_steps_over_its_window_and_restarts_after_a_resume():
    pace = Pace(window_s=30.0)
    assert pace.add(0.0, None) is None
    assert pace.add(0.0, 0) is None                       # one sample: no pace yet
    assert pace.add(10.0, 20) == pytest.approx(2.0)
    assert pace.add(20.0, 40) == pytest.approx(2.0)
    assert pace.add(50.0, 160) == pytest.approx((160 - 40) / 30)   # from the newest sample 30 s old
    assert pace.add(55.0, 100) is None                    # resumed from a checkpoint: a new window
    assert pace.add(60.0, 110) == pytest.approx(2.0)
    assert pace.add(60.0, None) == pytest.approx(2.0)     # no step reported: the pace so far


def test_the_newest_held_out_loss_shows_beside_the_training_loss():
    from spotwise.engine.display.progress import last_eval

    snap = {"eval_loss": [{"step": 0, "loss": 5.5}, {"step": 40, "loss": 3.25}, {"step": 20, "loss": 4.0}]}
    assert last_eval(snap) == 3.25 and last_eval({}) is None
    p = Progress(t=0.0, steps_total=200, spend_usd=0.0, step=45, loss=3.1, eval_loss=last_eval(snap))
    assert progress_lines(p)[0] == "step 45/200 | loss 3.1 | eval 3.25 | $0.0000"


def test_the_speed_line_says_tokens_per_second_mfu_and_peak_memory_once_measured():
    p = Progress(t=0.0, steps_total=10, spend_usd=0.0, step=3, loss=2.0, tokens_per_s=412_345.0, mfu=0.4127,
                 peak_memory_bytes=61.2 * 2**30)
    assert progress_lines(p)[2] == "412k tok/s | MFU 41% | peak mem 61.2 GiB"
    # on CPU (no GPU peak: no MFU), and nothing at all before training measured anything
    cpu = Progress(t=0.0, steps_total=10, spend_usd=0.0, tokens_per_s=950.0, peak_memory_bytes=2**29)
    assert progress_lines(cpu)[2] == "950 tok/s | peak mem 0.5 GiB"
    assert len(progress_lines(Progress(t=0.0, steps_total=10, spend_usd=0.0))) == 2
