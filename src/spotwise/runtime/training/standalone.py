"""Run the built-in GPT with the spotwise loop WITHOUT Ray: one process, or one per GPU under
torchrun. For GPU benchmarks on machines where Ray is not installed.

    python -m spotwise.runtime.training.standalone --storage file:///tmp/ckpt --run-name bench --steps 200
    torchrun --nproc-per-node 8 -m spotwise.runtime.training.standalone --storage s3://bucket/runs ...

Backend: NCCL on CUDA, gloo on CPU. SIGTERM (what spot reclaim and Kubernetes send first) sets
the preemption flag: every rank agrees at the end of the current step, writes a just-in-time
checkpoint and exits 0; rerunning the same command resumes exactly from it. Prints the result
as one JSON line on rank 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from typing import NoReturn

import torch
import torch.distributed as dist

from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.training.builtin import gpt_spec
from spotwise.runtime.checkpoint.checkpointer import run_storage
from spotwise.runtime.training.loop import LocalSession, run_loop
from spotwise.utils.net import free_port


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spotwise.runtime.training.standalone", description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", required=True, help="file:///path or s3://bucket/prefix")
    p.add_argument("--run-name", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8, help="global batch, sequences per step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-interval", type=int, default=None,
                   help="steps between checkpoints (default: Young/Daly from --mtbi-s)")
    p.add_argument("--mtbi-s", type=float, default=3600.0, help="mean time between interruptions")
    p.add_argument("--keep-last", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 on CUDA and on CPUs with native bf16, else fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sync-save", action="store_true",
                   help="write periodic checkpoints in the training thread (default: async, staged to host memory)")
    return p


def _init_process_group() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:           # torchrun
        dist.init_process_group(backend)
        return
    port = free_port()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group(backend, rank=0, world_size=1)


def end_process(code: int) -> NoReturn:
    """End a rank after ``destroy_process_group``: flush stdio, then ``os._exit(code)``, skipping
    the interpreter's finalization.

    Why: gloo's worker threads outlive ``destroy_process_group`` (its ``shutdown`` does not join
    them), and the one that ran the last collective drops that work, and with it the tensor it held,
    some time after ``wait()`` returned. Dropping a tensor made in Python decrefs its Python object,
    which takes the GIL; when the main thread is already in ``Py_FinalizeEx`` the thread is made to
    exit inside a noexcept destructor and the process aborts ("terminate called without an active
    exception", SIGABRT), so torchrun reports a finished run as failed. Seen here with torch 2.13 on
    4 of 30 two-rank runs whose last collective was the held-out loss's all-reduce; gdb showed the
    ``pt_gloo_runloop`` thread in ``~AsyncAllreduceWork`` -> ``gil_scoped_acquire`` ->
    ``pthread_exit`` while the main thread was in ``Py_FinalizeEx``. (PyTorch's own attempt to
    destroy groups at exit, pytorch/pytorch#179291, was abandoned.) Nothing of ours needs
    finalization after this point: checkpoints are committed before ``run_loop`` returns."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):     # a closed pipe: nothing more can be said on it
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        cfg = TrainConfig(model=ModelConfig(seq_len=a.seq_len, d_model=a.d_model, n_layers=a.n_layers,
                                            n_heads=a.n_heads),
                          steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed, precision=a.precision)
        # the checkpoint knobs are the loop's: None (Young/Daly) is not a task-file value
        spec = gpt_spec(cfg, checkpoint_interval=a.checkpoint_interval, keep_last=a.keep_last,
                        grad_accum=a.grad_accum, activation_checkpointing=a.activation_checkpointing,
                        compile=a.compile, mtbi_s=a.mtbi_s, num_threads=a.threads,
                        async_save=not a.sync_save)
    except ValueError as e:             # pydantic's ValidationError included: the message names the field
        print(f"error: {e}", file=sys.stderr)
        return 2
    session = LocalSession()
    signal.signal(signal.SIGTERM, lambda *_: setattr(session, "preempted", True))
    _init_process_group()
    t0 = time.perf_counter()
    try:
        res = run_loop(spec, session, run_storage(a.storage, a.run_name))
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        out = dataclasses.asdict(res)
        out["losses"] = out["losses"][-1:]
        out["wall_s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(out))
    if res.diverged is not None:
        from spotwise.runtime.training.optim import EXIT_DIVERGED

        print(f"error: {res.diverged}", file=sys.stderr)
        return EXIT_DIVERGED
    return 0


if __name__ == "__main__":
    end_process(main())
