"""Learning-rate schedules: pure functions of the step (``TrainSpec.lr_fn``), so resume is exact."""

from __future__ import annotations

import math


def warmup_cosine(step: int, *, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps (step 0 trains at ``lr / warmup``), then a
    cosine from ``lr`` down to ``min_ratio * lr`` at step ``total - 1``; ``min_ratio * lr`` after."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - 1 - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    low = min_ratio * lr
    return low + 0.5 * (lr - low) * (1.0 + math.cos(math.pi * progress))
