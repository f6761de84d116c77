"""The Hugging Face Llama layout, in and out: names, the q/k permutation, and reading one tensor at a time.

Names: ``model.embed_tokens`` is ``tok_embeddings``, ``model.layers.i`` is ``blocks.i`` (with
``self_attn.{q,k,v,o}_proj`` as ``attention.w{q,k,v,o}``, ``mlp.{gate,up,down}_proj`` as
``feed_forward.w{1,3,2}``, ``input_layernorm`` / ``post_attention_layernorm`` as
``attention_norm`` / ``ffn_norm``), ``model.norm`` is ``norm`` and ``lm_head`` is ``output``
(absent from the files of a model with tied embeddings).

The permutation: spotwise's RoPE (:func:`spotwise.runtime.models.llama.apply_rope`, Meta's
reference layout) turns *consecutive* feature pairs ``(2i, 2i+1)`` of a head by frequency ``i``;
transformers' ``rotate_half`` turns feature ``i`` with feature ``i + head_dim/2``. Meta's weights
were converted to the HF layout (transformers' ``convert_llama_weights_to_hf.py``, its ``permute``)
by reordering the rows of ``wq`` and ``wk`` within each head so that row ``2i`` goes to ``i`` and
``2i+1`` to ``i + head_dim/2``; :func:`hf_to_meta` undoes it (``view(heads, 2, head_dim/2, dim)
.transpose(1, 2)``) and :func:`meta_to_hf` redoes it. The scores ``q·k`` are the same in both
layouts, since both vectors' features move alike; ``wv``, ``wo`` and the rest are not permuted.

Loading (:class:`HFWeights`): :func:`spotwise.runtime.training.parallel.materialize` fills each
parameter after sharding. With ``init_from`` a rank reads only the rows of its own shard
(:meth:`HFWeights.rows`: ``safe_open(...).get_slice(name)[a:b]``, which copies just those bytes of
the mapped file): FSDP shards every parameter by rows, and the q/k permutation moves rows only
within a head, so the rows of the heads that overlap the shard are read, permuted, and cut to it.
A rank therefore holds no full tensor at all, only its shards (8B's embedding alone is 2 GB in
fp32, times 8 ranks a node). :meth:`HFWeights.__call__` reads a whole tensor, for a parameter that
is not row-sharded (one rank, or a placement other than FSDP's).
"""

from __future__ import annotations

import json
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch

from spotwise.runtime.weights.config import INDEX_NAME, SINGLE_NAME

#: True while the loop calls ``model_fn`` for a run that has a committed checkpoint, which it will
#: load over whatever the model starts with: a ``model_fn`` may then skip costly initial weights
#: (``init_from``'s download: a resumed run resumes from its own checkpoint, never from there)
RESUMING: ContextVar[bool] = ContextVar("spotwise_resuming", default=False)

_BLOCK = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
          "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
          "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
          "post_attention_layernorm": "ffn_norm"}
_TOP = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "output.weight"}
_HF_BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
_OURS_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)\.weight$")
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def to_ours(hf_name: str) -> str | None:
    """spotwise's parameter name for a tensor of the HF files (None: not a Llama weight, e.g.
    ``rotary_emb.inv_freq`` of old conversions)."""
    if hf_name in _TOP:
        return _TOP[hf_name]
    m = _HF_BLOCK.match(hf_name)
    if m and m.group(2) in _BLOCK:
        return f"blocks.{m.group(1)}.{_BLOCK[m.group(2)]}.weight"
    return None


def to_hf(name: str) -> str:
    """The HF name of spotwise's parameter ``name`` (``ValueError`` for one the layout lacks)."""
    for hf, ours in _TOP.items():
        if name == ours:
            return hf
    m = _OURS_BLOCK.match(name)
    if m:
        for hf, ours in _BLOCK.items():
            if m.group(2) == ours:
                return f"model.layers.{m.group(1)}.{hf}.weight"
    raise ValueError(f"{name}: not a parameter of the built-in Llama")


def hf_to_meta(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``wq``/``wk`` rows from the rotate-half layout to the interleaved one (see the module docstring)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def meta_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of :func:`hf_to_meta`."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def heads_of(name: str, n_heads: int, n_kv_heads: int) -> int | None:
    """How many heads' rows ``name`` holds when it is permuted (``wq``: n_heads, ``wk``: n_kv_heads)."""
    if name.endswith("attention.wq.weight"):
        return n_heads
    if name.endswith("attention.wk.weight"):
        return n_kv_heads
    return None


def weight_map(directory: Path) -> dict[str, str]:
    """HF tensor name -> the safetensors file holding it: the index's ``weight_map`` when sharded,
    else every tensor of ``model.safetensors``."""
    from safetensors import safe_open

    index = directory / INDEX_NAME
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    single = directory / SINGLE_NAME
    if not single.is_file():
        raise ValueError(f"{directory}: neither {INDEX_NAME} nor {SINGLE_NAME}")
    with safe_open(single, framework="pt") as f:
        return {k: SINGLE_NAME for k in f.keys()}


class HFWeights:
    """The ``init_full(name, full)`` of a Llama built from an HF directory: copies the file's tensor
    for ``name`` into ``full`` (see the module docstring). Every parameter must be in the files
    (``output.weight`` of a tied model is the embedding's, which named_parameters lists once)."""

    def __init__(self, directory: Path, *, n_heads: int, n_kv_heads: int) -> None:
        self.directory, self.n_heads, self.n_kv_heads = directory, n_heads, n_kv_heads
        self.files: dict[str, str] = {}
        for hf_name, file in weight_map(directory).items():
            ours = to_ours(hf_name)
            if ours is not None:
                self.files[ours] = file

    def _file(self, name: str) -> Path:
        file = self.files.get(name)
        if file is None:
            raise ValueError(f"{self.directory}: no tensor {to_hf(name)} (the model's {name})")
        return self.directory / file

    def read(self, name: str) -> torch.Tensor:
        """The tensor for spotwise's ``name``, in the interleaved layout, as the file stores it."""
        from safetensors import safe_open

        with safe_open(self._file(name), framework="pt") as f:
            t = f.get_tensor(to_hf(name))
        heads = heads_of(name, self.n_heads, self.n_kv_heads)
        return hf_to_meta(t, heads) if heads is not None and t.dim() == 2 else t

    def __call__(self, name: str, full: torch.Tensor) -> None:
        t = self.read(name)
        _check(name, list(t.shape), list(full.shape), t.dtype)
        full.copy_(t.to(full.dtype))

    def rows(self, name: str, out: torch.Tensor, start: int, shape: list[int]) -> None:
        """Fill ``out`` with rows ``[start, start + len(out))`` of ``name`` (interleaved layout), whose
        whole shape in the model is ``shape``, reading only those rows (and, for ``wq``/``wk``, the
        rest of the heads they belong to) from the file."""
        from safetensors import safe_open

        n = out.shape[0]
        with safe_open(self._file(name), framework="pt") as f:
            sl = f.get_slice(to_hf(name))
            _check(name, list(sl.get_shape()), shape, _ST_DTYPES.get(sl.get_dtype(), sl.get_dtype()))
            heads = heads_of(name, self.n_heads, self.n_kv_heads)
            if heads is None or len(shape) != 2:
                t = sl[start:start + n]
            else:
                per = shape[0] // heads
                h0, h1 = start // per, -(-(start + n) // per)
                t = hf_to_meta(sl[h0 * per:h1 * per], h1 - h0)[start - h0 * per:start - h0 * per + n]
        out.copy_(t.to(out.dtype))


_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _check(name: str, got: list[int], want: list[int], dtype: Any) -> None:
    if got != want:
        raise ValueError(f"tensor {to_hf(name)} has shape {got}, the model's {name} {want}")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"tensor {to_hf(name)} has dtype {dtype}: allowed are float32, bfloat16, float16")


def hf_config_json(cfg: Any) -> dict[str, Any]:
    """The ``config.json`` of a built-in Llama config (:class:`~spotwise.runtime.llama_config.LlamaConfig`),
    in the older spelling Meta's published files use (top-level ``rope_theta`` and ``rope_scaling``),
    which transformers 4 and 5 both read."""
    scaling = None
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        scaling = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                   "high_freq_factor": s.high_freq_factor, "original_max_position_embeddings": s.original_max_positions}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.dim,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "intermediate_size": cfg.ffn_dim,
            "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "rope_scaling": scaling, "max_position_embeddings": cfg.seq_len,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def build_from_hf(cfg: Any, uri: str, *, seed: int) -> torch.nn.Module:
    """The built-in Llama of ``cfg`` on the meta device whose ``init_full`` reads the HF directory at
    ``uri`` (fetched into this node's cache first): :func:`~spotwise.runtime.training.parallel.parallelize`
    then fills each rank's shards from the files. ``cfg`` must be the file's architecture (the task
    loader put it there, :func:`~spotwise.runtime.weights.config.resolve_training`); a conflict is
    a ``ValueError`` naming both. Built for a run that resumes (the loop's
    :data:`RESUMING`), it is the plain built-in Llama: the run's own
    checkpoint replaces its weights, and ``init_from`` is neither fetched nor read again."""
    from spotwise.runtime.weights.cache import fetch_model
    from spotwise.runtime.weights.config import CONFIG_NAME, merge_init_from, section_from_hf
    from spotwise.runtime.models.llama import build_llama

    if RESUMING.get():      # the loop loads the run's own checkpoint over it: no download
        return build_llama(cfg, seed=seed)
    directory = fetch_model(uri)
    hf = section_from_hf(json.loads((directory / CONFIG_NAME).read_text()))
    given = cfg.model_dump(exclude={"flavor", "seq_len"})
    merge_init_from(given, hf)
    model = build_llama(cfg, seed=seed)
    weights = HFWeights(directory, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads)
    model.init_full = weights  # type: ignore[method-assign]
    model.init_rows = weights.rows  # type: ignore[assignment]
    return model
