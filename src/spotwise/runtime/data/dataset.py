"""Training on a token file (``training.data.uri``): the check before launch, and the batch of a step.

A built-in model gets its batches from one function, :func:`token_batches`, which returns the
``batch_fn(step, rank, world_size)`` of a :class:`~spotwise.runtime.training.spec.TrainSpec`. On first use in
a process it fetches the file into the node's cache (:mod:`spotwise.runtime.data.cache`: once per
node, verified against the sha256 in ``meta.json``) and memory-maps it.

How batches are drawn, and why resume stays exact. The file is cut into ``W = token_count //
(seq_len + 1)`` non-overlapping windows of ``seq_len + 1`` tokens (the tail shorter than a window
is never used); a window gives the inputs (its first ``seq_len`` tokens) and the targets (its last
``seq_len``). Sample ``j`` of the run (``j = step * batch_size + i`` for the ``i``-th sequence of
a step's global batch) is window ``perm_e(j mod W)`` of epoch ``e = j // W``, where ``perm_e`` is a
permutation of ``0..W-1`` seeded by ``(seed, e)``. So every epoch visits every window once, in an
order of its own, and the batch of a step is a pure function of ``(seed, step)``: nothing is
carried from step to step, and a run resumed at step ``s`` reads what an uninterrupted one would
have. Each rank takes its contiguous slice of the global batch (as
:func:`spotwise.runtime.data.stdlib.batch_for` does), so 2 ranks see together exactly what 1 rank sees.

The permutation is a keyed Feistel network on the smallest even power of two ``>= W``, walked
until it lands below ``W`` (cycle walking): a bijection that costs O(1) memory and a few integer
operations per sample, whatever the size of the file (a stored shuffle of 10^9 windows would
take 8 GB per rank).

Nothing here imports torch at module level: the pre-launch check runs in the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotwise.errors import InputError, Problem
from spotwise.runtime.config import BUILTIN_ENTRYPOINT, LLAMA_ENTRYPOINT, DataConfig, ModelConfig, TrainConfig
from spotwise.runtime.data.cache import FIELD, fetch, pin_problem, read_meta, split_uri
from spotwise.runtime.data.tokens import DTYPES, META_NAME, TokenFile, check_token_meta

FEISTEL_ROUNDS = 6
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class DataNeeds:
    """What a model takes from a token file: ids below ``vocab_size``, stored as one of
    ``dtypes``, and at least one global batch of ``batch_size`` windows of ``seq_len + 1`` tokens."""

    vocab_size: int
    seq_len: int
    batch_size: int
    dtypes: tuple[str, ...] = tuple(DTYPES)
    vocab_hint: str = ""          # how to make a file that fits, for the vocabulary's message

    @property
    def window(self) -> int:
        return self.seq_len + 1


def data_needs(cfg: TrainConfig) -> DataNeeds | None:
    """What the built-in model of ``cfg`` needs of its token file (a built-in added later adds its
    vocabulary and sequence length here); None for a user's entrypoint, whose vocabulary and
    sequence length are known only when its make_spec calls :func:`bound_batches` on a node."""
    if cfg.user_code:
        return None
    if cfg.entrypoint == BUILTIN_ENTRYPOINT:
        return DataNeeds(vocab_size=ModelConfig.vocab_size, seq_len=cfg.model.seq_len, batch_size=cfg.batch_size,
                         vocab_hint=f"{BUILTIN_ENTRYPOINT} reads bytes: `spotwise data tokenize` without --eod")
    if cfg.entrypoint == LLAMA_ENTRYPOINT and cfg.llama is not None:
        return DataNeeds(vocab_size=cfg.llama.vocab_size, seq_len=cfg.llama.seq_len, batch_size=cfg.batch_size,
                         vocab_hint="set training.model.vocab_size to the tokenizer's (or a larger) size")
    raise ValueError(f"training.data is read by the built-in models only, not {cfg.entrypoint!r}")


def meta_problems(uri: str, meta: dict, needs: DataNeeds | None, *, file_size: int | None = None) -> list[Problem]:
    """Why the token file at ``uri`` (described by ``meta``) cannot train a model with ``needs``
    (None: any model, so only the meta and the file itself are checked); empty when it can. Each
    problem names ``training.data.uri`` and says what is allowed."""
    probs = [Problem(FIELD, uri, f"a token file with a valid {META_NAME} ({p})")
             for p in check_token_meta(meta, file_size=file_size)]
    _, name = split_uri(uri)
    if meta.get("tokens_file") not in (None, name):
        probs.append(Problem(FIELD, uri, f"the token file its {META_NAME} describes ({meta.get('tokens_file')!r}), "
                                         f"not {name!r}"))
    if needs is None:
        return probs
    vocab = meta.get("vocab_size")
    if isinstance(vocab, int) and vocab > needs.vocab_size:
        hint = f"; {needs.vocab_hint}" if needs.vocab_hint else ""
        probs.append(Problem(FIELD, uri, f"token ids below the model's vocabulary of {needs.vocab_size} (its "
                                         f"{META_NAME} says vocab_size {vocab}: tokenized for another model?{hint})"))
    dtype = meta.get("dtype")
    if dtype in DTYPES and dtype not in needs.dtypes:
        probs.append(Problem(FIELD, uri, f"tokens stored as {' or '.join(needs.dtypes)} (this model cannot take "
                                         f"{dtype})"))
    count = meta.get("token_count")
    if isinstance(count, int) and not isinstance(count, bool) and count // needs.window < needs.batch_size:
        probs.append(Problem(FIELD, uri, f"a token file of at least {needs.batch_size * needs.window} tokens: one "
                                         f"global batch (training.batch_size {needs.batch_size}) of windows of "
                                         f"training.model.seq_len + 1 = {needs.window} tokens; it has {count}"))
    return probs


def check_data(uri: str, needs: DataNeeds | None, *, sha256: str | None = None) -> dict:
    """The pre-launch check of the token file at ``uri``: its ``meta.json`` is read and checked
    against ``needs`` (None: a user's model, checked on its node) and the pinned ``sha256`` when
    given, and the token file's presence and
    size are asked of the store (a HEAD on S3); the file itself is not downloaded. Returns the
    meta; raises :class:`InputError`."""
    from spotwise.runtime.storage.base import open_storage

    parent, name = split_uri(uri)
    store = open_storage(parent)
    meta = read_meta(uri, store)
    probs = meta_problems(uri, meta, needs)
    pinned = pin_problem(uri, meta, sha256)
    if pinned is not None:
        probs.append(pinned)
    if not probs:
        if not store.has(name):
            probs.append(Problem(FIELD, uri, f"an existing token file (its {META_NAME} is there, the file is not)"))
        elif not store.has(name, size=meta["size_bytes"]):
            probs.append(Problem(FIELD, uri, f"a token file of the {meta['size_bytes']} bytes its {META_NAME} says "
                                             f"({meta['token_count']} {meta['dtype']} tokens): it has another size "
                                             "(truncated, or written with another dtype?)"))
    if probs:
        raise InputError(probs, source="data")
    return meta


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """A 64-bit mixing function of ``x`` and ``key`` (splitmix64's finaliser); wraps mod 2^64."""
    z = (x ^ key) * np.uint64(0x9E3779B97F4A7C15) & _M64
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9) & _M64
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB) & _M64
    return z ^ (z >> np.uint64(31))


class WindowOrder:
    """The seeded permutations of ``n`` windows, one per epoch: :meth:`__call__` maps positions
    ``j`` (any integers >= 0, epoch ``j // n``) to window indices. A pure function of
    ``(seed, n, j)``; every epoch's map is a bijection of ``0..n-1``."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n, self.seed = n, seed
        bits = max(2, int(n - 1).bit_length())
        self.half = np.uint64((bits + 1) // 2)
        self.mask = np.uint64((1 << int(self.half)) - 1)

    def _keys(self, epoch: int) -> list[np.uint64]:
        base = np.array([(self.seed * 0x632BE59BD9B4E019 + epoch) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
        return [np.uint64(_mix(base, np.uint64(r + 1))[0]) for r in range(FEISTEL_ROUNDS)]

    def _feistel(self, x: np.ndarray, keys: list[np.uint64]) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in keys:
            left, right = right, left ^ (_mix(right, k) & self.mask)
        return (left << self.half) | right

    def epoch(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Window indices of ``positions`` (each in ``0..n-1``) in ``epoch``'s permutation."""
        keys = self._keys(epoch)
        x = self._feistel(np.asarray(positions, dtype=np.uint64), keys)
        out = x >= np.uint64(self.n)
        while out.any():           # cycle walking: a bijection of 0..2^bits-1 restricted to 0..n-1
            x[out] = self._feistel(x[out], keys)
            out = x >= np.uint64(self.n)
        return x.astype(np.int64)

    def __call__(self, j: np.ndarray) -> np.ndarray:
        j = np.asarray(j, dtype=np.int64)
        epochs, pos = j // self.n, j % self.n
        result = np.empty_like(j)
        for e in np.unique(epochs):
            sel = epochs == e
            result[sel] = self.epoch(int(e), pos[sel])
        return result


class TokenBatches:
    """``batch_fn(step, rank, world_size) -> (inputs, targets)`` over a token file (the module's
    scheme): int64 tensors of shape ``[batch_size // world_size, seq_len]``.

    Picklable (it travels to Ray workers): the file is fetched and mapped on first use in each
    process, never pickled."""

    def __init__(self, uri: str, needs: DataNeeds, seed: int, sha256: str | None = None) -> None:
        self.uri, self.needs, self.seed, self.sha256 = uri, needs, seed, sha256
        self._tokens: np.ndarray | None = None
        self._order: WindowOrder | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None, "_order": None}

    def open(self) -> np.ndarray:
        """Fetch (once per node) and memory-map the file, checked against ``needs`` and the pinned
        sha256; its tokens."""
        if self._tokens is None:
            got = fetch(self.uri, sha256=self.sha256)
            probs = meta_problems(self.uri, got.meta, self.needs, file_size=got.path.stat().st_size)
            if probs:
                raise InputError(probs, source="data")
            tf = TokenFile.open(got.path, vocab_size=self.needs.vocab_size)
            self._order = WindowOrder(len(tf) // self.needs.window, self.seed)
            self._tokens = tf.tokens
        return self._tokens

    def windows(self, step: int, rank: int, world_size: int) -> np.ndarray:
        """The window indices this rank trains on at ``step``."""
        from spotwise.runtime.data.stdlib import rank_slice

        self.open()
        assert self._order is not None
        b = self.needs.batch_size
        j = np.arange(step * b, (step + 1) * b, dtype=np.int64)[rank_slice(b, rank, world_size)]
        return self._order(j)

    def __call__(self, step: int, rank: int, world_size: int):
        import torch

        tokens = self.open()
        w = self.needs.window
        starts = self.windows(step, rank, world_size) * w
        rows = np.asarray(tokens[starts[:, None] + np.arange(w)[None, :]], dtype=np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def token_batches(data: DataConfig, *, seq_len: int, batch_size: int, seed: int, vocab_size: int,
                  dtypes: tuple[str, ...] = tuple(DTYPES)) -> TokenBatches:
    """The ``batch_fn`` of a built-in model that trains on ``data`` (see :class:`TokenBatches`):
    windows of ``seq_len + 1`` tokens, ``batch_size`` sequences per global batch, the epochs'
    order seeded by ``seed``, ids checked below ``vocab_size``, the file's sha256 checked against
    ``data.sha256`` when the run pinned one."""
    return TokenBatches(data.uri, DataNeeds(vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
                                            dtypes=dtypes), seed, data.sha256)


# -- a user's make_spec on the task's token file (spotwise.train.token_batches) ---------------------

_bound: list[DataConfig | None] = [None]


@contextmanager
def bound(data: DataConfig | None) -> Iterator[None]:
    """Within: :func:`bound_batches` reads ``data`` (the task's ``training.data``). The runtime
    binds it around a user's ``make_spec`` call, on every rank and in the reference runs alike."""
    before = _bound[0]
    _bound[0] = data
    try:
        yield
    finally:
        _bound[0] = before


def bound_batches(*, seq_len: int, batch_size: int, vocab_size: int, seed: int = 0) -> TokenBatches:
    """The ``batch_fn`` over the bound token file (see :func:`bound` and :class:`TokenBatches`);
    ``ValueError`` naming ``training.data`` outside a make_spec call or when the task has none."""
    data = _bound[0]
    if data is None:
        raise ValueError("spotwise.train.token_batches: the task has no training.data (add training.data.uri: "
                         "the token file `spotwise data tokenize` wrote), or this is not inside make_spec")
    for name, v in (("seq_len", seq_len), ("batch_size", batch_size), ("vocab_size", vocab_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"spotwise.train.token_batches: {name} must be a positive int, not {v!r}")
    return TokenBatches(data.uri, DataNeeds(vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size),
                        seed, data.sha256)
