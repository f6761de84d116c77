"""Interruption latencies on the local cloud, through the real orchestrator.

Runs ``examples/tiny-gpt.yaml`` (2 spot worker nodes, Ray nodes as local processes) with one
scheduled spot preemption and reads the run's control-actor snapshot (timestamps of the
checkpoints and resumes the training ranks reported) and the orchestrator's events:

* notice -> checkpoint committed: from the spot notice appearing in the node's metadata service
  (event ``spot_notice``) to the ``preemption`` checkpoint being reported committed (the watcher
  polls IMDSv2 every 0.5 s, drains the Ray node, Ray Train marks the workers, the ranks agree at
  the end of the step and write a synchronous checkpoint). Baseline: the notice window itself
  (``notice_seconds``); the ratio is the fraction of the window used.
* node loss -> training resumed: from the node being reclaimed (event ``preempted``) to the
  group reporting its resume from the checkpoint (replacement node launched, Ray Train restarts
  the worker group, ranks load the checkpoint). Baseline: the cold start of the same run
  (cluster launch -> first training step).

    SPOTWISE_HOME=$(mktemp -d) .venv/bin/python bench/bench_runtime_interrupt.py [--preempt-at 6] [--notice 5] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from spotwise.engine.run.orchestrator import LaunchOptions, Orchestrator
from spotwise.taskspec import load_taskspec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="examples/tiny-gpt.yaml")
    ap.add_argument("--preempt-at", type=float, default=6.0, help="seconds after training starts")
    ap.add_argument("--notice", type=float, default=5.0)
    ap.add_argument("--steps", type=int, default=None)
    a = ap.parse_args()
    os.environ.setdefault("SPOTWISE_HOME", tempfile.mkdtemp(prefix="bench-interrupt-"))
    spec = load_taskspec(a.task)
    if a.steps:   # the task spec is frozen: rebuild it with more steps
        spec = spec.model_copy(update={"training": spec.training.model_copy(update={"steps": a.steps})})
    o = Orchestrator(spec, LaunchOptions(preempt_at=[a.preempt_at], notice_seconds=a.notice,
                                         storage=f"file://{tempfile.mkdtemp(prefix='bench-ckpt-')}"))
    report = o.run()
    snap = o.driver.snapshot     # the final control-actor snapshot, which the public report summarises
    ev = report["events"]
    first = lambda kind: next(e["t"] for e in ev if e["event"] == kind)
    notice_t = first("spot_notice")
    lost_t = first("preempted")
    launch_t = ev[0]["t"]
    jit = next(c for c in snap["checkpoints"] if c["kind"] == "preemption")
    resume = next(r for r in snap["resumes"] if r["t"] > lost_t)
    notice_to_commit = jit["t"] - notice_t
    loss_to_resume = resume["t"] - lost_t
    cold = snap["started_at"] - launch_t
    print(json.dumps({"status": report["status"], "lost_steps": report["lost_steps"],
                      "checkpoints": report["checkpoints"], "resume_points": report["resume_points"]}))
    print(f"notice -> preemption checkpoint committed : {notice_to_commit:.2f} s "
          f"(ratio to the {a.notice:.0f} s notice window: {notice_to_commit / a.notice:.3f})")
    print(f"node loss -> training resumed             : {loss_to_resume:.2f} s "
          f"(ratio to this run's cold start {cold:.2f} s: {loss_to_resume / cold:.3f})")
    print(f"steps lost to the preemption              : {report['lost_steps']}")


if __name__ == "__main__":
    main()
