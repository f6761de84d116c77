"""Checkpoint-save benchmarks, each a ratio against a baseline measured in the same run.

1. Async-save stall: the training thread's stall per checkpoint with async save (stage the
   sharded model+AdamW state to host memory, write in the background) vs a synchronous save of
   the same state (DCP write + rng + commit), file:// storage. Target: stall < 10 % of sync.
2. S3 save throughput: a full synchronous checkpoint save (DCP shard written to local staging,
   uploaded with boto3 multipart, rng + train_state + commit marker) to a moto_server subprocess
   vs a plain ``boto3 upload_file`` (same TransferConfig) of the same shard bytes to the same
   endpoint. Target: >= 80 % of the plain upload's throughput.

    .venv/bin/python bench/bench_runtime_save.py [--d-model 512] [--n-layers 8] [--repeats 3]

Single process (world 1, gloo), torch threads fixed to 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.checkpoint.async_save import AsyncCheckpointer
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import Checkpointer, run_storage, step_dir
from spotwise.runtime.training.loop import train_state
from spotwise.runtime.training.parallel import device_for_rank, parallelize
from spotwise.utils.net import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from emulator.moto_server import MotoServer  # noqa: E402  (tests/ holds the one moto launcher)


def build(cfg: TrainConfig):
    spec = gpt_spec(cfg)
    model = parallelize(spec.model_fn(), device=device_for_rank(), precision=spec.precision)
    optim = spec.optimizer_fn(model.parameters())
    for step in range(2):                      # optimizer state exists (exp_avg, exp_avg_sq)
        spec.loss_fn(model, spec.batch_fn(step, 0, 1)).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
    return spec, model, optim


def bench_stall(model, optim, root: str, repeats: int) -> tuple[float, float, float, float]:
    sync_s, stall_s, write_s = [], [], []
    ck = Checkpointer(run_storage(f"file://{root}", "sync"), keep_last=2)
    saver = AsyncCheckpointer(run_storage(f"file://{root}", "async"), keep_last=2)
    nbytes = 0
    try:
        for i in range(repeats + 1):           # first round warms buffers and the page cache
            t0 = time.perf_counter()
            ck.save(train_state(model, optim), step=i + 1, kind="periodic")
            t1 = time.perf_counter()
            stall = saver.save_async(lambda: train_state(model, optim), step=i + 1)
            saver.wait()                       # the next boundary is far away: no wait counted
            if i:
                sync_s.append(t1 - t0)
                stall_s.append(stall)
                write_s.append(saver.timing.write_s)
            nbytes = saver.stager.bytes_staged
    finally:
        saver.close()
    return statistics.median(sync_s), statistics.median(stall_s), statistics.median(write_s), nbytes


def bench_s3(model, optim, repeats: int) -> tuple[float, float, int]:
    import boto3

    from spotwise.runtime.storage.base import S3Storage

    moto = MotoServer()
    os.environ.update(moto.env())
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        st = S3Storage("bench", "run")
        ck = Checkpointer(st, keep_last=2)
        ours, plain = [], []
        shard = Path(tempfile.mkdtemp(prefix="bench-shard-")) / "__0_0.distcp"
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            ck.save(train_state(model, optim), step=i + 1, kind="periodic")
            t1 = time.perf_counter()
            if i == 0:
                st.get_file(f"{step_dir(1)}/__0_0.distcp", shard)
            t2 = time.perf_counter()
            client.upload_file(str(shard), "bench", f"plain/{i}/__0_0.distcp", Config=st._transfer)
            t3 = time.perf_counter()
            client.delete_object(Bucket="bench", Key=f"plain/{i}/__0_0.distcp")
            if i:
                ours.append(t1 - t0)
                plain.append(t3 - t2)
        return statistics.median(ours), statistics.median(plain), shard.stat().st_size
    finally:
        moto.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-s3", action="store_true")
    a = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    cfg = TrainConfig(model=ModelConfig(d_model=a.d_model, n_layers=a.n_layers, n_heads=8), batch_size=2)
    _, model, optim = build(cfg)
    nparams = sum(p.numel() for p in model.parameters())
    root = tempfile.mkdtemp(prefix="bench-save-")
    sync, stall, write, nbytes = bench_stall(model, optim, root, a.repeats)
    print(f"device={device_for_rank()} params={nparams / 1e6:.1f}M state={nbytes / 2**20:.0f} MiB repeats={a.repeats}")
    print(f"sync save (file://)          : {sync:.3f} s")
    print(f"async save: training stall   : {stall:.3f} s  (background write+commit {write:.3f} s)")
    print(f"async stall / sync           : {stall / sync:.4f}  ({100 * stall / sync:.1f} %; target < 10 %)")
    if not a.skip_s3:
        ours, plain, size = bench_s3(model, optim, a.repeats)
        print(f"S3 (moto) checkpoint save    : {ours:.3f} s = {size / 2**20 / ours:.1f} MiB/s of shard bytes")
        print(f"plain boto3 multipart upload : {plain:.3f} s = {size / 2**20 / plain:.1f} MiB/s ({size / 2**20:.0f} MiB)")
        print(f"throughput ratio ours/plain  : {plain / ours:.4f}  (target >= 0.80)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
