"""The built-in tasks, expressed through the public :class:`~spotwise.runtime.training.loop.TrainSpec` API
like any user task: ``tiny-gpt`` (the byte-level GPT, :func:`gpt_spec`) and ``llama``
(:func:`llama_spec`), both on stdlib text or on a token file (``training.data``,
:func:`spotwise.runtime.data.dataset.token_batches`); :func:`builtin_spec` picks by ``training.entrypoint``."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from spotwise.runtime.api import ModelConfig, TrainConfig
from spotwise.runtime.config import BUILTIN_ENTRYPOINTS, LLAMA_ENTRYPOINT
from spotwise.runtime.data.stdlib import batch_for, corpus_tensor
from spotwise.runtime.training.loop import TrainSpec
from spotwise.runtime.training.optim import AdamWFactory
from spotwise.runtime.models.gpt import build_gpt, lm_loss

MODELS = BUILTIN_ENTRYPOINTS
DATASETS = ("stdlib",)


def _batch(step: int, rank: int, world: int, *, seed: int, batch_size: int, seq_len: int):
    return batch_for(seed=seed, step=step, rank=rank, world_size=world, batch_size=batch_size,
                     seq_len=seq_len, tokens=corpus_tensor())


def _loss(model, batch) -> torch.Tensor:
    x, y = batch
    return lm_loss(model(x), y)


def _check(cfg: TrainConfig, entrypoint: str) -> None:
    if cfg.entrypoint != entrypoint:
        raise ValueError(f"model {cfg.entrypoint!r} is not {entrypoint!r}; built in: {', '.join(MODELS)}")
    if cfg.dataset not in DATASETS:
        raise ValueError(f"dataset {cfg.dataset!r} is not built in; allowed: {', '.join(DATASETS)}")


def _eval(cfg: TrainConfig, *, seq_len: int, vocab_size: int) -> dict[str, Any]:
    """``eval_fn`` and ``eval_every`` of ``training.eval`` (none without it)."""
    if cfg.eval is None:
        return {}
    from spotwise.runtime.training.evaluate import EvalTokens

    return dict(eval_fn=EvalTokens(cfg.eval.data, seq_len=seq_len, vocab_size=vocab_size),
                eval_every=cfg.eval.every_steps)


def _common(cfg: TrainConfig) -> dict[str, Any]:
    """The TrainSpec fields both built-ins take from the task as they are."""
    return dict(
        loss_fn=_loss,
        optimizer_fn=AdamWFactory(config=cfg.optimizer, lr=cfg.learning_rate),
        steps=cfg.steps,
        seed=cfg.seed,
        grad_clip=cfg.grad_clip,
        grad_accum=cfg.grad_accum,
        activation_checkpointing=cfg.activation_checkpointing,
        max_nonfinite_steps=cfg.max_nonfinite_steps,
        deterministic=cfg.deterministic,
        compile=cfg.compile,
        checkpoint_interval=cfg.checkpoint.interval_steps,
        keep_last=cfg.checkpoint.keep_last,
        precision=cfg.precision,
    )


def gpt_spec(cfg: TrainConfig, **overrides) -> TrainSpec:
    """A :class:`TrainSpec` for ``cfg`` (``overrides`` set or replace TrainSpec fields, e.g. grad_accum,
    or ``checkpoint_interval=None`` for the Young/Daly interval a task file cannot ask for)."""
    _check(cfg, "tiny-gpt")
    mc = cfg.model
    if not isinstance(mc, ModelConfig):      # the config validator builds a ModelConfig for tiny-gpt
        raise ValueError("training.model is not a tiny-gpt section")
    fields: dict[str, Any] = dict(
        model_fn=functools.partial(build_gpt, mc, seed=cfg.seed),
        batch_fn=_batches(cfg, seq_len=mc.seq_len, vocab_size=mc.vocab_size),
        **_eval(cfg, seq_len=mc.seq_len, vocab_size=mc.vocab_size),
        **_common(cfg),
        tokens_per_step=cfg.batch_size * mc.seq_len,
    )
    return TrainSpec(**{**fields, **overrides})


def _batches(cfg: TrainConfig, *, seq_len: int, vocab_size: int) -> Callable[[int, int, int], Any]:
    """A built-in's ``batch_fn``: ``(step, rank, world) -> (inputs, targets)``, a pure function of
    its arguments: windows of the task's token file when it names one (``training.data``), else the
    built-in byte corpus (ids < 256 fit every built-in vocabulary: llama's config refuses below 256)."""
    if cfg.data is not None:
        from spotwise.runtime.data.dataset import token_batches

        return token_batches(cfg.data, seq_len=seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
                             vocab_size=vocab_size)
    return functools.partial(_batch, seed=cfg.seed, batch_size=cfg.batch_size, seq_len=seq_len)


def llama_spec(cfg: TrainConfig, **overrides) -> TrainSpec:
    """A :class:`TrainSpec` for ``entrypoint: llama``: the model built on the meta device and
    materialised after sharding (:func:`spotwise.runtime.models.llama.build_llama`; with
    ``init_from``, from the HF directory's weights, :func:`spotwise.runtime.weights.load.build_from_hf`:
    the loop builds the model only for a fresh run, a resumed one loads its checkpoint over it), linear warmup over
    ``warmup_steps`` then cosine to ``min_lr_ratio * lr``; ``overrides`` as for :func:`gpt_spec`."""
    from spotwise.runtime.models.llama import build_llama
    from spotwise.runtime.training.optim import warmup_cosine

    _check(cfg, LLAMA_ENTRYPOINT)
    mc = cfg.llama
    if mc is None:      # the config validator builds a LlamaConfig for this entrypoint
        raise ValueError("training.model is not a llama section")
    if cfg.init_from is not None:
        from spotwise.runtime.weights.load import build_from_hf

        model_fn: Callable[[], Any] = functools.partial(build_from_hf, mc, cfg.init_from, seed=cfg.seed)
    else:
        model_fn = functools.partial(build_llama, mc, seed=cfg.seed)
    fields: dict[str, Any] = dict(
        model_fn=model_fn,
        batch_fn=_batches(cfg, seq_len=mc.seq_len, vocab_size=mc.vocab_size),
        lr_fn=functools.partial(warmup_cosine, lr=cfg.learning_rate, warmup=cfg.warmup_steps, total=cfg.steps,
                                min_ratio=cfg.min_lr_ratio),
        **_eval(cfg, seq_len=mc.seq_len, vocab_size=mc.vocab_size),
        **_common(cfg),
        tokens_per_step=cfg.batch_size * mc.seq_len,
        flops_per_token=mc.train_flops_per_token(),
    )
    return TrainSpec(**{**fields, **overrides})


def builtin_spec(cfg: TrainConfig, **overrides) -> TrainSpec:
    """The spec of ``cfg``'s built-in entrypoint (tiny-gpt or llama)."""
    if cfg.entrypoint == LLAMA_ENTRYPOINT:
        return llama_spec(cfg, **overrides)
    return gpt_spec(cfg, **overrides)
