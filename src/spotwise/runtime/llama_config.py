"""The built-in Llama's shape: the task file's ``training.model`` when ``training.entrypoint: llama``.

A section is either a named ``flavor`` (``debug | 125m | 1b | 8b | llama3.2-1b | llama3.1-8b``), or explicit dimensions, or
a flavor with some of its dimensions replaced (``{flavor: 1b, seq_len: 512}``). Without a
flavor, ``dim``, ``n_layers`` and ``n_heads`` are required; ``n_kv_heads`` then defaults to
``n_heads`` (plain multi-head attention), ``ffn_dim`` to Llama's rule (``8/3 * dim`` rounded up to
a multiple of 256), ``vocab_size`` to 256 (bytes), ``seq_len`` to 2048 and ``rope_theta`` to 10000.
After validation every field holds its resolved value, so the section round-trips through JSON.

The sizes are arithmetic here (no torch): :meth:`LlamaConfig.n_params` is the exact parameter
count of :class:`spotwise.runtime.models.llama.Llama` (a test holds the two equal) and
:meth:`LlamaConfig.train_flops_per_token` what the estimator prices.

Two flavors are the published models, exactly: ``llama3.2-1b`` (1,235,814,400 parameters: tied
embeddings, vocabulary 128,256, RoPE theta 5e5 with the llama3 scaling of factor 32) and
``llama3.1-8b`` (8,030,261,248: untied, factor 8), with Meta's ``params.json`` /
Hugging Face ``config.json`` values (meta-llama/Llama-3.2-1B and Llama-3.1-8B), so their weights
load into them (:mod:`spotwise.runtime.weights.load`). The others are spotwise's, Llama-shaped:
``8b`` is Llama 3 8B's shape without 3.1's RoPE scaling; ``1b`` (1.1e9) and ``125m`` (1.25e8)
are Llama-2-vocabulary models of those sizes with grouped-query attention; ``debug`` (~4.6e5)
trains in seconds on one CPU core.

``rope_scaling`` is the llama3 frequency scaling of Llama 3.1 and later (Meta's
``apply_scaling`` in llama-models' ``reference_impl/model.py``; transformers'
``_compute_llama3_parameters``): wavelengths longer than ``original_max_positions /
low_freq_factor`` are stretched by ``factor``, those shorter than ``original_max_positions /
high_freq_factor`` kept, and those between interpolated smoothly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotwise.utils.flops import train_flops_per_token

#: Llama 3.1 / 3.2's published RoPE scaling (config.json's ``rope_scaling``), less the factor
LLAMA3_SCALING = dict(low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)

FLAVORS: dict[str, dict[str, Any]] = {
    "debug": dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=384, vocab_size=256, seq_len=128,
                  rope_theta=10000.0),
    "125m": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32000, seq_len=2048,
                 rope_theta=10000.0),
    "1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=32000, seq_len=2048,
               rope_theta=10000.0),
    "8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256, seq_len=8192,
               rope_theta=500000.0),
    "llama3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
                        seq_len=8192, rope_theta=500000.0, tie_embeddings=True,
                        rope_scaling=dict(factor=32.0, **LLAMA3_SCALING)),
    "llama3.1-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
                        seq_len=8192, rope_theta=500000.0, rope_scaling=dict(factor=8.0, **LLAMA3_SCALING)),
}
FLAVOR_NAMES = Literal["debug", "125m", "1b", "8b", "llama3.2-1b", "llama3.1-8b"]
FFN_MULTIPLE = 256


def llama_ffn_dim(dim: int) -> int:
    """Llama's SwiGLU width for ``dim``: two thirds of ``4 * dim``, rounded up to a multiple of 256."""
    hidden = (8 * dim) // 3
    return FFN_MULTIPLE * ((hidden + FFN_MULTIPLE - 1) // FFN_MULTIPLE)


class RopeScaling(BaseModel):
    """The llama3 RoPE frequency scaling (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_positions: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor "
                             f"({self.low_freq_factor})")
        return self


class LlamaConfig(BaseModel):
    """A Llama decoder's dimensions (see the module docstring for flavors and defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    flavor: FLAVOR_NAMES | None = None
    dim: int = Field(default=0, ge=16, le=65536)
    n_layers: int = Field(default=0, ge=1, le=512)
    n_heads: int = Field(default=0, ge=1, le=512)
    n_kv_heads: int = Field(default=0, ge=1, le=512)
    ffn_dim: int = Field(default=0, ge=1, le=1 << 20)
    # >= 256: the built-in corpus is bytes (a token file of its own vocabulary will relax this)
    vocab_size: int = Field(default=256, ge=256, le=1 << 24)
    seq_len: int = Field(default=2048, ge=8, le=1 << 20)
    rope_theta: float = Field(default=10000.0, gt=0)
    rope_scaling: RopeScaling | None = None
    # the output head is the input embedding's matrix (Llama 3.2 1B and 3B)
    tie_embeddings: bool = False
    norm_eps: float = Field(default=1e-5, gt=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        """Fill the flavor's dimensions under the explicit ones, and the defaults that follow from
        ``dim`` and ``n_heads``; an unknown flavor or a missing dimension is left for the field
        validators (their error names the field)."""
        if not isinstance(data, dict):
            return data
        flavor = data.get("flavor")
        out: dict[str, Any] = dict(FLAVORS.get(flavor, {})) if isinstance(flavor, str) else {}
        out.update(data)
        if out.get("flavor") is None:
            missing = [k for k in ("dim", "n_layers", "n_heads") if k not in out]
            if missing:
                raise ValueError(f"give flavor (one of {', '.join(FLAVORS)}) or the dimensions: "
                                 f"{', '.join(missing)} missing")
        if isinstance(out.get("n_heads"), int):
            out.setdefault("n_kv_heads", out["n_heads"])
        dim = out.get("dim")
        if isinstance(dim, int):
            out.setdefault("ffn_dim", llama_ffn_dim(dim))
        return out

    @model_validator(mode="after")
    def _shape(self) -> LlamaConfig:
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                             "each key/value head serves a whole group of query heads")
        if self.head_dim % 2:
            raise ValueError(f"dim / n_heads ({self.head_dim}) must be even: rotary embeddings turn pairs")
        return self

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def n_params(self) -> int:
        """Exact parameter count: embedding and output head (one matrix when tied), per block the four attention
        projections (``wk``/``wv`` are ``n_kv_heads * head_dim`` wide), the three SwiGLU matrices
        and two RMSNorm weights, and the final RMSNorm. No biases."""
        d, kv = self.dim, self.n_kv_heads * self.head_dim
        attn = 2 * d * d + 2 * d * kv
        mlp = 3 * d * self.ffn_dim
        block = attn + mlp + 2 * d
        return (1 if self.tie_embeddings else 2) * self.vocab_size * d + self.n_layers * block + d

    def train_flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward): ``6 * (N - embeddings) + 12 * L * dim * seq``,
        :func:`spotwise.utils.flops.train_flops_per_token` (the one definition; its docstring says why).
        The input embedding is a lookup, not a matmul; tied, its one matrix is the output head's, a
        matmul, so nothing is subtracted."""
        return train_flops_per_token(params=self.n_params(),
                                     embedding_params=0 if self.tie_embeddings else self.vocab_size * self.dim,
                                     n_layers=self.n_layers, dim=self.dim, seq_len=self.seq_len)
