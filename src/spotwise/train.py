"""What your own training code imports: ``from spotwise.train import TrainSpec``.

A task file's ``training.entrypoint: "package.module:make_spec"`` names a function of yours that
takes the task's ``training.config`` (a dict) and returns a :class:`TrainSpec`; spotwise trains it
with the loop that trains its built-in model, and so with the same guarantees (exact resume, the
just-in-time checkpoint on an interruption notice, the budget stop at a checkpoint). See
``docs/runtime.md``, "Your own code".

This module is the public name only; the types live in :mod:`spotwise.runtime` (it imports
torch, as any training code does).
"""

from __future__ import annotations

from spotwise.runtime.loop import LoopResult, TrainSpec

__all__ = ["LoopResult", "TrainSpec"]
