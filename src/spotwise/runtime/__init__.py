"""The training side: sharded bf16 training under Ray Train (or plain torch), checkpoints to
storage, interruption watchers and exact resume. Usable without the orchestrator.

Entry points (imported lazily so ``spotwise.runtime.api`` stays cheap to import):

* :func:`fit` — run a :class:`~spotwise.runtime.api.TrainJob` on the connected Ray cluster;
* :class:`TrainSpec` / :func:`run_loop` — the Ray-free loop for your own model and data;
* :func:`model_sha256` — the sharding-independent fingerprint of a model's weights.
"""

from __future__ import annotations

_LAZY = {
    "fit": "spotwise.runtime.trainer",
    "TrainSpec": "spotwise.runtime.loop",
    "run_loop": "spotwise.runtime.loop",
    "LocalSession": "spotwise.runtime.loop",
    "model_sha256": "spotwise.runtime.digest",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
