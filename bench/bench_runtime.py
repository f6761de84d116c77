"""Runtime benchmarks, each a ratio against a baseline measured in the same run.

1. Loop overhead: spotwise ``run_loop`` (FSDP2 bf16, per-step stop/preempt all-reduce, progress
   hook; checkpointing off) vs a plain PyTorch loop doing the same FSDP2 forward/backward/clip/
   AdamW on the same batches. Target: < 3 % overhead.
   Reported as the min over repeats of wall time and of process CPU time (single-threaded
   torch, so CPU time tracks the work done and is robust to other jobs sharing the machine).
2. Save cost: one synchronous checkpoint (DCP shard + rng + commit) of the default GPT, in
   seconds and as a multiple of a step; the Young/Daly interval it implies at MTBI = 1 h.

    .venv/bin/python bench/bench_runtime.py [--steps 60] [--d-model 256]

Single process (world 1, gloo on CPU / NCCL on GPU), torch threads fixed to 1.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist

from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import Checkpointer, run_storage
from spotwise.runtime.training.loop import LocalSession, run_loop, train_state
from spotwise.runtime.training.saving import young_daly_interval
from spotwise.runtime.training.parallel import device_for_rank, parallelize, resolve_precision
from spotwise.utils.net import free_port


def plain_loop(spec, steps: int) -> float:
    device = device_for_rank()
    torch.manual_seed(spec.seed)
    model = parallelize(spec.model_fn(), device=device, precision=spec.precision)
    optim = spec.optimizer_fn(model.parameters())
    t0 = c0 = None
    for step in range(steps):
        x, y = (t.to(device) for t in spec.batch_fn(step, 0, 1))
        loss = spec.loss_fn(model, (x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optim.step()
        optim.zero_grad(set_to_none=True)
        float(loss.detach())
        if step == 0:
            t0, c0 = time.perf_counter(), time.process_time()   # steady state: from the end of step 1
    return time.perf_counter() - t0, time.process_time() - c0


def spotwise_loop(spec, steps: int, root: str, name: str) -> float:
    spec.steps = steps
    spec.checkpoint_interval = 10**9     # measure the loop, not checkpoints

    class Timed(LocalSession):
        marks: dict = {}

        def report_progress(self, step, loss, perf=None):
            self.marks[step] = (time.perf_counter(), time.process_time())

    s = Timed()
    run_loop(spec, s, run_storage(f"file://{root}", name))
    (w1, c1), (wn, cn) = s.marks[1], s.marks[steps]
    return wn - w1, cn - c1                           # same span: end of step 1 to end of step N


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    cfg = TrainConfig(model=ModelConfig(d_model=a.d_model), steps=a.steps, batch_size=8)
    root = tempfile.mkdtemp(prefix="bench-runtime-")

    # both sides time the same span (end of step 1 to end of step N), alternating runs
    plain, ours = [], []
    for i in range(a.repeats):
        plain.append(plain_loop(gpt_spec(cfg), a.steps))
        ours.append(spotwise_loop(gpt_spec(cfg), a.steps, root, f"full{i}"))
        spec = gpt_spec(cfg)
        ck = Checkpointer(run_storage(f"file://{root}", f"save{i}"), keep_last=2)
        model = parallelize(spec.model_fn(), device=device_for_rank(), precision=spec.precision)
        optim = spec.optimizer_fn(model.parameters())
        x, y = spec.batch_fn(0, 0, 1)
        spec.loss_fn(model, (x, y)).backward()
        optim.step()
        t0 = time.perf_counter()
        ck.save(train_state(model, optim), step=1, kind="final")
        save_s = time.perf_counter() - t0
    p, o = min(w for w, _ in plain), min(w for w, _ in ours)
    pc, oc = min(c for _, c in plain), min(c for _, c in ours)
    step_s = p / (a.steps - 1)
    print(f"device={device_for_rank()} precision={resolve_precision(cfg.precision, device_for_rank())} "
          f"d_model={a.d_model} steps={a.steps} repeats={a.repeats}")
    print(f"plain PyTorch FSDP2 loop : {p:.3f} s ({step_s * 1000:.1f} ms/step)")
    print(f"spotwise run_loop        : {o:.3f} s")
    print(f"loop overhead, wall      : {o / p:.4f}  (overhead {100 * (o / p - 1):+.2f} %; min of repeats)")
    print(f"loop overhead, CPU time  : {oc / pc:.4f}  (overhead {100 * (oc / pc - 1):+.2f} %; process CPU, "
          f"less sensitive to other jobs on a shared machine)")
    print(f"per-repeat wall ratios   : {' '.join(f'{b[0] / a[0]:.3f}' for a, b in zip(plain, ours))}")
    print(f"sync checkpoint save     : {save_s:.3f} s = {save_s / step_s:.1f} steps; "
          f"Young/Daly interval at MTBI 1 h: {young_daly_interval(save_s, 3600, step_s)} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
