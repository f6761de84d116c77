"""``make_spec(config)``: a residual MLP learns a fixed random "teacher" function on data it makes.

The task file names this function (``training.entrypoint: regress.train:make_spec``) and passes
its ``training.config`` mapping as ``config``. What makes a run resumable bit for bit is that
``batch`` is a pure function of ``(step, rank, world)``: a resumed run sees exactly the batches
the interrupted one would have seen.
"""

from __future__ import annotations

import torch
from torch import nn

from spotwise.train import TrainSpec


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


class Regressor(nn.Module):
    """``blocks`` is a ModuleList: spotwise shards each block with FSDP2 on its own."""

    def __init__(self, features: int, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)                        # (batch, 1)


def make_spec(config: dict) -> TrainSpec:
    features = int(config.get("features", 8))
    width = int(config.get("width", 32))
    depth = int(config.get("depth", 2))
    batch = int(config.get("batch", 32))          # global batch: every rank takes its slice
    lr = float(config.get("lr", 1e-2))
    seed = int(config.get("seed", 0))
    teacher = torch.randn(features, generator=torch.Generator().manual_seed(seed + 1))

    def model() -> nn.Module:
        torch.manual_seed(seed)                   # the same initial weights on every rank
        return Regressor(features, width, depth)

    def batch_fn(step: int, rank: int, world: int):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        x = torch.randn(batch, features, generator=g)
        y = torch.sin(x @ teacher)[:, None]
        per = batch // world
        return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]

    def loss(m: nn.Module, b) -> torch.Tensor:
        x, y = b
        return nn.functional.mse_loss(m(x), y)

    return TrainSpec(model_fn=model, batch_fn=batch_fn, loss_fn=loss,
                     optimizer_fn=lambda params: torch.optim.AdamW(params, lr=lr),
                     steps=int(config.get("steps", 300)), seed=seed, precision="fp32",
                     checkpoint_interval=25)
