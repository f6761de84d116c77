"""A Hugging Face Llama ``config.json`` as a :class:`~spotwise.runtime.llama_config.LlamaConfig` section (no torch).

``training.init_from`` names a directory in the Hugging Face Llama layout (``config.json`` and
``*.safetensors``, sharded with ``model.safetensors.index.json`` or one ``model.safetensors``), as
Meta's Llama 3 models and every derived Llama are distributed. Its ``config.json`` *is* the
architecture: :func:`section_from_hf` maps it onto spotwise's names, and :func:`merge_init_from`
puts it under what the task's ``training.model`` says, refusing a conflict (a flavor or a dimension
that differs from the file's) with an error naming both. Only ``seq_len`` (how long the training
windows are, not a property of the weights) is the task's to choose; it defaults to 2048, capped
by the file's ``max_position_embeddings``.

Both spellings of RoPE's parameters are read: the older top-level ``rope_theta`` plus
``rope_scaling`` (Meta's published files: ``{"rope_type": "llama3", "factor": 32.0,
"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}``) and
the newer ``rope_parameters`` (transformers 5 writes ``rope_theta`` inside it). A RoPE type other
than ``default`` and ``llama3``, biases, another activation than SiLU, or a ``head_dim`` other
than ``hidden_size / num_attention_heads`` are refused: the built-in Llama has none of them, and
loading such weights would train another model than the file's.
"""

from __future__ import annotations

import json
from typing import Any

from spotwise.runtime.llama_config import FLAVORS

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
#: optional in an ``init_from`` directory (``spotwise export`` writes it): ``{file name: sha256 hex}``
#: of every other file; each download is checked against it
SUMS_NAME = "sha256.json"
FIELD = "training.init_from"
#: the task's own choice even with init_from (not a property of the weights)
TASK_CHOSEN = ("seq_len", "flavor")
DEFAULT_SEQ_LEN = 2048

#: spotwise field <- config.json key
HF_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
           "n_kv_heads": "num_key_value_heads", "ffn_dim": "intermediate_size", "vocab_size": "vocab_size",
           "tie_embeddings": "tie_word_embeddings", "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta",
           "rope_scaling": "rope_scaling"}


class HFConfigError(ValueError):
    """A ``config.json`` this loader cannot honour, or one that conflicts with the task."""


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling section or None)`` from either spelling."""
    params = cfg.get("rope_parameters")
    scaling: Any
    if isinstance(params, dict) and "rope_theta" in params:
        theta, scaling = params["rope_theta"], params
    else:
        theta, scaling = cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling")
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise HFConfigError(f"rope_scaling {scaling!r}: a mapping (rope_type llama3) or null")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise HFConfigError(f"rope_type {kind!r}: the built-in Llama knows 'default' and 'llama3'")
    try:
        return float(theta), dict(factor=float(scaling["factor"]), low_freq_factor=float(scaling["low_freq_factor"]),
                                  high_freq_factor=float(scaling["high_freq_factor"]),
                                  original_max_positions=int(scaling["original_max_position_embeddings"]))
    except KeyError as e:
        raise HFConfigError(f"rope_scaling of type llama3 without {e.args[0]}") from None


def section_from_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """The architecture fields of a ``training.model`` section (spotwise's names) from a parsed
    ``config.json``; :class:`HFConfigError` naming the key for what the built-in Llama is not."""
    if cfg.get("model_type") != "llama":
        raise HFConfigError(f"model_type {cfg.get('model_type')!r}: a Llama config.json (model_type 'llama')")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise HFConfigError(f"{key} true: the built-in Llama has no biases")
    if cfg.get("hidden_act", "silu") != "silu":
        raise HFConfigError(f"hidden_act {cfg.get('hidden_act')!r}: the built-in Llama's MLP is SwiGLU ('silu')")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "vocab_size") if not isinstance(cfg.get(k), int)]
    if missing:
        raise HFConfigError(f"config.json lacks {', '.join(missing)} (integers)")
    theta, scaling = _rope(cfg)
    out: dict[str, Any] = dict(
        dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_heads=cfg["num_attention_heads"],
        n_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"], ffn_dim=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"], tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling)
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != out["dim"] // out["n_heads"]:
        raise HFConfigError(f"head_dim {head_dim} is not hidden_size / num_attention_heads "
                            f"({out['dim']} / {out['n_heads']}): the built-in Llama derives it")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def merge_init_from(given: dict[str, Any] | None, hf: dict[str, Any], *,
                    max_positions: int | None = None) -> dict[str, Any]:
    """The ``training.model`` section of a run that starts from ``init_from``: ``hf``'s architecture
    (:func:`section_from_hf`), plus the task's ``seq_len`` (else 2048, at most ``max_positions``).
    A flavor or a dimension in ``given`` that differs from the file's raises :class:`HFConfigError`
    naming both (``training.model.dim`` 128 against config.json's ``hidden_size`` 2048)."""
    given = dict(given or {})
    flavor = given.get("flavor")
    if flavor is not None and flavor not in FLAVORS:
        raise HFConfigError(f"training.model.flavor {flavor!r}: one of {', '.join(FLAVORS)}")
    implied = {**(FLAVORS[flavor] if flavor else {}), **given}
    conflicts = []
    for key, value in implied.items():
        if key in TASK_CHOSEN:
            continue
        if key not in hf:
            raise HFConfigError(f"training.model.{key}: not a field the weights leave open (with init_from the "
                                f"architecture is config.json's; the task may set {', '.join(TASK_CHOSEN)})")
        if value is None and hf[key] is None:
            continue
        if value is None or hf[key] is None or not _same(value, hf[key]):
            src = f"training.model.flavor {flavor!r} sets" if key not in given else "training.model sets"
            conflicts.append(f"{src} {key} {value!r}, init_from's config.json {HF_KEYS[key]} {hf[key]!r}")
    if conflicts:
        raise HFConfigError("conflicts with init_from: " + "; ".join(conflicts))
    seq_len = implied.get("seq_len", DEFAULT_SEQ_LEN if max_positions is None else min(DEFAULT_SEQ_LEN, max_positions))
    out = dict(hf, seq_len=seq_len)
    if flavor is not None:
        out["flavor"] = flavor
    return out


def read_hf_config(uri: str) -> dict[str, Any]:
    """The parsed ``config.json`` of the directory at ``uri`` (any storage URI); :class:`HFConfigError`
    when it is missing or not JSON."""
    from spotwise.runtime.storage.base import open_storage

    raw = open_storage(uri.rstrip("/")).get_bytes(CONFIG_NAME)
    if raw is None:
        raise HFConfigError(f"{uri}: no {CONFIG_NAME} (a directory in the Hugging Face Llama layout: config.json "
                            f"and {SINGLE_NAME} or {INDEX_NAME} with its shards)")
    try:
        cfg = json.loads(raw)
    except ValueError as e:
        raise HFConfigError(f"{uri}/{CONFIG_NAME}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{uri}/{CONFIG_NAME}: a JSON object")
    return cfg


def resolve_training(training: dict[str, Any]) -> dict[str, Any]:
    """A raw ``training:`` mapping with ``init_from`` whose ``model`` is filled from the directory's
    ``config.json`` (:func:`merge_init_from`); unchanged without ``init_from``. What a task file's
    loader calls before validation, so the run's stored spec carries the whole architecture."""
    uri = training.get("init_from")
    if not isinstance(uri, str):
        return training
    hf = read_hf_config(uri)
    section = section_from_hf(hf)
    model = training.get("model")
    if model is not None and not isinstance(model, dict):
        raise HFConfigError("training.model: a mapping")
    return {**training, "entrypoint": training.get("entrypoint", "llama"),
            "model": merge_init_from(model, section, max_positions=hf.get("max_position_embeddings"))}
