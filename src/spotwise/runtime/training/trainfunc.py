"""An unmodified Ray Train function: ``training.train_func: "package.module:train_func"``.

For code that owns its training loop and already runs under Ray Train: it calls
``ray.train.report(metrics, checkpoint=...)`` and ``ray.train.get_checkpoint()`` as it would
anywhere else, and spotwise calls it on every rank as ``train_func(config)`` with the task's
``training.config``. Nothing in it has to import spotwise. What spotwise adds around it, on each
worker (:func:`run_train_func`):

* **Storage**: Ray Train's storage is the run's (``<storage>/_ray/<run>``, shared by every node),
  so a restarted or resized group's ``get_checkpoint()`` is the last checkpoint reported.
* **Progress**: the ``step`` and ``loss`` keys of the metrics rank 0 reports are the run's
  progress and loss (the control actor's snapshot, the ledger's report, the policy's view); the
  report's ``steps_completed`` is the last ``step`` reported.
* **The notice**: ``spotwise.train.preempting()`` (Ray's own ``ray.train.get_preemption_info()``
  is not None; a collective, every rank calls it alike) tells the function to report a
  checkpoint now. A checkpoint reported while the node is being preempted is the just-in-time one:
  the ranks then wait for the node to go (more work would be lost) and Ray Train restarts the
  group, which resumes from it.
* **The stop** (budget, cancel, a move): the function cannot be asked to stop, so it is stopped
  at its next ``ray.train.report`` (after that report's checkpoint, if it has one, is written):
  the run ends at the *last reported checkpoint*, and the steps since it are not saved. A weaker
  promise than a ``TrainSpec``'s (a stop checkpoint at the step the stop came), which the report
  says (``stop_guarantee``).

How: while the function runs, ``ray.train.report`` (the name the function calls, as
``ray.train.report`` or imported from ``ray.train``: its module is imported after the patch) is a :class:`Reporter`
that calls Ray's own and then does the above. Exceptions the function raises are the user's
(:class:`~spotwise.runtime.training.usercode.UserCodeError`, counted against
``training.max_restarts_on_errors``), except those of Ray's report itself (but for its refusal of
the arguments, a ``ValueError``/``TypeError``) and a collective's lost peer
(``torch.distributed.DistError``): those are the cluster's, retried like a lost node.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

#: what the report says of a stop on this path (docs/runtime.md, "A Ray Train function")
STOP_GUARANTEE = ("train_func: a stop (budget, cancel, move) ends the run at the next ray.train.report, "
                  "at the last checkpoint reported; steps after it are not saved")
_NAME_RE = re.compile(r"^step_(\d{9})_")


class StopAtReport(BaseException):
    """The group agreed to stop at this report. A ``BaseException`` so that a function's own
    ``except Exception`` around its loop cannot swallow it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def checkpoint_name(step: int) -> str:
    """The directory name spotwise gives a reported checkpoint the function did not name: its
    step (so a resume knows where it resumes from) and a random suffix (Ray requires unique names;
    a function may report two checkpoints at one step). Rank 0's name is the one Ray uses."""
    return f"step_{step:09d}_{uuid.uuid4().hex[:8]}"


def step_of(path: str | None) -> int | None:
    """The step in a checkpoint directory named by :func:`checkpoint_name`, else None."""
    if not path:
        return None
    m = _NAME_RE.match(path.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def _number(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class Reporter:
    """``ray.train.report`` on a worker while the task's function runs (see the module docstring).

    ``report``: Ray's own; ``session``: the run's :class:`~spotwise.runtime.training.session.RaySession`
    (progress, checkpoints, the stop reason, the preemption mark); ``broadcast``: rank 0's value
    to every rank (``ray.train.collective.broadcast_from_rank_zero``); ``run_uri``: where Ray
    writes this run's checkpoints (``<run_uri>/<checkpoint dir name>``)."""

    def __init__(self, report: Callable[..., Any], session: Any, *, broadcast: Callable[[Any], Any],
                 run_uri: str) -> None:
        self.report, self.session, self.broadcast = report, session, broadcast
        self.run_uri = run_uri.rstrip("/")
        self.step = 0                          # the last ``step`` reported
        self.loss: float | None = None
        self.checkpoint_uri: str | None = None   # the last checkpoint rank 0 reported
        self.checkpoint_step: int | None = None
        self.cluster_error: BaseException | None = None   # raised by Ray's report: not the user's

    def __call__(self, metrics: dict, checkpoint: Any = None, checkpoint_dir_name: str | None = None,
                 **kwargs: Any) -> None:
        step = _number(metrics.get("step")) if isinstance(metrics, dict) else None
        if step is not None:
            self.step = int(step)
        loss = _number(metrics.get("loss")) if isinstance(metrics, dict) else None
        if loss is not None:
            self.loss = loss
        name = checkpoint_dir_name or checkpoint_name(self.step)
        try:
            self.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name, **kwargs)
            reason = self.broadcast(self.session.local_stop_reason() if self.session.rank == 0 else None)
        except (ValueError, TypeError):
            raise                      # Ray refused the arguments (a tensor in the metrics, ...): the user's
        except Exception as e:
            self.cluster_error = e
            raise
        if step is not None:
            self.session.report_progress(self.step, self.loss)
        preempted = self.session.local_preempted()
        if checkpoint is not None and self.session.rank == 0:
            from spotwise.runtime.checkpoint.checkpointer import CheckpointInfo

            self.checkpoint_uri, self.checkpoint_step = f"{self.run_uri}/{name}", self.step
            kind = "preemption" if preempted else ("stop" if reason else "periodic")
            self.session.report_checkpoint(CheckpointInfo(step=self.step, uri=self.checkpoint_uri, kind=kind,
                                                                world_size=self.session.world_size))
        if reason:
            log.warning("rank %d: stopping at this report (%s); the run ends at its last reported checkpoint",
                        self.session.rank, reason)
            raise StopAtReport(reason)
        if preempted and checkpoint is not None:
            self.session.after_preemption_checkpoint()


@contextmanager
def patched_report(reporter: Reporter) -> Iterator[None]:
    """``ray.train.report`` is ``reporter`` inside the block (and Ray's own again after it)."""
    import ray.train

    original = ray.train.report
    ray.train.report = reporter
    try:
        yield
    finally:
        ray.train.report = original


def resumed_from(checkpoint_path: str | None, session: Any) -> int:
    """The step a resumed group starts from: the one in its checkpoint's name, else the control
    actor's last recorded checkpoint (a function that names its own checkpoints), else 0."""
    step = step_of(checkpoint_path)
    if step is not None:
        return step
    if session.actor is not None:
        import ray

        try:
            cks = ray.get(session.actor.snapshot.remote(), timeout=30).get("checkpoints") or []
            return int(cks[-1]["step"]) if cks else 0
        except Exception:  # noqa: BLE001 - only the resume's bookkeeping: the run goes on
            log.warning("could not read the last checkpoint's step from the control actor", exc_info=True)
    return 0


def run_train_func(job: Any, session: Any, *, run_uri: str) -> dict[str, Any]:
    """Run the task's Ray Train function on this rank; the fields of its ``TrainResult``.

    Raises :class:`~spotwise.runtime.training.usercode.UserCodeError` for an exception of the user's code.
    """
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    from spotwise.runtime.training.usercode import UserCodeError, _infrastructure, load_entrypoint

    ref = job.config.train_func
    reporter = Reporter(ray.train.report, session, broadcast=broadcast_from_rank_zero, run_uri=run_uri)
    stopped = None
    with patched_report(reporter):      # before the import: a module-level `from ray.train import report`
        fn = load_entrypoint(ref, field="training.train_func")
        start = ray.train.get_checkpoint()
        if start is not None:
            session.report_resume(resumed_from(getattr(start, "path", None), session), session.world_size)
        try:
            fn(dict(job.config.config))
        except StopAtReport as s:
            stopped = s.reason
        except Exception as e:
            if e is reporter.cluster_error or _infrastructure(e):
                raise
            raise UserCodeError(f"{ref}(config)", e) from e
    final = reporter.checkpoint_uri
    if final is None and start is not None:          # resumed, and reported no checkpoint since
        final = f"{reporter.run_uri}/{str(start.path).rstrip('/').rsplit('/', 1)[-1]}"
    return {"steps_completed": reporter.step, "final_checkpoint": final, "model_sha256": None,
            "stopped": stopped, "returned": stopped is None}
