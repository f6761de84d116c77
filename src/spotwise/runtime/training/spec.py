"""What the Ray-free loop takes: :class:`TrainSpec`, the callables and mechanics of one training run.

A leaf of :mod:`spotwise.runtime`: the loop (:mod:`spotwise.runtime.training.loop`, which re-exports both
names, their public home) and the checkpoint schedule (:mod:`spotwise.runtime.training.saving`) both read
it, and neither imports the other for it — so the two modules form no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from spotwise.runtime.training.parallel import check_precision

Batch = Any



@dataclass(kw_only=True)
class TrainSpec:
    """How to train a model you bring: the Ray-free loop's input. Every callable must behave
    identically on every rank.

    Not the task file's :class:`~spotwise.runtime.config.TrainConfig`: that one declares *what*
    to train with the built-in model and data (and is validated like a task file); this one holds
    the callables and the loop's mechanics, some of which no task file sets (``grad_accum``,
    ``checkpoint_interval=None``, ``notice_window_s``). :func:`spotwise.runtime.training.builtin.gpt_spec`
    builds one from the other.

    model_fn: builds the model (same init on every rank: seed inside, or rely on ``seed``).
    batch_fn: ``(step, rank, world_size) -> batch`` for this rank; a PURE function of its
        arguments (this is what makes resume exact). A batch is a tensor or a tuple/list/dict
        of tensors with the sample dimension first; it is split into ``grad_accum`` micro-batches.
    loss_fn: ``(model, micro_batch) -> scalar loss``.
    optimizer_fn: ``(params) -> torch.optim.Optimizer``; or an object with ``for_model(model)``
        when it needs the parameters' names (the built-in
        :class:`~spotwise.runtime.training.optim.AdamWFactory`).
    lr_fn: optional ``step -> learning rate`` applied before each step (pure function of step).
    checkpoint_interval: steps between periodic checkpoints; ``None`` derives it from the
        Young/Daly optimum ``sqrt(2 * save_seconds * mtbi_s)`` once a save has been timed.
    async_save: periodic checkpoints are staged to host memory and written in the background
        (:mod:`spotwise.runtime.checkpoint.async_save`); preemption/stop/final saves are always synchronous.
    shard_blocks: optional ``model -> list of its submodules``: the FSDP2 units, each sharded on
        its own before the root (only one unit's full parameters exist at a time). Without it, a
        model's ``_no_split_modules`` (class names, as transformers models declare) chooses them,
        else ``model.blocks`` / the top-level ``ModuleList``s (:func:`spotwise.runtime.training.parallel.shard_units`).
    agree_interval_s: about how often the ranks agree on stop/preemption (one tiny all-reduce);
        rank 0 turns it into a step count from its step time and the agreement itself carries
        it, so every rank checks at the same steps. 0: every step.
    """

    model_fn: Callable[[], nn.Module]
    batch_fn: Callable[[int, int, int], Batch]
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor]
    optimizer_fn: Callable[[Any], torch.optim.Optimizer]
    steps: int
    seed: int = 0
    lr_fn: Callable[[int], float] | None = None
    shard_blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    checkpoint_interval: int | None = 20
    mtbi_s: float = 3600.0
    keep_last: int = 2
    precision: str = "auto"               # auto | bf16 | fp32 (parallel.resolve_precision)
    activation_checkpointing: bool = False
    compile: bool = False
    num_threads: int | None = 1           # CPU ranks only (fixed for exact resume); GPU ranks keep torch's default
    async_save: bool = True
    agree_interval_s: float = 0.5
    # the shortest interruption notice of the cloud(s) this runs on (AWS 120 s, GCP 30 s, Azure
    # >= 30 s): when a measured save does not fit in it, the just-in-time checkpoint cannot be
    # relied on, so periodic saves come often enough that a lost node loses at most about one
    # window of work (see :func:`spotwise.runtime.training.saving._bound_to_window`). None: no bound.
    notice_window_s: float | None = None
    # the held-out loss: ``(model, rank, world, device) -> loss`` (every rank calls it, all get the
    # same value), measured at step 0 of a fresh run, every ``eval_every`` steps and at the last
    eval_fn: Callable[[nn.Module, int, int, torch.device], float] | None = None
    eval_every: int | None = None
    # this many steps in a row with a non-finite loss or gradient norm (each skipped, not applied)
    # end the run without a checkpoint (:class:`spotwise.runtime.training.optim.NonFiniteGuard`);
    # None: no guard, every update is applied whatever it holds
    max_nonfinite_steps: int | None = 5
    # torch's deterministic algorithms and what CUDA needs for them
    # (:mod:`spotwise.runtime.training.determinism`); None: on for CPU, off on CUDA
    deterministic: bool | None = None
    # the throughput figures (tokens/s, model FLOPs/s and so MFU) the progress, curves and
    # /metrics show: global tokens one step trains, and training model FLOPs per token
    # (:mod:`spotwise.utils.flops`); the built-ins set both, a user spec may (None: not shown)
    tokens_per_step: int | None = None
    flops_per_token: float | None = None

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        check_precision(self.precision)
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if self.keep_last < 2:
            raise ValueError(f"keep_last must be >= 2 (a save in progress never replaces the last good one), got {self.keep_last}")
        if self.max_nonfinite_steps is not None and self.max_nonfinite_steps < 1:
            raise ValueError(f"max_nonfinite_steps must be >= 1 or None, got {self.max_nonfinite_steps}")
        if self.checkpoint_interval is not None and self.checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1 or None, got {self.checkpoint_interval}")
