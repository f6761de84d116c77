"""``train_func(config)``: the same residual MLP and teacher as ``train.py``, as an unmodified Ray
Train function that owns its loop (``training.train_func: regress.raytrain:train_func``).

It calls nothing of spotwise's: it runs as is under a plain ``ray.train.torch.TorchTrainer``.
Under spotwise, its ``ray.train.report`` metrics ``step`` and ``loss`` are the run's progress and
loss, its checkpoints go to the run's storage, a stop (budget, cancel) ends it at its next report,
and ``ray.train.get_preemption_info()`` (or ``spotwise.train.preempting()``) tells it to report a
checkpoint before its node is reclaimed; the restarted group resumes from ``get_checkpoint()``.
"""

from __future__ import annotations

import os
import tempfile

import ray.train
import ray.train.torch
import torch
from torch import nn

from regress.train import Regressor


def _batch(step: int, rank: int, world: int, *, batch: int, features: int, seed: int, teacher: torch.Tensor):
    """This rank's slice of step ``step``'s global batch: a pure function of its arguments."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch, features, generator=g)
    y = torch.sin(x @ teacher)[:, None]
    per = batch // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def train_func(config: dict) -> None:
    features, width, depth = int(config.get("features", 8)), int(config.get("width", 32)), int(config.get("depth", 2))
    batch, lr, seed = int(config.get("batch", 32)), float(config.get("lr", 1e-2)), int(config.get("seed", 0))
    steps = int(config.get("steps", 300))
    report_every = int(config.get("report_every", 5))          # a report is a barrier: not every step
    checkpoint_every = int(config.get("checkpoint_every", 25))  # a multiple of report_every
    teacher = torch.randn(features, generator=torch.Generator().manual_seed(seed + 1))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()

    torch.manual_seed(seed)
    model = ray.train.torch.prepare_model(Regressor(features, width, depth))   # DDP over the group
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:                         # a restarted group: where the last report left it
        with checkpoint.as_directory() as d:           # any rank's file: DDP keeps the replicas equal
            name = sorted(f for f in os.listdir(d) if f.startswith("rank"))[0]
            state = torch.load(os.path.join(d, name), weights_only=True)
        getattr(model, "module", model).load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])

    saved_on_notice = False
    for step in range(start, steps):
        x, y = _batch(step, rank, world, batch=batch, features=features, seed=seed, teacher=teacher)
        loss = nn.functional.mse_loss(model(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        done = step + 1
        if done % report_every and done != steps:
            continue
        metrics = {"step": done, "loss": float(loss.detach())}
        notice = ray.train.get_preemption_info() is not None and not saved_on_notice
        if done % checkpoint_every == 0 or done == steps or notice:
            # every rank reports the checkpoint (its own file; Ray merges them into one directory):
            # while a node is being preempted Ray Train counts only the ranks that stay, so a
            # checkpoint that rank 0 alone reported would be dropped when rank 0's node is the one going
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": getattr(model, "module", model).state_dict(),
                            "optim": optim.state_dict(), "step": done}, os.path.join(d, f"rank{rank}.pt"))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            saved_on_notice |= notice
        else:
            ray.train.report(metrics)
