"""The optimizer side of a step: the built-in AdamW, its state initialised without a phantom step,
the guard that skips a step whose loss or gradient norm is not finite, and the learning-rate
schedule (a pure function of the step, ``TrainSpec.lr_fn``, so resume is exact).

* :class:`AdamWFactory` is the built-in models' ``optimizer_fn``: it needs the parameters' names
  (weight decay only on matmul weights), so the loop hands it the model
  (:func:`build_optimizer`), where a user's ``optimizer_fn`` gets ``model.parameters()``.
* :func:`init_optimizer_state` gives an optimizer its state before the first step, for
  ``torch.distributed.checkpoint.state_dict.get_state_dict``: on an empty state that function
  (``_init_optim_state``) sets zero gradients and calls ``optim.step()`` with ``lr = 0``, which
  leaves the weights alone but counts a step: AdamW's first real update is then bias-corrected as
  its second, ``sqrt(1 + beta2) / (1 + beta1)`` of its size (0.74x with torch's default betas).
  We do the same initialisation and then put every ``step`` counter back to 0, so the state is
  exactly a fresh one (zero moments, no step): the first update is a plain AdamW's first update.
* :class:`NonFiniteGuard` decides, on every rank alike, whether a step's update is applied: a
  non-finite loss (on any rank) or gradient norm skips it (gradients dropped, weights, optimizer
  state and RNG untouched) and is counted; ``limit`` in a row end the run *without* a checkpoint,
  so the last good ones are never rotated out by a run that has gone NaN. The same all-reduce
  carries each rank's loss, so :attr:`NonFiniteGuard.mean_loss` is the step's training loss over
  all ranks (what the progress and the curves show) at no extra collective.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from spotwise.runtime.optim_config import OptimizerConfig

log = logging.getLogger("spotwise.runtime.training.loop")

#: a run ended by the guard: the job process and the standalone entry point exit with this
EXIT_DIVERGED = 3


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters AdamW must not decay: every parameter of fewer than two dimensions
    (norm scales, biases) and every parameter of an ``nn.Embedding`` (a lookup table, not a matmul)."""
    out = {n for n, p in model.named_parameters() if p.ndim < 2}
    for mname, m in model.named_modules():
        if isinstance(m, nn.Embedding):
            out.update(f"{mname}.{n}" if mname else n for n, _ in m.named_parameters(recurse=False))
    return out


@dataclass(frozen=True, slots=True)
class AdamWFactory:
    """The built-in ``optimizer_fn``: AdamW of ``config`` at learning rate ``lr`` over two
    parameter groups, decayed (matmul weights) and not (see :func:`no_decay_names`)."""

    config: OptimizerConfig
    lr: float

    def for_model(self, model: nn.Module) -> torch.optim.Optimizer:
        skip = no_decay_names(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return self._adamw([p for n, p in named if n not in skip], [p for n, p in named if n in skip])

    def __call__(self, params: Any) -> torch.optim.Optimizer:
        """Without the names (a caller with only ``params``): no decay on what has fewer than two
        dimensions; an embedding cannot be told from a matmul weight here, and is decayed."""
        ps = [p for p in params if p.requires_grad]
        return self._adamw([p for p in ps if p.ndim >= 2], [p for p in ps if p.ndim < 2])

    def _adamw(self, decay: list, plain: list) -> torch.optim.Optimizer:
        groups = [g for g in ({"params": decay, "weight_decay": self.config.weight_decay},
                              {"params": plain, "weight_decay": 0.0}) if g["params"]]
        on_cuda = any(p.device.type == "cuda" for p in decay + plain)
        fused = self.config.fused if self.config.fused is not None else (True if on_cuda else None)
        return torch.optim.AdamW(groups, lr=self.lr, betas=self.config.betas, eps=self.config.eps, fused=fused)


def build_optimizer(optimizer_fn: Any, model: nn.Module) -> torch.optim.Optimizer:
    """``optimizer_fn.for_model(model)`` for a factory that needs names, else ``optimizer_fn(model.parameters())``."""
    for_model = getattr(optimizer_fn, "for_model", None)
    if callable(for_model):
        return for_model(model)
    return optimizer_fn(model.parameters())


def init_optimizer_state(optim: torch.optim.Optimizer) -> None:
    """Give an optimizer with no state its state, as a fresh optimizer's first step would find it
    (see the module docstring); an optimizer that has state, or whose parameters hold gradients
    (a step under way), is left alone, as torch's own initialisation leaves it."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g["params"]]
    if any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optim.param_groups]
    for g in optim.param_groups:
        g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    try:
        optim.step()
    finally:
        for g, lr in zip(optim.param_groups, lrs):
            g["lr"] = lr
        optim.zero_grad(set_to_none=True)
    for st in optim.state.values():
        if "step" in st:
            st["step"] = torch.zeros_like(st["step"]) if isinstance(st["step"], torch.Tensor) else 0


class Diverged(RuntimeError):
    """``limit`` steps in a row had a non-finite loss or gradient norm."""


@dataclass(slots=True)
class NonFiniteGuard:
    """Counts skipped steps; see the module docstring. ``limit``: how many in a row end the run."""

    limit: int
    skipped: int = 0                      # every step skipped so far in this attempt
    streak: int = 0                       # the current run of consecutive skipped steps
    last: dict = field(default_factory=dict)
    mean_loss: float = math.nan           # the last step's loss averaged over all ranks

    def apply(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether the update of ``step`` (0-based) is applied. Collective when a process group is
        up (one 3-element all-reduce: a rank's loss is its own, the gradient norm is global); sets
        :attr:`mean_loss`. Raises :class:`Diverged` on the ``limit``-th skipped step in a row."""
        own = loss.detach().to(torch.float64)
        bad = torch.stack([(~torch.isfinite(own)).to(torch.float64),
                           (~torch.isfinite(grad_norm.detach())).to(torch.float64), own])
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world > 1:
            dist.all_reduce(bad)          # sums: a flag > 0 on any rank is > 0 here
        loss_bad, norm_bad = bool(bad[0].item()), bool(bad[1].item())
        self.mean_loss = float(bad[2].item()) / world
        if not (loss_bad or norm_bad):
            self.streak = 0
            return True
        self.skipped += 1
        self.streak += 1
        self.last = {"step": step + 1, "loss": _num(loss), "grad_norm": _num(grad_norm)}
        log.warning("step %d: %s is not finite (loss %s, gradient norm %s): update skipped (%d in a row, %d in all)",
                    step + 1, "the loss" if loss_bad else "the gradient norm", self.last["loss"],
                    self.last["grad_norm"], self.streak, self.skipped)
        if self.streak >= self.limit:
            raise Diverged(f"training diverged: {self.streak} steps in a row (to step {step + 1}) had a non-finite "
                           f"loss or gradient norm (last: loss {self.last['loss']}, gradient norm "
                           f"{self.last['grad_norm']}; training.max_nonfinite_steps: {self.limit}); stopped "
                           "without a checkpoint, so the last good ones are kept: lower training.lr or fix the "
                           "data, then resume")
        return False


def _num(t: torch.Tensor) -> float | str:
    v = float(t.detach().float().sum())
    return v if math.isfinite(v) else str(v)


def warmup_cosine(step: int, *, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps (step 0 trains at ``lr / warmup``), then a
    cosine from ``lr`` down to ``min_ratio * lr`` at step ``total - 1``; ``min_ratio * lr`` after."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - 1 - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    low = min_ratio * lr
    return low + 0.5 * (lr - low) * (1.0 + math.cos(math.pi * progress))
