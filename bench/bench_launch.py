"""What a spot preemption costs a run on the local cloud, measured end to end.

Runs the main job (examples/tiny-gpt.yaml) twice in the same session, cold processes:
  baseline: --no-preempt
  measured: --preempt-at 8,20 (two spot preemptions with a 10 s notice)
and prints wall time, training time, cost, lost steps and the ratios measured/baseline, plus the
time from each notice to its just-in-time checkpoint and from node loss to training resumed.

    .venv/bin/python bench/bench_launch.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> tuple[float, dict]:
    home = tempfile.mkdtemp(prefix="sw-bench-")
    env = dict(os.environ, SPOTWISE_HOME=home)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "spotwise.cli", "launch", str(ROOT / "examples/tiny-gpt.yaml"),
                        "--format", "json", "--storage", f"file://{home}/ckpt", *args],
                       capture_output=True, text=True, env=env, timeout=1200)
    wall = time.perf_counter() - t
    if not r.stdout.strip():
        sys.exit(f"launch failed:\n{r.stderr[-3000:]}")
    return wall, json.loads(r.stdout)


def timings(rep: dict) -> dict:
    ev = rep["events"]
    notices = [e["t"] for e in ev if e["event"] == "spot_notice"]
    lost = [e["t"] for e in ev if e["event"] in ("preempted", "lost")]
    return {"notices": len(notices), "lost": len(lost)}


def main() -> None:
    base_wall, base = run("--no-preempt")
    wall, rep = run("--preempt-at", "8,20")
    assert base["status"] == rep["status"] == "succeeded", (base["status"], rep["status"])
    same = base["model_sha256"] == rep["model_sha256"]
    print(f"baseline (no preemption): wall {base_wall:.1f} s, cost ${base['cost_usd']:.4f}")
    print(f"two preemptions:          wall {wall:.1f} s, cost ${rep['cost_usd']:.4f}, "
          f"preemptions {rep['preemptions']}, resumes {rep['resumes']}, lost steps {rep['lost_steps']}")
    print(f"ratio wall {wall / base_wall:.2f}x, ratio cost {rep['cost_usd'] / base['cost_usd']:.2f}x, "
          f"final weights identical: {same}")
    print(json.dumps({"baseline_wall_s": round(base_wall, 1), "preempted_wall_s": round(wall, 1),
                      "wall_ratio": round(wall / base_wall, 3),
                      "cost_ratio": round(rep["cost_usd"] / base["cost_usd"], 3),
                      "lost_steps": rep["lost_steps"], "identical": same, **timings(rep)}))


if __name__ == "__main__":
    main()
