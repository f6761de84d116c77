"""The built-in task: the byte-level GPT on stdlib text, or on a token file (``training.data``),
expressed through the public :class:`~spotwise.runtime.loop.TrainSpec` API like any user task."""

from __future__ import annotations

import functools
from typing import Any

import torch

from spotwise.runtime.api import TrainConfig
from spotwise.runtime.data import batch_for, corpus_tensor
from spotwise.runtime.loop import TrainSpec
from spotwise.runtime.model import build_gpt, lm_loss

MODELS = ("tiny-gpt",)
DATASETS = ("stdlib",)


def _batch(step: int, rank: int, world: int, *, seed: int, batch_size: int, seq_len: int):
    return batch_for(seed=seed, step=step, rank=rank, world_size=world, batch_size=batch_size,
                     seq_len=seq_len, tokens=corpus_tensor())


def _loss(model, batch) -> torch.Tensor:
    x, y = batch
    return lm_loss(model(x), y)


def _optimizer(params, *, lr: float, weight_decay: float):
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def gpt_spec(cfg: TrainConfig, **overrides) -> TrainSpec:
    """A :class:`TrainSpec` for ``cfg`` (``overrides`` set or replace TrainSpec fields, e.g. grad_accum,
    or ``checkpoint_interval=None`` for the Young/Daly interval a task file cannot ask for)."""
    if cfg.entrypoint not in MODELS:
        raise ValueError(f"model {cfg.entrypoint!r} is not built in; allowed: {', '.join(MODELS)}")
    if cfg.dataset not in DATASETS:
        raise ValueError(f"dataset {cfg.dataset!r} is not built in; allowed: {', '.join(DATASETS)}")
    mc = cfg.model
    batch_fn: Any = functools.partial(_batch, seed=cfg.seed, batch_size=cfg.batch_size, seq_len=mc.seq_len)
    if cfg.data is not None:
        from spotwise.runtime.dataset import token_batches

        batch_fn = token_batches(cfg.data, seq_len=mc.seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
                                 vocab_size=mc.vocab_size)
    fields: dict[str, Any] = dict(
        model_fn=functools.partial(build_gpt, mc, seed=cfg.seed),
        batch_fn=batch_fn,
        loss_fn=_loss,
        optimizer_fn=functools.partial(_optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay),
        steps=cfg.steps,
        seed=cfg.seed,
        grad_clip=cfg.grad_clip,
        checkpoint_interval=cfg.checkpoint.interval_steps,
        keep_last=cfg.checkpoint.keep_last,
        precision=cfg.precision,
    )
    return TrainSpec(**{**fields, **overrides})
