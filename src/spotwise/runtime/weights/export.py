"""A run's checkpoint as a Hugging Face Llama directory: ``config.json`` and safetensors shards.

What ``spotwise export`` writes, so a run's weights go to ``transformers``, an inference server or
the hub without a hand-written converter. The checkpoint (torch.distributed.checkpoint, one file
per rank) is read one tensor at a time (a DCP load of that one key, which reads only the byte
ranges of its shards), the tensor renamed (:func:`spotwise.runtime.weights.load.to_hf`), ``wq``/``wk``
permuted back to the rotate-half layout (:func:`~spotwise.runtime.weights.load.meta_to_hf`), cast to
the chosen dtype and streamed into its safetensors file. The safetensors header (shapes, dtypes,
offsets) is known from the checkpoint's metadata before any tensor is read, so each file is
written sequentially and no more than one tensor is in memory at a time. The format is the
safetensors specification's: 8 bytes of little-endian header length, the JSON header, the raw
little-endian tensor bytes in header order (huggingface/safetensors README, "Format").

Files: ``model.safetensors`` when everything fits one shard of ``shard_bytes`` (5 GB, as
``save_pretrained``), else ``model-0000K-of-0000N.safetensors`` with ``model.safetensors.index.json``
(``metadata.total_size`` and the ``weight_map``), as transformers writes them. A tied model has no
``lm_head``. Last, ``sha256.json`` (``{file name: sha256}`` of every other file): the directory used
as a later run's ``training.init_from`` has each download checked against it
(:mod:`spotwise.runtime.weights.cache`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch

from spotwise.runtime.data.tokens import file_sha256
from spotwise.runtime.weights.load import heads_of, hf_config_json, meta_to_hf, to_hf
from spotwise.runtime.weights.config import CONFIG_NAME, INDEX_NAME, SINGLE_NAME, SUMS_NAME

DTYPES = {"bf16": (torch.bfloat16, "BF16"), "fp16": (torch.float16, "F16"), "fp32": (torch.float32, "F32")}
SHARD_BYTES = 5 * 10**9


def _order(names: list[str]) -> list[str]:
    """HF's usual order: embedding, the layers in order, the final norm, the head."""
    def key(n: str) -> tuple[int, int, str]:
        if n.startswith("tok_embeddings"):
            return (0, 0, n)
        if n.startswith("blocks."):
            return (1, int(n.split(".")[1]), n)
        return (2 if n.startswith("norm") else 3, 0, n)
    return sorted(names, key=key)


def _plan(sizes: dict[str, tuple[list[int], int]], shard_bytes: int) -> list[list[str]]:
    """Tensors (spotwise names, in order) grouped into files of at most ``shard_bytes`` (a tensor
    larger than that gets a file of its own)."""
    files: list[list[str]] = [[]]
    used = 0
    for name, (_, nbytes) in sizes.items():
        if files[-1] and used + nbytes > shard_bytes:
            files.append([])
            used = 0
        files[-1].append(name)
        used += nbytes
    return files


def export_checkpoint(src: Path, cfg: Any, out: Any, *, dtype: str = "bf16", shard_bytes: int = SHARD_BYTES) -> dict:
    """Write the model of the DCP checkpoint directory ``src`` (a local copy; a model of the built-in
    Llama of ``cfg``) to the storage ``out`` in the HF layout; what was written (``files``,
    ``total_size``, ``dtype``). ``ValueError`` naming what is wrong for an unknown dtype or a
    checkpoint without the model's tensors."""
    from torch.distributed.checkpoint import load as dcp_load

    from spotwise.runtime.checkpoint.checkpointer import _safe_planner, _safe_reader

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    tdtype, st_name = DTYPES[dtype]
    meta = _safe_reader(str(src)).read_metadata().state_dict_metadata
    names = [k[len("model."):] for k in meta if k.startswith("model.")]
    if cfg.tie_embeddings:
        names = [n for n in names if n != "output.weight"]
    if not any(n == "tok_embeddings.weight" for n in names):
        raise ValueError(f"{src}: no model.tok_embeddings.weight: not a checkpoint of the built-in Llama")
    item = torch.tensor([], dtype=tdtype).element_size()
    sizes = {n: (list(meta[f"model.{n}"].size), item * int(torch.Size(meta[f"model.{n}"].size).numel()))
             for n in _order(names)}
    files = _plan(sizes, shard_bytes)
    single = len(files) == 1
    file_names = [SINGLE_NAME] if single else [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
                                               for i in range(len(files))]
    weight_map: dict[str, str] = {}
    sums: dict[str, str] = {}

    def put_bytes(name: str, data: bytes) -> None:
        sums[name] = hashlib.sha256(data).hexdigest()
        out.put_bytes(name, data)

    tmp = Path(tempfile.mkdtemp(prefix="spotwise-export-"))
    try:
        for fname, group in zip(file_names, files):
            header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
            offset = 0
            for n in group:
                shape, nbytes = sizes[n]
                header[to_hf(n)] = {"dtype": st_name, "shape": shape, "data_offsets": [offset, offset + nbytes]}
                offset += nbytes
                weight_map[to_hf(n)] = fname
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)
            path = tmp / fname
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(raw)))
                f.write(raw)
                for n in group:
                    m = meta[f"model.{n}"]
                    t = torch.empty(tuple(m.size), dtype=m.properties.dtype)
                    dcp_load({"model": {n: t}}, storage_reader=_safe_reader(str(src)), planner=_safe_planner(),
                             no_dist=True)
                    heads = heads_of(n, cfg.n_heads, cfg.n_kv_heads)
                    if heads is not None:
                        t = meta_to_hf(t, heads)
                    f.write(t.to(tdtype).contiguous().view(torch.uint8).numpy().tobytes())
                    del t
            sums[fname] = file_sha256(path)
            out.put_file(path, fname)
            path.unlink()
        total = sum(s for _, s in sizes.values())
        if not single:
            put_bytes(INDEX_NAME, (json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                  indent=2) + "\n").encode())
        conf = hf_config_json(cfg)
        conf["torch_dtype"] = conf["dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
        put_bytes(CONFIG_NAME, (json.dumps(conf, indent=2) + "\n").encode())
        out.put_bytes(SUMS_NAME, (json.dumps(sums, indent=2, sort_keys=True) + "\n").encode())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"files": [CONFIG_NAME, *([] if single else [INDEX_NAME]), *file_names, SUMS_NAME], "total_size": total,
            "dtype": dtype}


def export_run(storage: Any, cfg: Any, out: Any, *, step: int | None = None, dtype: str = "bf16",
               shard_bytes: int = SHARD_BYTES) -> dict:
    """Export the run whose checkpoints are in ``storage`` (its run storage): step ``step``, else the
    newest committed one. ``ValueError`` naming the steps there when ``step`` is not committed."""
    from spotwise.runtime.checkpoint.layout import committed_steps, step_dir

    steps = committed_steps(storage)
    if not steps:
        raise ValueError("the run has no committed checkpoint")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"step {step} has no committed checkpoint; committed: {', '.join(map(str, steps))}")
    key = step_dir(step)
    local = storage.local_path(key)
    staging = None
    if local is None:
        staging = Path(tempfile.mkdtemp(prefix=f"spotwise-export-{step}-"))
        for k in storage.list(key + "/"):
            rel = k[len(key) + 1:]
            if not rel.startswith("rng/"):
                storage.get_file(k, staging / rel)
        local = staging
    try:
        return {"step": step, **export_checkpoint(Path(local), cfg, out, dtype=dtype, shard_bytes=shard_bytes)}
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
