"""The task file's ``training.optimizer``: the built-in models' optimizer, declared and bounded here.

AdamW only for now (``name: adamw``; another name is refused naming the allowed ones). The
defaults are torchtitan's for Llama pretraining (``torchtitan/config/job_config.py``'s
``Optimizer``: betas (0.9, 0.95), eps 1e-8, weight decay 0.1), with the decay left off
what is not a matmul weight (norm scales, biases, embeddings), as Llama/GPT training recipes do:
decaying a norm's gain towards 0 or an embedding row that a batch never saw only hurts.
``lr`` here or the older ``training.lr`` (never both); ``fused`` None: torch's fused kernel on CUDA,
its default (foreach/for-loop) elsewhere. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: every optimizer ``training.optimizer.name`` may name
OPTIMIZERS = ("adamw",)


class OptimizerConfig(BaseModel):
    """``training.optimizer``: ``{name, lr, betas, weight_decay, eps, fused}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Literal["adamw"] = "adamw"
    # None: training.lr (the older key; giving both is refused by TrainConfig)
    lr: float | None = Field(default=None, gt=0, le=10.0)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(default=0.1, ge=0, le=10.0)
    eps: float = Field(default=1e-8, gt=0, le=1.0)
    fused: bool | None = None

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        for i, b in enumerate(v):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas[{i}] is {b}: each beta must be in [0, 1) (AdamW's moment decay rates)")
        return v
