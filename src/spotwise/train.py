"""What your own training code imports: ``from spotwise.train import TrainSpec``.

A task file's ``training.entrypoint: "package.module:make_spec"`` names a function of yours that
takes the task's ``training.config`` (a dict) and returns a :class:`TrainSpec`; spotwise trains it
with the loop that trains its built-in model, and so with the same guarantees (exact resume, the
just-in-time checkpoint on an interruption notice, the budget stop at a checkpoint). See
``docs/runtime.md``, "Your own code".

A ``training.train_func: "package.module:train_func"`` (an unmodified Ray Train function that
owns its loop) needs nothing from here but, optionally, :func:`preempting`.

This module is the public name only; the types live in :mod:`spotwise.runtime` (it imports
torch, as any training code does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotwise.runtime.training.loop import LoopResult, TrainSpec

if TYPE_CHECKING:
    from spotwise.runtime.data.dataset import TokenBatches

__all__ = ["LoopResult", "TrainSpec", "preempting", "token_batches"]


def token_batches(*, seq_len: int, batch_size: int, vocab_size: int, seed: int = 0) -> TokenBatches:
    """A ``batch_fn(step, rank, world_size) -> (inputs, targets)`` over the task's token file
    (``training.data.uri``, made by ``spotwise data tokenize``), for the :class:`TrainSpec` your
    ``make_spec`` returns: int64 tensors of shape ``[batch_size // world_size, seq_len]``, targets
    shifted by one token. The same batches the built-in models take: windows of ``seq_len + 1``
    tokens in a seeded order per epoch, a pure function of ``(seed, step)``, so a resumed run reads
    what an uninterrupted one would have; each rank its contiguous slice of the global batch.

    Call it inside ``make_spec`` (spotwise binds the task's ``training.data`` around that call, on
    every node). The file is fetched once per node into its cache, checked against the sha256 the
    launch pinned, and memory-mapped on the first batch; ids at or past ``vocab_size`` and a file
    shorter than one global batch are refused there with an error naming ``training.data.uri``
    (the launch checked the file's meta and size before any node started). ``ValueError`` when
    the task has no ``training.data``."""
    from spotwise.runtime.data.dataset import bound_batches

    return bound_batches(seq_len=seq_len, batch_size=batch_size, vocab_size=vocab_size, seed=seed)


def preempting() -> bool:
    """True once a node of this run's worker group has an interruption notice (a spot reclaim,
    or spotwise moving the run): report a checkpoint now (``ray.train.report(metrics,
    checkpoint=...)``) and it is the one the run resumes from, with no step lost.

    For a ``training.train_func`` (a Ray Train function; a ``TrainSpec`` needs nothing: the loop
    checkpoints on the notice itself). It is Ray Train's ``ray.train.get_preemption_info() is not
    None``, so a collective like ``ray.train.report``: every rank must call it, equally often
    (e.g. once per step). Ray only; outside a Ray Train worker it raises as Ray does."""
    import ray.train

    return ray.train.get_preemption_info() is not None
