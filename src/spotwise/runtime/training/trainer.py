"""``fit(job)``: run a :class:`~spotwise.runtime.api.TrainJob` under Ray Train on the connected
Ray cluster (the caller has done ``ray.init(address=...)``).

Ray Train (V2) owns the worker group: placement (``resources_per_worker``), the gloo/NCCL
process group, restarts on failure (``FailureConfig.max_failures``) and on preemption (a separate,
unlimited budget), and the preemption signal. spotwise owns what each worker does: the loop in
:mod:`spotwise.runtime.training.loop`, checkpoints under ``<storage_uri>/<run_name>/checkpoints/`` and
resume from the newest committed one, so a restart continues exactly where the run left off.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast
from urllib.parse import urlparse

from spotwise.runtime.api import EMULATED_GPUS_LABEL, TrainJob, TrainResult
from spotwise.runtime.checkpoint.checkpointer import latest_committed, run_storage

#: Ray Train's switch for its print-to-logger patch in the workers (``ray.train.v2``'s constants)
PRINT_PATCH_ENV = "RAY_TRAIN_ENABLE_PRINT_PATCH"
#: how often Ray Train's controller polls the workers (Ray's default 2 s) and its preemption watcher
#: asks the GCS for drains (5 s), for spotwise's runs: a restart after a notice starts at the
#: controller's next poll once the ranks have ended their wait (on average 1 s later at Ray's default;
#: issue 51), and the just-in-time checkpoint at the watcher's next look. A poll is one small actor
#: call per worker; a worker is only declared dead by Ray's own health-check timeout, not by this.
RAY_TRAIN_POLLS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5"}


@contextmanager
def ray_train_polls() -> Iterator[None]:
    """:data:`RAY_TRAIN_POLLS` in this process's environment while Ray Train's controller is made
    (Ray Train propagates them from the driver to it and its workers); a value already set wins."""
    added = {k: v for k, v in RAY_TRAIN_POLLS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _train_worker(config: dict) -> TrainResult:
    """Per-rank entry point (runs inside a Ray Train worker). What the rank prints goes to the
    run's control actor too, tagged with its rank and node (:mod:`spotwise.runtime.training.joboutput`)."""
    job: TrainJob = config["job"]
    os.environ.update(job.env)
    from spotwise.runtime.training.session import RaySession

    # the group's per-worker resources: a rank waiting out a notice restarts early once they fit again
    session = RaySession(job.control_run_name, need=config.get("resources_per_worker"))
    if session.actor is None:
        return _train_rank(config, session)
    import ray

    from spotwise.runtime.training.joboutput import captured, node_label

    actor = session.actor
    with captured(lambda recs: ray.get(actor.append_output.remote(recs), timeout=10),
                  rank=str(session.rank), node=node_label()) as shipper:
        session.output = shipper
        return _train_rank(config, session)


def _train_rank(config: dict, session) -> TrainResult:
    job: TrainJob = config["job"]
    from spotwise.runtime.training.loop import run_loop
    from spotwise.runtime.training.usercode import UserCodeError, spec_for

    try:
        attempt, verdict = _agree_attempt(session, job)
        if verdict is not None:          # user code failed as often as the task allows: no more tries
            return TrainResult(steps_completed=0, final_checkpoint=None, model_sha256=None, error=verdict)
        try:
            if job.config.train_func is not None:    # a Ray Train function: it owns its loop
                from spotwise.runtime.training.trainfunc import run_train_func

                return TrainResult(**run_train_func(job, session, run_uri=config["ray_run_uri"]))
            spec = spec_for(job.config, **{"notice_window_s": job.notice_window_s, **config.get("overrides", {})})
            res = run_loop(spec, session, run_storage(job.storage_uri, job.run_name))
        except UserCodeError as e:
            _record_user_error(session, attempt, e)
            raise
    finally:
        session.close()
    # a diverged run is the run's error (the report shows it; the job process exits EXIT_DIVERGED)
    return TrainResult(steps_completed=res.steps_completed, final_checkpoint=res.final_checkpoint,
                       model_sha256=res.model_sha256, stopped=res.stopped, precision=res.precision,
                       checkpoint_window=res.checkpoint_window, error=res.diverged,
                       diverged=res.diverged is not None)


def _agree_attempt(session, job: TrainJob) -> tuple[str, str | None]:
    """This worker group's attempt id and, for user code, whether to give up before training.

    Rank 0 decides and broadcasts both, so every rank of the group acts alike (a late error report
    from the previous group cannot split them). The verdict is the run's error once the control
    actor holds more attempts that failed in user code than ``training.max_restarts_on_errors``
    allows. Without a control actor (no orchestrator) there is no error budget: Ray Train's
    ``max_failures`` alone bounds the retries."""
    import uuid

    import torch.distributed as dist

    doc: list = [uuid.uuid4().hex, None]
    if session.rank == 0 and job.config.user_code and session.actor is not None:
        import ray

        errors = ray.get(session.actor.user_errors.remote(), timeout=30)
        allowed = job.config.max_restarts_on_errors
        if len(errors) > allowed:
            last = errors[-1]
            doc[1] = (f"user code failed in {len(errors)} attempt(s) (training.max_restarts_on_errors: "
                      f"{allowed}): {last['error']}\n{last['tail']}")
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(doc, src=0)
    return doc[0], doc[1]


def _record_user_error(session, attempt: str, error) -> None:
    """Tell the control actor that this attempt failed in user code (waiting for it to land, so
    the next group's rank 0 counts it), and print the traceback's tail to this rank's stderr: where
    a user looks for it (``spotwise logs``, a failed run's ``output_tail``), whatever the worker's
    logging is configured to do."""
    import logging
    import sys

    print(f"rank {session.rank}: {error}\n{error.tail}", file=sys.stderr, flush=True)
    if session.actor is None:
        return
    import ray

    try:
        ray.get(session.actor.report_user_error.remote(attempt, session.rank, str(error), error.tail), timeout=30)
    except Exception:  # noqa: BLE001 - the actor is gone: the run is ending anyway
        logging.getLogger(__name__).warning("could not report the user error to the control actor", exc_info=True)


def _ray_storage_path(job: TrainJob) -> str:
    """Where Ray Train keeps its own run state: ``<storage>/_ray`` for file://; for another scheme
    a local dir, except for a Ray Train function, whose checkpoints are Ray's and so must be in
    the run's storage, shared by every node (``<storage>/_ray``: Ray reads ``s3://`` through
    pyarrow, which takes ``AWS_ENDPOINT_URL`` from the job's environment)."""
    u = urlparse(job.storage_uri)
    if u.scheme in ("", "file"):
        return str(Path(u.path if u.scheme else job.storage_uri).absolute() / "_ray")
    if job.config.train_func is not None:
        return f"{job.storage_uri.rstrip('/')}/_ray"
    return os.path.join(tempfile.gettempdir(), "spotwise-ray-runs")


def ray_run_uri(job: TrainJob) -> str:
    """The URI of this run's directory in Ray Train's storage (a Ray Train function's checkpoints
    are ``<this>/<checkpoint dir name>``)."""
    path = _ray_storage_path(job)
    return f"{path if '://' in path else 'file://' + path}/{job.run_name}"


def _worker_gpus() -> tuple[int, bool]:
    """GPUs on the cluster's worker nodes (the smallest count among them; 0 on CPU clusters), and
    whether they are emulated (any worker labelled :data:`EMULATED_GPUS_LABEL`)."""
    import ray

    from spotwise.runtime.api import WORKER_RESOURCE

    workers = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get(WORKER_RESOURCE)]
    counts = [int(n["Resources"].get("GPU", 0)) for n in workers]
    emulated = any((n.get("Labels") or {}).get(EMULATED_GPUS_LABEL) for n in workers)
    return (min(counts) if counts else 0), emulated


def scaling(gpus: int, emulated: bool, job_resources: dict[str, float]) -> tuple[dict[str, float], str]:
    """Each rank's Ray resources and the process group's backend: a GPU and NCCL per rank on GPU
    nodes; a declared (emulated) GPU, a CPU and gloo per rank where the GPUs are emulated (the rank
    computes on the CPU: :func:`spotwise.runtime.training.parallel.device_for_rank` picks CUDA only
    under NCCL); the job's own resources and gloo on CPU nodes."""
    if not gpus:
        return dict(job_resources), "gloo"
    if emulated:
        return {"GPU": 1.0, "CPU": 1.0}, "gloo"
    return {"GPU": 1.0}, "nccl"


def fit(job: TrainJob, *, min_workers: int | None = None, resize_monitor_s: float = 60.0,
        use_gpu: bool | None = None, **overrides) -> TrainResult:
    """Train ``job`` to completion (or stop) and return its result.

    ``min_workers``: elastic training between ``min_workers`` and ``job.num_workers`` ranks
    (the run reshards from its checkpoint whenever the group size changes).
    ``resize_monitor_s``: elastic only: how often Ray Train checks whether more workers fit
    (growing the group restarts it from the newest committed checkpoint).
    ``overrides``: extra :class:`~spotwise.runtime.training.loop.TrainSpec` fields (grad_accum, ...).
    ``use_gpu``: None decides from the cluster: when the worker nodes have GPUs, one rank per GPU
    (``num_workers`` nodes x GPUs per node, NCCL; gloo on the CPU where they are emulated, for tests
    and benchmarks: :data:`EMULATED_GPUS_LABEL`); otherwise one rank per worker node (gloo).
    A run that exhausts its retries returns a result with ``error`` set (never raises for it).
    """
    # Ray Train v2 (Ray's default; the elastic and runtime-env options below are v2's): named from
    # its own modules, which are what ``ray.train`` re-exports when v2 is on, so mypy sees them too
    from ray.train.torch import TorchConfig
    from ray.train.v2.api.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.result import Result
    from ray.train.v2.torch.torch_trainer import TorchTrainer
    from ray.train.v2.api.exceptions import TrainingFailedError

    env = {"GLOO_SOCKET_IFNAME": os.environ["GLOO_SOCKET_IFNAME"]} if "GLOO_SOCKET_IFNAME" in os.environ else {}
    # Ray Train's own print patch sends every print to its logger as well, whose console handler
    # writes it to stderr: with the rank's output captured (spotwise.runtime.training.joboutput) each line
    # would be kept twice. The lines still reach the worker's own log file through the capture.
    env[PRINT_PATCH_ENV] = "0"
    env.update(job.env)
    gpus, emulated = _worker_gpus() if use_gpu is None else ((1 if use_gpu else 0), False)
    per_node = max(1, gpus)
    resources, backend = scaling(gpus, emulated, job.resources_per_worker)
    num_workers = (job.num_workers * per_node if min_workers is None
                   else (min_workers * per_node, job.num_workers * per_node))
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"job": job, "overrides": overrides, "ray_run_uri": ray_run_uri(job),
                           "resources_per_worker": resources},
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=bool(gpus),
                                     resources_per_worker=resources,
                                     elastic_resize_monitor_interval_s=resize_monitor_s),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=_ray_storage_path(job),
            # an attempt that fails in user code is one failure to Ray Train; the trainer gives up
            # after ``max_restarts_on_errors`` of them (see _agree_attempt), the rest of the budget
            # is for lost nodes
            failure_config=FailureConfig(max_failures=job.max_failures + (
                job.config.max_restarts_on_errors + 1 if job.config.user_code else 0)),
            worker_runtime_env={"env_vars": env},
            # a Ray Train function's checkpoints are Ray's: keep as many as the task says
            checkpoint_config=CheckpointConfig(num_to_keep=job.config.checkpoint.keep_last
                                               if job.config.train_func is not None else None),
        ),
    )
    try:
        # fit() is annotated with ``ray.train.Result``, which mypy can only resolve to v1's
        with ray_train_polls():
            result = cast(Result, trainer.fit())
    except TrainingFailedError as e:
        return _failed(job, e)
    if result.error is not None:
        return _failed(job, result.error)
    value = result.return_value          # rank 0's: _train_worker returns one whenever training ends
    if not isinstance(value, TrainResult):
        return _failed(job, RuntimeError(f"the training function returned {value!r}, not a TrainResult"))
    return value


def _failed(job: TrainJob, error: BaseException) -> TrainResult:
    old = dict(os.environ)
    os.environ.update(job.env)
    try:
        last = latest_committed(run_storage(job.storage_uri, job.run_name))
    except Exception:  # noqa: BLE001 - storage unreachable too: report the run's own error, from step 0
        last = None
    finally:
        os.environ.clear()
        os.environ.update(old)
    return TrainResult(steps_completed=last.step if last else 0,
                       final_checkpoint=last.uri if last else None, model_sha256=None,
                       error=f"{type(error).__name__}: {error}")
