"""The training side: sharded bf16 training under Ray Train (or plain torch), checkpoints to
storage, interruption watchers and exact resume. Usable without the orchestrator.

Importing this package imports nothing else (``spotwise.runtime.api`` must stay cheap to import,
and torch/Ray are heavy), so the entry points are imported from the modules that define them:

* ``from spotwise.runtime.training.trainer import fit`` — run a :class:`~spotwise.runtime.api.TrainJob` on
  the connected Ray cluster;
* ``from spotwise.runtime.training.loop import TrainSpec, run_loop, LocalSession`` — the Ray-free loop for
  your own model and data;
* ``from spotwise.runtime.checkpoint.digest import model_sha256`` — the sharding-independent fingerprint of a
  model's weights.
"""
