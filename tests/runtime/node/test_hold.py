"""``python -m spotwise.runtime.node.hold``: a node's shutdown held until the run's just-in-time
checkpoint is committed (GCP's shutdown-script runs it), read from the run's store without torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def _commit(run: Path, step: int, at: float, kind: str = "preemption") -> None:
    d = run / "checkpoints" / f"step_{step:09d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "COMMITTED").write_text(json.dumps({"step": step, "kind": kind, "world_size": 2, "time": at}))


def _hold(run: Path, since: float, until: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spotwise.runtime.node.hold", run.as_uri(), "--since", str(since),
                             "--until", str(until)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_hold_ends_when_a_checkpoint_newer_than_the_notice_commits(tmp_path):
    run = tmp_path / "run"
    now = time.time()
    _commit(run, 5, now - 60)                          # a periodic checkpoint from before the notice
    p = _hold(run, now, now + 600)
    try:
        for _ in range(40):                             # it holds while only the old one is there
            assert p.poll() is None, p.communicate()
            time.sleep(0.05)
        _commit(run, 6, time.time(), kind="periodic")   # a periodic one after the notice: training goes on
        for _ in range(40):                             # (failed before: it ended the hold)
            assert p.poll() is None, p.communicate()
            time.sleep(0.05)
        _commit(run, 7, time.time())                    # the just-in-time checkpoint
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert f"a checkpoint of {run.as_uri()} committed; the shutdown goes on" in out


def test_the_hold_ends_at_its_bound_without_a_checkpoint_and_refuses_a_bound_before_its_start(tmp_path):
    now = time.time()
    p = _hold(tmp_path / "run", now, now)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 3 and "no checkpoint" in out
    p = _hold(tmp_path / "run", now, now - 1)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "--until" in err and "allowed" in err
