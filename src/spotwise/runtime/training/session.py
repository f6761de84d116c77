"""The loop's session under Ray Train: orchestrator reports, stop polling, preemption signal.

* Rank 0 reports checkpoints and resumes to the run's control actor
  (:mod:`spotwise.runtime.training.control`) when there is one (fire-and-forget).
* Every rank polls the actor from a daemon thread (every ``poll_s``) so the training loop never
  waits on it; the loop's all-reduce turns the local views into one decision, so all ranks stop at
  the same step. Rank 0's poll carries its latest step (``Control.poll``): a step costs the loop
  one attribute store, not an actor call. Measured under Ray Train on 2 CPU cores, one
  ``report_progress.remote`` per step cost about 2 % of step time (``docs/benchmarks.md``).
  The price: after a hard node loss (no notice) the actor may not have heard of the steps of the
  last ``poll_s``, so ``lost_steps`` can under-count by at most that much work. The first step is
  sent at once (the orchestrator starts its clock on it) and every checkpoint raises the step.
* The preemption signal is Ray Train's: the PreemptionWatcher marks every worker when a node of
  the group is draining with reason PREEMPTION. Each rank reads its own worker's mark (no Ray
  barrier per step) and the loop's all-reduce agrees on it. After the just-in-time checkpoint the
  ranks wait: returning would end the run as *finished*, and raising would be charged to
  ``max_failures``; waiting lets the controller restart the group at the deadline with a
  ``PreemptionError`` charged to ``max_preemption_failures``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from spotwise.runtime.checkpoint.checkpointer import CheckpointInfo

log = logging.getLogger(__name__)


def _local_preemption_info():
    """This worker's preemption mark, read without a collective."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return get_train_context().preemption_context.preemption_info
    except Exception:  # noqa: BLE001 - internal layout changed: the public (collective) API, called every step
        import ray.train

        return ray.train.get_preemption_info()


class StopPoller:
    """Daemon thread that caches the control actor's stop reason and carries ``step`` to it.

    ``step`` is set by the training thread (rank 0 only; None elsewhere) and read here; a plain
    attribute is enough: the actor keeps the maximum, so a stale read only delays a report.
    """

    def __init__(self, actor, poll_s: float = 0.5) -> None:
        self.actor = actor
        self.poll_s = poll_s
        self.reason: str | None = None
        self.step: int | None = None
        self.loss: float | None = None        # the loss of ``step`` (set with it)
        self.perf: dict | None = None         # its speed and memory figures (StepMeter.tick)
        self._sent: int | None = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="spotwise-stop-poller", daemon=True)
        self._t.start()

    def _run(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                step, loss, perf = self.step, self.loss, self.perf
                r = ray.get(self.actor.poll.remote(step if step != self._sent else None, loss, perf), timeout=10)
                self._sent = step
                if r:
                    self.reason = r
            except Exception:  # actor gone or slow: keep training, retry next tick
                log.debug("stop poll failed", exc_info=True)
            self._stop.wait(self.poll_s)

    def close(self) -> None:
        self._stop.set()


class RaySession:
    def __init__(self, control_run_name: str | None, *, poll_s: float = 0.5) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.actor: Any = None          # the run's Control actor handle (None: no orchestrator)
        if control_run_name:
            from spotwise.runtime.training.control import get_actor

            self.actor = get_actor(control_run_name)
        self.poller = StopPoller(self.actor, poll_s) if self.actor is not None else None
        self.output: Any = None         # this rank's output shipper (spotwise.runtime.training.joboutput), if captured
        if self.actor is not None:
            import ray

            self.actor.report_event.remote("worker_started", rank=self.rank, world_size=self.world_size,
                                           pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id())

    def local_stop_reason(self) -> str | None:
        return self.poller.reason if self.poller else None

    def agreed_stop_reason(self) -> str | None:
        """After the all-reduce agreed to stop, this rank's poller may not have heard the reason yet
        (another rank's did): ask the actor once, so rank 0 reports the real reason."""
        if self.poller is not None and self.poller.reason is None:
            import ray

            r: str | None
            try:
                r = ray.get(self.actor.stop_requested.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - actor gone: the caller falls back to a generic reason
                r = None
            if r:
                self.poller.reason = r
        return self.local_stop_reason()

    def local_preempted(self) -> bool:
        return _local_preemption_info() is not None

    def report_progress(self, step: int, loss: float | None, perf: dict | None = None) -> None:
        if self.poller is None or self.rank != 0:
            return
        if self.poller.step is None:          # the first step of this attempt: at once
            self.actor.report_progress.remote(step, loss, perf)
        self.poller.loss, self.poller.perf = loss, perf
        self.poller.step = step

    def report_checkpoint(self, info: CheckpointInfo) -> None:
        if self.actor is not None and self.rank == 0:
            self.actor.report_checkpoint.remote(info.step, info.uri, info.kind)

    def report_eval(self, step: int, loss: float, train_loss: float | None = None) -> None:
        if self.actor is not None and self.rank == 0:
            self.actor.report_eval.remote(step, loss, train_loss)

    def report_resume(self, from_step: int, world_size: int) -> None:
        if self.actor is not None and self.rank == 0:
            self.actor.report_resume.remote(from_step, world_size)

    def after_preemption_checkpoint(self) -> None:
        """Do no more work that would be lost: wait for Ray Train to tear the group down."""
        info = _local_preemption_info()
        log.warning("rank %d: preemption checkpoint committed; waiting for the node to be reclaimed "
                    "(deadline_ms=%s)", self.rank, getattr(info, "deadline_ms", None))
        if self.actor is not None and self.rank == 0:
            self.actor.report_event.remote("preemption_wait", deadline_ms=getattr(info, "deadline_ms", None))
        if self.output is not None:      # the node goes at the deadline: ship what it printed now
            self.output.flush()
        while True:
            time.sleep(0.5)

    def close(self) -> None:
        if self.poller:
            self.poller.close()
