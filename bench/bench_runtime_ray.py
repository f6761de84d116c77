"""Loop overhead *under Ray Train*: spotwise's loop in a ``TorchTrainer`` worker, with its Ray
session (stop poller on a live control actor, Ray Train's preemption mark read every step,
progress reports to the actor) against a plain PyTorch FSDP2 loop of the same model and batches,
in the same run. Target (issue 5): < 3 % step-time overhead.

A third arm runs the *plain* loop inside the same kind of Ray Train worker (no spotwise session,
no control actor), so the figure splits into what Ray Train costs by itself (Ray's worker threads
and daemons share the machine) and what spotwise adds on top of it.

Both sides time the same span (end of step 1 to end of step N) with torch fixed to one thread;
runs alternate (plain, Ray, plain, Ray, ...) and the minimum over repeats is reported, which is
robust to other work on a shared machine. The plain loop runs in its own process, like the Ray
worker, so neither side shares an interpreter with Ray's driver.

    .venv/bin/python bench/bench_runtime_ray.py [--steps 60] [--d-model 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The plain loop is bench_runtime.py's own, run in a fresh process of its own.
PLAIN = r"""
import json, os, sys
sys.path.insert(0, sys.argv[3])
import torch, torch.distributed as dist
from bench_runtime import plain_loop
from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.utils.net import free_port
steps, d_model = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("gloo", rank=0, world_size=1)
wall, cpu = plain_loop(gpt_spec(TrainConfig(model=ModelConfig(d_model=d_model), steps=steps, batch_size=8)), steps)
print(json.dumps({"wall": wall, "cpu": cpu}))
dist.destroy_process_group()
"""


def plain(steps: int, d_model: int) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", PLAIN, str(steps), str(d_model), str(Path(__file__).resolve().parent)],
                         capture_output=True, text=True, check=True, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    d = json.loads(out.strip().splitlines()[-1])
    return d["wall"], d["cpu"]


def _worker(config: dict) -> None:
    import torch

    from spotwise.runtime.api import ModelConfig, TrainConfig
    from spotwise.runtime.training.builtin import gpt_spec
    from spotwise.runtime.checkpoint.checkpointer import run_storage
    from spotwise.runtime.training.loop import run_loop
    from spotwise.runtime.training.session import RaySession

    torch.set_num_threads(1)
    if config["mode"] == "plain":            # Ray Train alone: bench_runtime's plain loop in the worker
        sys.path.insert(0, config["bench_dir"])
        from bench_runtime import plain_loop

        spec = gpt_spec(TrainConfig(model=ModelConfig(d_model=config["d_model"]), steps=config["steps"],
                                    batch_size=8))
        wall, cpu = plain_loop(spec, config["steps"])
        Path(config["out"]).write_text(json.dumps({"wall": wall, "cpu": cpu}))
        return
    marks: dict[int, tuple[float, float]] = {}

    class Timed(RaySession):
        def report_progress(self, step, loss, perf=None):
            marks[step] = (time.perf_counter(), time.process_time())
            super().report_progress(step, loss, perf)

    spec = gpt_spec(TrainConfig(model=ModelConfig(d_model=config["d_model"]), steps=config["steps"],
                                batch_size=8))
    spec.checkpoint_interval = 10**9          # measure the loop, not checkpoints
    session = Timed(config["control"])
    try:
        run_loop(spec, session, run_storage(config["storage"], config["name"]))
    finally:
        session.close()
    (w1, c1), (wn, cn) = marks[1], marks[config["steps"]]
    Path(config["out"]).write_text(json.dumps({"wall": wn - w1, "cpu": cn - c1}))


def under_ray(steps: int, d_model: int, root: str, i: int, mode: str = "spotwise") -> tuple[float, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from spotwise.runtime.training.control import create_actor

    name = f"bench-ray-{mode}-{i}-{os.getpid()}"
    actor = create_actor(name) if mode == "spotwise" else None    # held until the run ends
    if actor is not None:
        # Ready before the run: its process start-up (an interpreter importing Ray, a one-off cost
        # at job start) would otherwise compete with the first timed steps on a 2-core machine.
        import ray

        ray.get(actor.snapshot.remote())
    out = os.path.join(root, f"{name}.json")
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"steps": steps, "d_model": d_model, "control": name, "storage": f"file://{root}",
                           "name": name, "out": out, "mode": mode,
                           "bench_dir": str(Path(__file__).resolve().parent)},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=os.path.join(root, "_ray"),
                             worker_runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}),
    )
    res = trainer.fit()
    if res.error is not None:
        raise SystemExit(f"ray run failed: {res.error}")
    d = json.loads(Path(out).read_text())
    del actor
    return d["wall"], d["cpu"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import ray

    root = tempfile.mkdtemp(prefix="bench-runtime-ray-")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        plains, bare, rays = [], [], []
        for i in range(a.repeats):
            plains.append(plain(a.steps, a.d_model))
            bare.append(under_ray(a.steps, a.d_model, root, i, mode="plain"))
            rays.append(under_ray(a.steps, a.d_model, root, i))
            print(f"repeat {i}: plain {plains[-1][0]:.3f} s, plain in Ray {bare[-1][0]:.3f} s, "
                  f"spotwise in Ray {rays[-1][0]:.3f} s", flush=True)
    finally:
        ray.shutdown()
    p, b, r = (min(w for w, _ in x) for x in (plains, bare, rays))
    pc, bc, rc = (min(c for _, c in x) for x in (plains, bare, rays))
    ms = lambda t: f"{t:.3f} s ({1000 * t / (a.steps - 1):.1f} ms/step)"
    pct = lambda x: f"{x:.4f} ({100 * (x - 1):+.2f} %)"
    med = lambda xs: sorted(xs)[len(xs) // 2]
    from spotwise.runtime.training.parallel import resolve_precision
    import torch

    print(f"d_model={a.d_model} steps={a.steps} repeats={a.repeats} precision="
          f"{resolve_precision('auto', torch.device('cpu'))} (CPU, gloo, 1 torch thread per side)")
    print(f"plain PyTorch FSDP2 loop (own process)      : {ms(p)}")
    print(f"plain loop in a Ray Train worker            : {ms(b)}")
    print(f"spotwise loop in a Ray Train worker         : {ms(r)}")
    print(f"overhead vs plain, wall (min of repeats)    : {pct(r / p)}   <- the issue's figure")
    print(f"overhead vs plain, process CPU              : {pct(rc / pc)}")
    print(f"  of which Ray Train alone, wall            : {pct(b / p)}")
    print(f"  of which spotwise on top of Ray, wall     : {pct(r / b)}")
    print(f"per-repeat wall ratios spotwise-in-Ray/plain: {' '.join(f'{y[0] / x[0]:.3f}' for x, y in zip(plains, rays))}"
          f" (median {med([y[0] / x[0] for x, y in zip(plains, rays)]):.3f})")
    print(f"per-repeat wall ratios spotwise/plain-in-Ray: {' '.join(f'{y[0] / x[0]:.3f}' for x, y in zip(bare, rays))}"
          f" (median {med([y[0] / x[0] for x, y in zip(bare, rays)]):.3f})")


if __name__ == "__main__":
    main()
