"""The runtime's contract with the orchestrator: what to train (``TrainJob``) and what came of it
(``TrainResult``). ``fit(job)`` runs the job under Ray Train on the connected Ray cluster.

The orchestrator (``spotwise.engine``) relies on exactly these fields; the runtime may add
fields with defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """The built-in GPT-style model (byte-level, vocab 256)."""

    vocab_size: int = 256
    seq_len: int = 128
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """What to train and how. ``batch_size`` is the global batch in sequences per step."""

    model: str = "tiny-gpt"
    model_config: ModelConfig = field(default_factory=ModelConfig)
    steps: int = 200
    batch_size: int = 8
    lr: float = 3e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_interval: int = 20           # steps between periodic checkpoints
    keep_last: int = 2
    dataset: str = "stdlib"                 # byte-level text of Python's own standard library
    precision: str = "auto"                 # auto | bf16 | fp32 (runtime.parallel.resolve_precision)


@dataclass(kw_only=True, slots=True)
class TrainJob:
    """One training run.

    ``run_name`` must be unique per job: Ray Train resumes a run of the same name from storage.
    ``control_run_name`` names the :mod:`spotwise.runtime.control` actor to report to (None: no
    orchestrator). Workers need ``resources_per_worker`` each (the local cloud gives each worker
    node one CPU and a ``spotwise-worker`` resource, so exactly one rank lands per node).
    """

    run_name: str
    storage_uri: str
    config: TrainConfig
    num_workers: int = 2
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1})
    max_failures: int = 20
    control_run_name: str | None = None
    env: dict[str, str] = field(default_factory=dict)   # e.g. AWS_ENDPOINT_URL for s3:// storage
    notice_window_s: float | None = None   # the cloud's interruption notice (bounds checkpoint spacing)


@dataclass(kw_only=True, slots=True)
class TrainResult:
    steps_completed: int
    final_checkpoint: str | None
    model_sha256: str | None
    stopped: str | None = None      # stop reason when the run stopped before ``steps`` (budget, cancel)
    error: str | None = None
    precision: str | None = None    # what ran: bf16 | fp32 (None when no rank finished)
    checkpoint_window: dict | None = None   # the interval was shortened: a save does not fit the notice
