"""The one definition of a decoder's training FLOPs per token, shared by the model
(:meth:`spotwise.runtime.llama_config.LlamaConfig.train_flops_per_token`), the estimator and the
planner (:mod:`spotwise.pricing.estimate`, fitted on :mod:`spotwise.pricing.published_runs`),
``bench/bench_mfu.py`` and the MFU a run reports.

``6 * (N - E) + 12 * L * d * s``: 2 FLOPs per multiply-add forward and twice that backward for every
parameter that is a matmul weight (``N`` parameters less the ``E`` of the input embedding, a lookup),
plus attention's own matmuls (``QK^T`` and ``AV``: ``4 * s * d`` per layer per token forward, three
times that with the backward), over the full ``s x s`` score matrix as in the PaLM paper's appendix B
(``6N + 12·L·H·Q·T``), although a causal kernel skips about half. These are *model* FLOPs, what MFU
counts: activation checkpointing recomputes each block's forward in backward, which costs time
(:data:`RECOMPUTE_TIME_FACTOR`) but is not model work.
"""

from __future__ import annotations

#: forward is a third of forward + backward: recomputing it in backward takes 4/3 the time
RECOMPUTE_TIME_FACTOR = 4.0 / 3.0


def train_flops_per_token(*, params: float, embedding_params: float, n_layers: int, dim: int, seq_len: int) -> float:
    """Training model FLOPs per token (see the module docstring)."""
    if not 0 <= embedding_params <= params:
        raise ValueError(f"embedding_params ({embedding_params}) must be within [0, params ({params})]")
    return 6.0 * (params - embedding_params) + 12.0 * n_layers * dim * seq_len
