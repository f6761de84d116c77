"""``spotwise launch``'s live display (:mod:`spotwise.commands.run.live`) around a real journal, in a real
pseudo-terminal read by a terminal emulator, and the same run off a terminal.

The script below stands for a run: it sets the progress, records an event through the journal (as
the orchestrator does), then waits on its stdin until the test has seen that step drawn — so each
frame is waited for as an event, never as time passing. The whole end-to-end run on a terminal is in
tests/e2e/test_launch.py (its main run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from terminal import Terminal

SCRIPT = """
import sys
from spotwise.commands.run.live import live_progress
from spotwise.engine.state import db
from spotwise.engine.run.journal import Journal
from spotwise.engine.display.progress import Progress

with db.session() as s:        # the job the events belong to
    s.add(db.Job(id="job-1", name="t", status="running", cloud="local", spec={}))
    s.commit()
j = Journal("job-1", progress=True)
state = {"p": Progress(t=0.0, steps_total=400, spend_usd=0.0)}
with live_progress(lambda: state["p"]):
    for step in (100, 200, 300):
        state["p"] = Progress(t=float(step), steps_total=400, spend_usd=step / 1e4, step=step, loss=3 - step / 400,
                              steps_per_s=2.0, budget_usd=1.0, deadline_at=3600.0,
                              nodes=(("spot", "local-a", 2), ("on-demand", "local-a", 1)))
        j.event("preempted", instance_id="sw8bdad92744-worker-e296d7", market="spot", zone="local-a")
        if sys.stdin.readline() != "go\\n":
            raise SystemExit("the test stopped waiting")
print("done")
"""
EVENT = "preempted: spot worker sw...-e296d7 in local-a"


def env(home) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "SPOTWISE_DATABASE_URL")}
    return e | {"SPOTWISE_HOME": str(home), "TERM": "xterm-256color"}


def test_on_a_terminal_the_display_is_redrawn_in_place_below_the_event_lines(tmp_path):
    tty = Terminal()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=tty.slave, text=True, env=env(tmp_path))
    tty.start()
    try:
        assert proc.stdin is not None
        for step in (100, 200, 300):
            assert tty.wait_for(f"step {step}/400 | loss "), tty.text()
            proc.stdin.write("go\n")
            proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        tty.close()
    assert proc.returncode == 0 and out == "done\n"
    seen = [line for _, line in tty.display_rows]
    assert "step 300/400 | loss 2.25 | 2 steps/s | $0.0300 of $1.00 | ETA 50 s" in seen, seen
    lines = [line for line in tty.text().splitlines() if line]
    assert [line.split("] ", 1)[1] for line in lines] == [EVENT] * 3, lines
    # the events scrolled as plain lines; the display was redrawn in place and erased at the end: no
    # frame of it is left in the terminal's scrollback or on its screen
    assert not [line for line in lines if line.startswith(("step ", "deadline ", "nodes:"))], lines
    assert re.search(rb"\x1b\[\d*A", bytes(tty.raw))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(tty.raw).decode())
    drawn = [seg for seg in re.split(r"[\r\n]", plain) if seg.startswith(("step ", "deadline "))]
    assert drawn and all(len(seg) <= 80 for seg in drawn), drawn
    assert "deadline in 55 min | nodes: 2 spot in local-a, 1 on-demand in local-a" in plain, plain


def test_off_a_terminal_stderr_is_the_plain_event_lines_alone(tmp_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT], input="go\n" * 3, capture_output=True, text=True,
                       env=env(tmp_path), timeout=60)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 3 and all(re.fullmatch(r"\[spotwise \d\d:\d\d:\d\dZ\] " + re.escape(EVENT), line)
                                   for line in lines), lines
    assert "\x1b" not in r.stderr and "{'" not in r.stderr
