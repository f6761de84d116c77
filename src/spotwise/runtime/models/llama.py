"""The built-in Llama: a decoder of the Llama architecture, written here (no download, no library).

Pre-norm blocks of RMSNorm, grouped-query causal self-attention with rotary position embeddings
(angles, cosines and the rotation itself computed in fp32 whatever the compute dtype) and a SwiGLU
MLP; no biases, no dropout (a step is a deterministic function of weights and batch); the output
head is its own matrix or, with ``tie_embeddings``, the input embedding's (both live in the root FSDP
unit, so the tie survives sharding). RoPE turns *consecutive* pairs of a head's features (Meta's
interleaved layout); the Hugging Face files use the rotate-half layout, which
:mod:`spotwise.runtime.weights.load` permutes on the way in and out. Blocks live in ``model.blocks``, the FSDP2 units.

Built on the meta device (:func:`build_llama`): no parameter has storage until
:func:`spotwise.runtime.training.parallel.parallelize` has sharded the model, then each parameter's *full*
value is drawn, one parameter at a time, from a generator seeded by ``(seed, parameter name)``
(:meth:`Llama.init_full`) and each rank keeps its shard. So an 8B model never sits whole on one
rank, and the initial weights are the same whatever the world size (exact resume and resharding
depend on it).
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from spotwise.runtime.llama_config import LlamaConfig, RopeScaling

INIT_STD = 0.02


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, normalised in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of shape ``[seq_len, head_dim / 2]``, fp32: angle ``pos * theta^(-2i/head_dim)``,
    the frequencies scaled by :func:`llama3_scale` when ``scaling`` is given."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv = llama3_scale(inv, scaling)
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def llama3_scale(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's RoPE frequency scaling (Meta's ``apply_scaling``, llama-models
    ``reference_impl/model.py``): a frequency whose wavelength exceeds ``original / low_freq_factor``
    is divided by ``factor``; one whose wavelength is below ``original / high_freq_factor`` kept; in
    between, a blend ``(1 - a) * f / factor + a * f`` with ``a = (original / wavelength - low) /
    (high - low)``, linear in the inverse wavelength."""
    wavelen = 2 * math.pi / inv
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    a = (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - a) * inv / s.factor + a * inv
    out = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, out)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs of ``x`` (``[batch, heads, seq, head_dim]``) in fp32; ``x``'s dtype back."""
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.hd, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # each key/value head serves n_heads / n_kv query heads: SDPA's enable_gqa broadcasts them
        # in the kernel instead of materialising repeated copies of k and v (torchtitan does the same)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        return self.wo(a.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)   # gate
        self.w3 = nn.Linear(dim, hidden, bias=False)   # up
        self.w2 = nn.Linear(hidden, dim, bias=False)   # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = SwiGLU(cfg.dim, cfg.ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids ``[batch, seq]`` to logits ``[batch, seq, vocab]``."""

    def __init__(self, cfg: LlamaConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than seq_len {self.cfg.seq_len}")
        cos, sin = rope_tables(t, self.cfg.head_dim, self.cfg.rope_theta, idx.device, self.cfg.rope_scaling)
        x = self.tok_embeddings(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.output(self.norm(x))

    def fsdp_root_units(self) -> list[list[nn.Module]]:
        """The FSDP units besides the blocks, as torchtitan splits the root: the embedding alone
        (gathered first, freed before the first block runs) and the final norm with the output head
        (gathered last); the root is then left with no parameters of its own, so nothing stays
        unsharded for the whole step (:func:`spotwise.runtime.training.parallel.apply_fsdp`). With
        ``tie_embeddings`` the embedding and the head are one parameter, which two units would each
        shard as their own (the tie broken, the matrix counted twice): they stay one unit."""
        if self.cfg.tie_embeddings:
            return [[self.tok_embeddings, self.norm, self.output]]
        return [[self.tok_embeddings], [self.norm, self.output]]

    def init_full(self, name: str, full: torch.Tensor) -> None:
        """Fill ``full`` (the whole, unsharded value of parameter ``name``) with its initial value:
        RMSNorm weights 1; the residual projections (``wo``, ``w2``) normal with std
        ``0.02 / sqrt(2 * n_layers)`` (GPT-2's scaling, so the residual stream does not grow with
        depth); every other matrix normal with std 0.02. Drawn from a generator seeded by
        ``(seed, name)`` alone: independent of the world size and of every other parameter."""
        if name.endswith("norm.weight"):
            full.fill_(1.0)
            return
        std = INIT_STD / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else INIT_STD
        g = torch.Generator(device=full.device)
        g.manual_seed(param_seed(self.seed, name))
        full.normal_(0.0, std, generator=g)


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed from ``(seed, name)`` (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big") >> 1


def build_llama(cfg: LlamaConfig, *, seed: int) -> Llama:
    """A Llama on the meta device (no storage): :func:`~spotwise.runtime.training.parallel.parallelize`
    shards it and then materialises it through :meth:`Llama.init_full`."""
    with torch.device("meta"):
        return Llama(cfg, seed=seed)
