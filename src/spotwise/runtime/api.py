"""The runtime's contract with the orchestrator: what to train (``TrainJob``) and what came of it
(``TrainResult``). ``fit(job)`` runs the job under Ray Train on the connected Ray cluster.

The orchestrator (``spotwise.engine``) relies on exactly these fields; the runtime may add
fields with defaults. A job's :class:`TrainConfig` is the task file's ``training:`` section itself
(see :mod:`spotwise.runtime.config`, re-exported here as part of the contract).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spotwise.runtime.config import CheckpointConfig, ModelConfig, TrainConfig
from spotwise.runtime.llama_config import LlamaConfig

__all__ = ["CHECKPOINTED_FILE_ENV", "EMULATED_GPUS_LABEL", "INSTANCE_LABEL", "CheckpointConfig", "LlamaConfig", "ModelConfig", "TrainConfig", "TrainJob",
           "TrainResult", "WORKER_RESOURCE"]

#: The Ray resource every worker node offers once (the provisioner's boot script and the local cloud
#: start Ray with it): the trainer counts live workers by it and asks one per rank, so exactly one
#: rank group lands per node.
WORKER_RESOURCE = "spotwise-worker"

#: The Ray node label that names a node's cloud instance (the boot script and the local cloud start
#: Ray with it): the watcher finds its own Ray node by it, the join watchdog tells joined instances
#: from listed ones, and a rank's output lines say which instance printed them.
INSTANCE_LABEL = "spotwise-instance"

#: Where a node's notice ends its own allocation once training no longer needs it (a Slurm job:
#: the preemptor, and the run's replacement queued behind it, wait for its nodes), the environment
#: names a file under this variable; every rank creates it once its notice's just-in-time checkpoint
#: is committed (``session.mark_checkpointed``), and the node's batch script ends the job then.
CHECKPOINTED_FILE_ENV = "SPOTWISE_NOTICE_CHECKPOINTED_FILE"

#: The Ray label of a worker node whose GPUs are emulated (its value: how many it declares): the
#: local cloud's ``local.emulated_gpus``, for tests and benchmarks. The trainer runs such a node's
#: ranks on the CPU over gloo, one per declared GPU.
EMULATED_GPUS_LABEL = "spotwise-emulated-gpus"


@dataclass(kw_only=True, slots=True)
class TrainJob:
    """One training run.

    ``run_name`` must be unique per job: Ray Train resumes a run of the same name from storage.
    ``control_run_name`` names the :mod:`spotwise.runtime.training.control` actor to report to (None: no
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
    # training.train_func: the function returned by itself (its loop's end is the run's, whatever
    # ``steps_completed`` says); False on every other path and for a stopped function
    returned: bool = False
    # the loop ended it: too many non-finite steps in a row (``error`` says which; its checkpoints
    # were left as they were). The job process exits EXIT_DIVERGED (3) for it
    diverged: bool = False
