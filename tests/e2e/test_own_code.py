"""End to end on the local cloud: a user's own package, shipped from a temporary directory as the
task's workdir (handed to Ray as the directory it is), trains through its ``make_spec``, is
preempted mid-run and ends with the weights of the same training without Ray and without a
preemption, losing no step (issue 31's "Done when", local cloud).

The same on the emulated AWS, with the workdir as a zip in the run's S3 storage and a move between
regions: tests/e2e/test_launch_aws.py. A Ray Train function (``training.train_func``) preempted
and resumed from the checkpoint it reported: tests/runtime/test_ray.py (on that module's Ray
cluster, without a launch's node boots)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import threading

import pytest

from e2e import owncode
from e2e.conftest import Launch

pytestmark = pytest.mark.slow

STEPS = 400


def test_own_package_is_preempted_and_resumes_bitwise(tmp_path):
    assert importlib.util.find_spec("regress") is None       # only the workdir holds it
    task = owncode.user_task(tmp_path, steps=STEPS, interval=100)
    ref = owncode.reference(task, tmp_path / "ref" / "ckpt")
    assert ref["steps"] == STEPS

    # a 5 s notice (the example's is 10): the JIT checkpoint takes about 1.5 s, and the ranks wait
    # out the rest of the notice before the node goes
    run = Launch(tmp_path / "run", task, "--preempt-at", "4", "--notice-seconds", "5",
                 "--storage", f"file://{tmp_path}/ckpt")
    follow = FollowLogs(run)                      # `spotwise logs JOB --follow` while the run goes
    rep = run.report()
    assert rep["status"] == "succeeded", rep
    assert rep["steps_completed"] == rep["steps_total"] == STEPS     # the task's steps, not the spec's 300
    assert rep["preemptions"] == 1 and rep["resumes"] == 1
    assert rep["lost_steps"] == 0
    assert rep["model_sha256"] == ref["model_sha256"], "weights differ from the uninterrupted Ray-free run"
    kinds = [c["kind"] for c in rep["checkpoints"]]
    assert "preemption" in kinds and kinds[-1] == "final"
    assert not [e for e in rep["events"] if e["event"] == "workdir_staged"]   # the local cloud: the directory as is

    # the job's own output: what each rank printed, streamed while it ran, kept after teardown
    job = rep["job_id"]
    assert follow.job_id == job and follow.wait() == 0
    assert follow.both_ranks_while_running, "no line of both ranks reached `logs --follow` while the run went"
    after = run.cli("logs", job)
    assert after.wait(timeout=120) == 0 and after.stdout is not None
    lines = after.stdout.read().splitlines()
    printed = rank_lines(lines)
    assert {r for r, _ in printed} == {"0", "1"} and len({s for _, s in printed}) >= STEPS // owncode.PRINT_EVERY
    assert set(printed) <= set(rank_lines(follow.lines))         # every line --follow showed, again after teardown
    assert rank_lines(follow.lines) == printed
    copy = [json.loads(x) for x in (tmp_path / "ckpt" / job / "logs" / "output.jsonl").read_text().splitlines()]
    assert rep["output"].endswith(f"{job}/logs/output.jsonl") and len(copy) == len(lines)


#: a line the user's code printed, as ``spotwise logs`` tags it: the rank in the tag is the one printing
_RANK_LINE = re.compile(r"^\[rank (\d+) node \S+\] regress: rank (\d+) of 2 at step (\d+)$")


def rank_lines(lines: list[str]) -> list[tuple[str, int]]:
    """``(rank, step)`` of each line the user's code printed, checking the tag names its rank."""
    out = []
    for line in lines:
        if m := _RANK_LINE.match(line):
            assert m[1] == m[2], line
            out.append((m[1], int(m[3])))
    return out


class FollowLogs:
    """``spotwise logs JOB --follow`` started as soon as ``run``'s job exists, its lines read as they
    come; ``both_ranks_while_running``: both ranks' lines had come while the launch was still going."""

    def __init__(self, run: Launch) -> None:
        self.run, self.lines = run, []
        self.both_ranks_while_running = False
        self.job_id = self._job_id()
        self.proc = run.cli("logs", self.job_id, "--follow", stderr=subprocess.DEVNULL)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _job_id(self) -> str:
        import time

        while self.run.proc.poll() is None:
            st = self.run.cli("status", "--format", "json", stderr=subprocess.DEVNULL)
            out, _ = st.communicate(timeout=120)
            if st.returncode == 0 and (jobs := json.loads(out)):
                return jobs[0]["job_id"]
            time.sleep(1.0)                   # the launch has not written its job yet
        raise AssertionError("the launch ended before its job could be seen")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if not self.both_ranks_while_running and {r for r, _ in rank_lines(self.lines)} == {"0", "1"}:
                self.both_ranks_while_running = self.run.proc.poll() is None

    def wait(self) -> int:
        rc = self.proc.wait(timeout=120)      # it ends by itself once the job has ended
        self._t.join(timeout=60)
        return rc
