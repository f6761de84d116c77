"""What one rank of a built-in model's run holds in memory, estimated before anything launches.

The planner (:mod:`spotwise.engine.plan.ranks`) refuses an offer whose GPUs cannot hold a rank of
the task, with these numbers, instead of letting the run die out of memory on paid GPUs. No torch
here: the estimate comes from the task's ``training:`` section alone.

The model of a rank under the loop's FSDP2 (:mod:`spotwise.runtime.training.parallel`), every
parameter sharded over the ``world`` ranks:

* **state**: fp32 master weights, fp32 gradients (reduce-scattered every micro-batch, so sharded:
  :func:`spotwise.runtime.training.loop.forward_backward_step`) and AdamW's two fp32 moments:
  ``16 * N / world`` bytes;
* **unit in flight**: the largest FSDP unit (a transformer block) gathered whole, twice (the one
  computing and the one prefetched) in the compute dtype, and its unsharded fp32 gradient before
  the reduce-scatter;
* **activations**: per micro-batch of ``batch_size / (world * grad_accum)`` sequences. Without
  activation checkpointing, ``17 * dim`` elements per token per layer in the compute dtype: the
  ``34 * s * b * h`` bytes per layer of Korthikanti et al., "Reducing Activation Recomputation in
  Large Transformer Models" (2022), eq. 1, at 2 bytes an element, without its ``5 * a * s / h``
  attention-score term, which SDPA's fused kernels do not keep. With it, each block keeps only its
  input (``dim`` elements per token per layer) and one block's activations exist during the
  recompute. Plus the output logits and their gradient in fp32 (``2 * vocab`` fp32 values per
  token), which for a large vocabulary outweigh a block.

An estimate, not a measurement: allocator fragmentation, the CUDA context (~0.5-1 GB), NCCL buffers
and the optimizer's temporaries come on top, hence :data:`USABLE` of the GPU's memory is what a
rank may plan to use.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotwise.runtime.config import ModelConfig, TrainConfig

GIB = 1 << 30
#: the share of a GPU's memory a rank's estimate may fill (the rest: CUDA context, allocator, NCCL)
USABLE = 0.9


@dataclass(frozen=True, slots=True)
class RankMemory:
    """Bytes one rank holds at its peak, by what holds them."""

    state: float
    unit: float
    activations: float

    @property
    def total(self) -> float:
        return self.state + self.unit + self.activations

    def describe(self) -> str:
        return (f"{self.total / GIB:.1f} GiB a GPU (weights, gradients and AdamW state {self.state / GIB:.1f}, "
                f"a block in flight {self.unit / GIB:.1f}, activations {self.activations / GIB:.1f})")


@dataclass(frozen=True, slots=True)
class _Shape:
    params: float
    unit_params: float
    n_layers: int
    dim: int
    vocab: int
    seq_len: int


def _shape(cfg: TrainConfig) -> _Shape | None:
    if cfg.user_code:
        return None
    llama = cfg.llama
    if llama is not None:
        d, kv = llama.dim, llama.n_kv_heads * llama.head_dim
        unit = 2 * d * d + 2 * d * kv + 3 * d * llama.ffn_dim + 2 * d
        return _Shape(float(llama.n_params()), float(unit), llama.n_layers, d, llama.vocab_size, llama.seq_len)
    m = cfg.model
    if not isinstance(m, ModelConfig):       # a llama section is read above
        return None
    unit = 12 * m.d_model ** 2
    params = m.n_layers * unit + m.vocab_size * m.d_model + m.seq_len * m.d_model
    return _Shape(float(params), float(unit), m.n_layers, m.d_model, m.vocab_size, m.seq_len)


def rank_memory(cfg: TrainConfig, world: int, *, on_gpu: bool = True) -> RankMemory | None:
    """The estimate for one of ``world`` ranks (module docstring); None for user code (its model
    and batches are its own). ``on_gpu``: ``precision: auto`` computes in bf16 there."""
    s = _shape(cfg)
    if s is None:
        return None
    compute = 4 if cfg.precision == "fp32" or (cfg.precision == "auto" and not on_gpu) else 2
    state = 16.0 * s.params / world
    unit = 2 * compute * s.unit_params + 4 * s.unit_params
    micro = cfg.batch_size / (world * cfg.grad_accum)
    tokens = max(1.0, micro) * s.seq_len
    if cfg.activation_checkpointing:
        per_token = compute * (s.n_layers * s.dim + 17 * s.dim)
    else:
        per_token = compute * 17 * s.dim * s.n_layers
    logits = 2 * 4 * s.vocab
    return RankMemory(state=state, unit=unit, activations=tokens * (per_token + logits))


def peak_memory(device) -> tuple[int, str]:
    """``(bytes, kind)``: what this process has used at most, as measured (beside the estimate of
    :func:`rank_memory`): on CUDA the caching allocator's peak of tensors allocated on ``device``
    (``torch.cuda.max_memory_allocated``, kind ``"cuda_allocated"``, what an out-of-memory error is
    about); on CPU the process's peak resident set (``getrusage``'s ``ru_maxrss``, KiB on Linux;
    kind ``"cpu_rss"``), which counts the interpreter and libraries too."""
    if getattr(device, "type", None) == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_rss"
