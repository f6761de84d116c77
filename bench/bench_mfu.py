"""Training throughput and MFU of the built-in Llama, with a ratio against a baseline of the same run.

On a GPU: the ``1b`` flavor in bf16 with FSDP2 (one unit per block, then the root), through the
Ray-free loop (:func:`spotwise.runtime.training.loop.run_loop`, checkpoints off); on a CPU: the ``debug``
flavor (precision ``auto``: fp32 on CPUs without native bf16), so the bench keeps working here.
Several GPUs: ``torchrun --nproc-per-node 8 bench/bench_mfu.py`` (NCCL; the batch is per GPU).

Prints tokens/s and MFU = tokens/s x FLOPs per token / (GPUs x dense bf16 peak), the FLOPs per
token being the estimator's own (:meth:`LlamaConfig.train_flops_per_token`: matmuls + attention,
no recomputation counted) and the peak the pricing data's (:func:`spotwise.pricing.estimate.gpu_peaks`).
A CPU has no peak there: its MFU is not printed.

Baseline: the same steps with ``activation_checkpointing`` off (the default) and on, alternating,
and the ratio on/off of tokens/s. Activation checkpointing is the task-file knob that trades
speed for memory; the ratio says what it costs on this machine (about 0.75 expected: one more
forward per step), and MFU is quoted for both, so a drop in the baseline's MFU (a slower kernel,
a sync in the loop) is not mistaken for the price of recomputation.

    .venv/bin/python bench/bench_mfu.py [--steps 20] [--repeats 2] [--flavor 1b] [--batch 8]

Target (issue 32): >= 40 % MFU on an H100 with activation checkpointing off.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist

from spotwise.runtime.api import CheckpointConfig, TrainConfig
from spotwise.runtime.training.builtin import llama_spec
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.runtime.training.parallel import device_for_rank, resolve_precision
from spotwise.utils.net import free_port

WARMUP_STEPS = 3          # not timed: allocator, kernels' first calls


def peak_tflops(device: torch.device) -> tuple[float | None, str]:
    """This GPU's dense bf16 peak from the pricing data, matched by name ("NVIDIA H100 80GB HBM3"
    -> H100; the longest matching name wins, so H100-NVL is not read as H100); None on a CPU."""
    from spotwise.pricing.estimate import gpu_peaks

    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device).upper()
    words = set(name.replace("-", " ").split())
    best = None
    for gpu in gpu_peaks():
        if all(part.upper() in words for part in gpu.split("-")) and (best is None or len(gpu) > len(best)):
            best = gpu
    return (gpu_peaks()[best][0], best) if best else (None, name)


def timed_run(cfg: TrainConfig, root: str, name: str, *, checkpointing: bool) -> float:
    """Seconds from the end of the warmup steps to the end of the last step (rank 0's clock)."""
    class Timed(LocalSession):
        marks: dict[int, float] = {}

        def report_progress(self, step: int, loss: float, perf: dict | None = None) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.marks[step] = time.perf_counter()

    spec = llama_spec(cfg, activation_checkpointing=checkpointing, num_threads=1 if not torch.cuda.is_available() else None)
    s = Timed()
    run_loop(spec, s, run_storage(f"file://{root}", name))
    return s.marks[cfg.steps] - s.marks[WARMUP_STEPS]


def main() -> None:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser()
    ap.add_argument("--flavor", default="1b" if cuda else "debug")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (after 3 untimed)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step per GPU/process")
    ap.add_argument("--seq-len", type=int, default=None, help="default: the flavor's")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    if "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
    dist.init_process_group("nccl" if cuda else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    device = device_for_rank()
    model = {"flavor": a.flavor, **({"seq_len": a.seq_len} if a.seq_len else {})}
    cfg = TrainConfig(entrypoint="llama", model=model, steps=WARMUP_STEPS + a.steps, batch_size=a.batch * world,
                      lr=3e-4, warmup_steps=2, checkpoint=CheckpointConfig(interval_steps=10**9))
    mc = cfg.llama
    assert mc is not None
    peak, gpu = peak_tflops(device)
    precision = resolve_precision(cfg.precision, device)
    root = tempfile.mkdtemp(prefix="bench-mfu-")
    off, on = [], []
    for i in range(a.repeats):          # alternating, min of repeats: robust to a noisy machine
        off.append(timed_run(cfg, root, f"off{i}", checkpointing=False))
        on.append(timed_run(cfg, root, f"on{i}", checkpointing=True))
    tokens = a.steps * cfg.batch_size * mc.seq_len
    fpt = mc.train_flops_per_token()
    if rank == 0:
        print(f"device={device} ({gpu}) x{world} precision={precision} flavor={a.flavor} params={mc.n_params():,} "
              f"seq={mc.seq_len} batch={cfg.batch_size} (global) steps={a.steps} timed x{a.repeats}")
        print(f"FLOPs/token (6(N - embedding) + 12·L·d·seq): {fpt:.4g}; peak: "
              f"{f'{peak} TFLOPS dense bf16 per GPU' if peak else 'none known (CPU): MFU not computed'}")
        for label, runs in (("activation checkpointing off", off), ("activation checkpointing on ", on)):
            tps = tokens / min(runs)
            mfu = f"MFU {100 * tps * fpt / (world * peak * 1e12):.1f} %" if peak else "MFU n/a"
            print(f"{label}: {tps:,.0f} tokens/s ({min(runs) / a.steps * 1000:.1f} ms/step)  {mfu}")
        print(f"ratio on/off (tokens/s)      : {min(off) / min(on):.3f}  "
              f"(per repeat: {' '.join(f'{b / c:.3f}' for b, c in zip(off, on))})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
