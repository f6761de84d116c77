"""Training data: byte-level text of Python's own standard library, and the batch for a step.

Why the stdlib: it exists on every machine that can run spotwise, so a worker never downloads a
data set and every node of a cluster sees the same bytes (same interpreter build).

Contract: the batch a rank trains on at a step is a PURE FUNCTION of
``(seed, step, rank, world_size)`` (plus the corpus and the shapes). Nothing in the data path
carries state from one step to the next, so resuming at step ``s`` feeds exactly the batches an
uninterrupted run would have fed; the "data position" of a checkpoint is just its step.

The global batch of a step is drawn first (``batch_size`` window offsets from a generator seeded
with ``(seed, step)``) and each rank takes a contiguous slice of it, so the data of a step does not
depend on the world size: a run resharded from 2 ranks to 1 trains on the same sequences.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

#: Upper bound on the corpus size; the first files in sorted order are kept whole.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


def _stdlib_files() -> list[Path]:
    """Every ``.py`` file under the stdlib directory (not site-packages), sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in filenames:
            if f.endswith(".py"):
                files.append(Path(dirpath) / f)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _cache_dir() -> Path:
    base = os.environ.get("SPOTWISE_CACHE") or os.path.join(Path.home(), ".cache", "spotwise")
    return Path(base)


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The concatenated stdlib sources, capped at ``max_bytes``; cached in memory and on disk.

    The on-disk cache is keyed by the stdlib path, the Python version and the cap, and written
    atomically (temp file + rename), so concurrent workers on one machine never read a torn file.
    """
    root = sysconfig.get_paths()["stdlib"]
    import sys

    key = hashlib.sha256(f"{root}|{sys.version}|{max_bytes}".encode()).hexdigest()[:16]
    path = _cache_dir() / f"stdlib-corpus-{key}.bin"
    try:
        data = path.read_bytes()
        if data:
            return data
    except OSError:
        pass
    parts, total = [], 0
    for f in _stdlib_files():
        try:
            b = f.read_bytes()
        except OSError:
            continue
        if total + len(b) > max_bytes:
            break
        parts.append(b)
        total += len(b)
    data = b"".join(parts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass
    return data


@functools.lru_cache(maxsize=4)
def corpus_tensor(max_bytes: int = DEFAULT_MAX_BYTES) -> torch.Tensor:
    """The corpus as a uint8 tensor (shared, read-only by convention)."""
    return torch.frombuffer(bytearray(stdlib_corpus(max_bytes)), dtype=torch.uint8)


def global_offsets(*, seed: int, step: int, batch_size: int, seq_len: int, n_tokens: int) -> np.ndarray:
    """Start offsets of the ``batch_size`` windows of a step (pure function of seed and step)."""
    if n_tokens <= seq_len + 1:
        raise ValueError(f"corpus has {n_tokens} tokens; need more than seq_len + 1 = {seq_len + 1}")
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, step]))
    return rng.integers(0, n_tokens - seq_len - 1, size=batch_size, dtype=np.int64)


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of a global batch; the batch must divide evenly."""
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not divisible by world size {world_size}")
    per = batch_size // world_size
    return slice(rank * per, (rank + 1) * per)


def batch_for(
    *, seed: int, step: int, rank: int, world_size: int, batch_size: int, seq_len: int,
    tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` int64 tensors of shape ``[batch_size // world_size, seq_len]``.

    ``targets`` are ``inputs`` shifted by one byte (next-byte prediction).
    """
    tokens = corpus_tensor() if tokens is None else tokens
    offs = global_offsets(seed=seed, step=step, batch_size=batch_size, seq_len=seq_len,
                          n_tokens=int(tokens.numel()))[rank_slice(batch_size, rank, world_size)]
    idx = torch.from_numpy(offs)[:, None] + torch.arange(seq_len + 1)[None, :]
    window = tokens[idx].long()
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()
