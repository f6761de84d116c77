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

from spotwise.runtime.loop import LoopResult, TrainSpec

__all__ = ["LoopResult", "TrainSpec", "preempting"]


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
