"""Published pre-training runs the estimator is checked against (GPU-hours the authors reported).

Each run gives the model size, tokens, GPU and the GPU-hours its authors published, with the
document that says so. ``bench/bench_estimate_accuracy.py`` prints the estimator's figure next to
each, and ``tests/pricing/test_estimate_accuracy.py`` fails when one leaves ±20 %.

The node count of these runs is not published per model. Both use 8 GPUs per node; we assume
:data:`ASSUMED_NODES` (2,048 GPUs, the cluster size Meta reported for LLaMA 65B; Llama 2/3 do not
say). The node term of the MFU model was fitted at this count, so it is an assumption of the fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotwise.utils.flops import train_flops_per_token

ASSUMED_NODES = 256


@dataclass(frozen=True, slots=True)
class PublishedRun:
    """A run and its model's shape: ``params`` is the exact parameter count of the published
    architecture (Llama 2 7B has 6.74e9), ``dim``, ``n_layers``, ``vocab`` and ``seq_len`` its
    published dimensions (the papers' tables; Llama 3's model card), from which
    :meth:`flops_per_token` counts what the MFU model is fitted on."""

    name: str
    params: float
    tokens: float
    accelerator: str
    gpu_hours: float                 # the figure the estimator is compared with
    gpu_hours_alt: float | None      # a second published figure for the same model, if any
    source: str
    dim: int = 0
    n_layers: int = 0
    vocab: int = 0
    seq_len: int = 0

    def flops_per_token(self) -> float:
        """Training model FLOPs per token: the one definition (:mod:`spotwise.utils.flops`)."""
        return train_flops_per_token(params=self.params, embedding_params=self.vocab * self.dim,
                                     n_layers=self.n_layers, dim=self.dim, seq_len=self.seq_len)


RUNS: tuple[PublishedRun, ...] = (
    PublishedRun("Llama 2 7B", 6.738e9, 2.0e12, "A100-80GB", 184_320, None,
                 "Touvron et al. 2023, Llama 2 paper, Table 2 (GPU hours, A100-80GB)",
                 dim=4096, n_layers=32, vocab=32000, seq_len=4096),
    PublishedRun("Llama 2 13B", 13.016e9, 2.0e12, "A100-80GB", 368_640, None,
                 "Touvron et al. 2023, Llama 2 paper, Table 2",
                 dim=5120, n_layers=40, vocab=32000, seq_len=4096),
    PublishedRun("Llama 2 70B", 68.977e9, 2.0e12, "A100-80GB", 1_720_320, None,
                 "Touvron et al. 2023, Llama 2 paper, Table 2",
                 dim=8192, n_layers=80, vocab=32000, seq_len=4096),
    PublishedRun("Llama 3 8B", 8.030e9, 15e12, "H100", 1.3e6, 1.46e6,
                 "Llama 3 model card (1.3M H100-80GB hours); Llama 3.1 model card (1.46M)",
                 dim=4096, n_layers=32, vocab=128256, seq_len=8192),
    PublishedRun("Llama 3 70B", 70.554e9, 15e12, "H100", 6.4e6, 7.0e6,
                 "Llama 3 model card (6.4M H100-80GB hours); Llama 3.1 model card (7.0M)",
                 dim=8192, n_layers=80, vocab=128256, seq_len=8192),
)
