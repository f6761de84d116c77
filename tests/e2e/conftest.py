"""Shared end-to-end fixtures: the uninterrupted local-cloud run every other run must reproduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from e2e.helpers import EXAMPLE  # noqa: E402  (re-exported: the tests import it from here)

__all__ = ["EXAMPLE", "launch"]


def launch(home: Path, task: Path, *args: str, env: dict | None = None, timeout: float = 900) -> dict:
    from spotwise.provisioner.local import marked_pids

    env = dict(env or os.environ, SPOTWISE_HOME=str(home))
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json", *args],
                       capture_output=True, text=True, env=env, timeout=timeout)
    assert r.stdout.strip(), f"no report; rc={r.returncode}\nstderr:\n{r.stderr[-4000:]}"
    report = json.loads(r.stdout)
    assert marked_pids(home_prefix=str(home)) == [], "a node process was left running"
    return report


@pytest.fixture(scope="session")
def reference(tmp_path_factory, worker_id):
    """The main job on the local cloud without preemptions: the weights every run must reproduce.

    Run once per test run, not once per pytest-xdist worker: the first worker to ask runs it under
    a file lock in the directory all workers share and leaves the report there; the others wait on
    the lock and read it."""
    import fcntl

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":                  # under xdist: .../pytest-N/popen-gwK -> .../pytest-N
        shared = shared.parent
    cached = shared / "e2e-reference.json"
    with open(shared / "e2e-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cached.exists():
            return json.loads(cached.read_text())
        home = tmp_path_factory.mktemp("ref")
        rep = launch(home, EXAMPLE, "--no-preempt", "--storage", f"file://{home}/ckpt")
        assert rep["status"] == "succeeded", rep
        assert rep["preemptions"] == 0 and rep["resumes"] == 0
        cached.write_text(json.dumps(rep))
        return rep
