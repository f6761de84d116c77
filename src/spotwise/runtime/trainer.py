"""``fit(job)``: run a :class:`~spotwise.runtime.api.TrainJob` under Ray Train on the connected
Ray cluster (the caller has done ``ray.init(address=...)``).

Ray Train (V2) owns the worker group: placement (``resources_per_worker``), the gloo/NCCL
process group, restarts on failure (``FailureConfig.max_failures``) and on preemption (a separate,
unlimited budget), and the preemption signal. spotwise owns what each worker does: the loop in
:mod:`spotwise.runtime.loop`, checkpoints under ``<storage_uri>/<run_name>/checkpoints/`` and
resume from the newest committed one, so a restart continues exactly where the run left off.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from spotwise.runtime.api import TrainJob, TrainResult
from spotwise.runtime.checkpoint import latest_committed, run_storage


def _train_worker(config: dict) -> TrainResult:
    """Per-rank entry point (runs inside a Ray Train worker)."""
    job: TrainJob = config["job"]
    os.environ.update(job.env)
    from spotwise.runtime.builtin import gpt_spec
    from spotwise.runtime.loop import run_loop
    from spotwise.runtime.session import RaySession

    session = RaySession(job.control_run_name)
    try:
        res = run_loop(gpt_spec(job.config, **config.get("overrides", {})), session,
                       run_storage(job.storage_uri, job.run_name))
    finally:
        session.close()
    return TrainResult(steps_completed=res.steps_completed, final_checkpoint=res.final_checkpoint,
                       model_sha256=res.model_sha256, stopped=res.stopped, precision=res.precision)


def _ray_storage_path(job: TrainJob) -> str:
    """Where Ray Train keeps its own run state: the storage dir for file://, else a local dir."""
    u = urlparse(job.storage_uri)
    if u.scheme in ("", "file"):
        return str(Path(u.path if u.scheme else job.storage_uri).absolute() / "_ray")
    return os.path.join(tempfile.gettempdir(), "spotwise-ray-runs")


def fit(job: TrainJob, *, min_workers: int | None = None, resize_monitor_s: float = 60.0,
        **overrides) -> TrainResult:
    """Train ``job`` to completion (or stop) and return its result.

    ``min_workers``: elastic training between ``min_workers`` and ``job.num_workers`` ranks
    (the run reshards from its checkpoint whenever the group size changes).
    ``resize_monitor_s``: elastic only: how often Ray Train checks whether more workers fit
    (growing the group restarts it from the newest committed checkpoint).
    ``overrides``: extra :class:`~spotwise.runtime.loop.TrainSpec` fields (grad_accum, ...).
    A run that exhausts its retries returns a result with ``error`` set (never raises for it).
    """
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.train.v2.api.exceptions import TrainingFailedError

    env = {"GLOO_SOCKET_IFNAME": os.environ["GLOO_SOCKET_IFNAME"]} if "GLOO_SOCKET_IFNAME" in os.environ else {}
    env.update(job.env)
    num_workers = job.num_workers if min_workers is None else (min_workers, job.num_workers)
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"job": job, "overrides": overrides},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False,
                                     resources_per_worker=dict(job.resources_per_worker),
                                     elastic_resize_monitor_interval_s=resize_monitor_s),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=_ray_storage_path(job),
            failure_config=FailureConfig(max_failures=job.max_failures),
            worker_runtime_env={"env_vars": env} if env else None,
        ),
    )
    try:
        result = trainer.fit()
    except TrainingFailedError as e:
        return _failed(job, e)
    if result.error is not None:
        return _failed(job, result.error)
    return result.return_value


def _failed(job: TrainJob, error: BaseException) -> TrainResult:
    old = dict(os.environ)
    os.environ.update(job.env)
    try:
        last = latest_committed(run_storage(job.storage_uri, job.run_name))
    except Exception:
        last = None
    finally:
        os.environ.clear()
        os.environ.update(old)
    return TrainResult(steps_completed=last.step if last else 0,
                       final_checkpoint=last.uri if last else None, model_sha256=None,
                       error=f"{type(error).__name__}: {error}")
