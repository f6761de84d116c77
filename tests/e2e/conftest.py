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
from terminal import Terminal  # noqa: E402
from torchrun import run_json  # noqa: E402

__all__ = ["EXAMPLE", "Launch", "launch"]


def launch(home: Path, task: Path, *args: str, env: dict | None = None, timeout: float = 900) -> dict:
    return Launch(home, task, *args, env=env).report(timeout=timeout)


class Launch:
    """``spotwise launch TASK --format json`` running in its own process with ``SPOTWISE_HOME=home``:
    ``cli`` runs another spotwise command against the same state while it goes; :meth:`report`
    waits for it, checks that no node process was left and returns the run's report.

    ``terminal``: its stderr is an 80x24 pseudo-terminal read into :attr:`tty` (a :class:`Terminal`)
    while stdout stays a pipe for the report, as when a person runs it in a terminal and pipes the
    JSON on."""

    def __init__(self, home: Path, task: Path, *args: str, env: dict | None = None, terminal: bool = False) -> None:
        self.home = home
        self.env = dict(env or os.environ, SPOTWISE_HOME=str(home))
        self.tty: Terminal | None = None
        stderr: int = subprocess.PIPE
        if terminal:
            self.tty = Terminal()
            stderr = self.tty.slave
            for var in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):   # the pty's own size
                self.env.pop(var, None)
            self.env["TERM"] = "xterm-256color"
        self.proc = subprocess.Popen([sys.executable, "-m", "spotwise.cli", "launch", str(task), "--format", "json",
                                      *args], stdout=subprocess.PIPE, stderr=stderr, text=True, env=self.env,
                                     stdin=subprocess.DEVNULL if terminal else None)   # Rich sizes by stdin first
        self.out = ""
        if self.tty is not None:
            self.tty.start()

    def cli(self, *args: str, **kw) -> subprocess.Popen:
        """``spotwise ARGS`` on the same state, its stdout a pipe (text)."""
        return subprocess.Popen([sys.executable, "-m", "spotwise.cli", *args], stdout=subprocess.PIPE, text=True,
                                env=self.env, **kw)

    def report(self, *, timeout: float = 900) -> dict:
        from spotwise.provisioner.clouds.local.cloud import marked_pids

        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            if self.tty is not None:
                self.tty.close()
        if self.tty is not None:
            err = self.tty.text()
        self.out = out
        assert out.strip(), f"no report; rc={self.proc.returncode}\nstderr:\n{err[-4000:]}"
        report = json.loads(out)
        assert marked_pids(home_prefix=str(self.home)) == [], "a node process was left running"
        return report


def standalone_reference(task: Path, storage: Path) -> dict:
    """``task``'s training without Ray and without interruption: the built-in model on as many ranks
    as the task has nodes, under torchrun (``spotwise.runtime.training.standalone``). A Ray run of the task,
    preempted or not, on any cloud, must end with these weights: the loop's batches are a function of
    the step, its checkpoints reshard exactly, and gloo on loopback reduces in the same order."""
    import yaml

    spec = yaml.safe_load(task.read_text())
    t, m = spec["training"], spec["training"]["model"]
    args = ["--storage", f"file://{storage}", "--run-name", "reference", "--steps", str(t["steps"]),
            "--batch-size", str(t["batch_size"]), "--lr", str(t["lr"]), "--seed", str(t["seed"]),
            "--seq-len", str(m["seq_len"]), "--d-model", str(m["d_model"]), "--n-layers", str(m["n_layers"]),
            "--n-heads", str(m["n_heads"]), "--checkpoint-interval", str(t["checkpoint"]["interval_steps"]),
            "--keep-last", str(t["checkpoint"]["keep_last"]), "--precision", t.get("precision", "auto")]
    out = run_json(["-m", "spotwise.runtime.training.standalone", *args], spec["resources"]["nodes"])
    assert out["steps_completed"] == t["steps"] and not out["preempted"], out
    return {"model_sha256": out["model_sha256"], "steps_total": t["steps"], "precision": out["precision"]}


@pytest.fixture(scope="session")
def reference(tmp_path_factory, worker_id):
    """The weights every end-to-end run must reproduce: the main job's training run once, without
    Ray and without preemptions (:func:`standalone_reference`; it used to be a whole local-cloud
    launch with ``--no-preempt``, 80 s instead of 20).

    Run once per test run, not once per pytest-xdist worker: the first worker to ask runs it under
    a file lock in the directory all workers share and leaves the result there; the others wait on
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
        rep = standalone_reference(EXAMPLE, tmp_path_factory.mktemp("ref"))
        cached.write_text(json.dumps(rep))
        return rep


from slurm_cluster import cluster_fixture  # noqa: E402  (tests/ is on the path: see above)

#: the real two-node Slurm cluster of tests/slurm_cluster.py (tests/e2e/test_launch_slurm.py)
slurm_cluster = pytest.fixture(scope="session")(cluster_fixture)
