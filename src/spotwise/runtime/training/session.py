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
* The wait ends before the deadline once the group can be re-formed without the draining
  node(s) (issue 51): the orchestrator asks for the noticed node's replacement at the notice, and
  when it has joined there is nothing left to wait for. What ends the wait is Ray Train's
  controller (``PreemptingState``): it restarts the group when every rank has exited or the
  preemption's ``deadline_ms`` has passed, and it reads that deadline from the workers' marks
  (rank 0's first), merged with the earliest it has seen. So each rank, its just-in-time
  checkpoint committed, asks Ray every :data:`REFIT_EVERY_S` whether ``world_size`` workers of
  the group's resources fit on the alive nodes that are not draining (:func:`group_fits`, by each
  node's total resources: the group's own come back at the restart; Ray places nothing on a
  draining node), and once they do, moves its mark's deadline to now (:func:`advance_deadline`):
  the controller restarts the group at its next poll exactly as at the deadline — a
  ``PreemptionError`` on the preemption budget, every rank resuming from the newest committed
  checkpoint — on the replacement and the surviving nodes. Without a committed checkpoint, or
  while the group does not fit (no replacement yet), the ranks wait for the deadline as before.
* What the restart itself takes, once the wait has ended (2 ranks, tiny GPT, local Ray cluster on 2
  shared cores, 2026-12-06; docs/orchestrator.md has the figures): the controller's next poll (0.25 s;
  1.9 s at Ray's 2 s default, hence ``trainer.RAY_TRAIN_POLLS``), the old group's shutdown and the
  placement group (0.25 s), two new worker processes (3.3 s), Ray Train's context on them (2.9 s),
  gloo (0.2 s), the training function unpickled and launched (1.5 s), then this module's session,
  the model and the restore (1.1 s): 9.6 s, of which about 7.7 s is starting Python processes and
  importing Ray Train, torch and spotwise in them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
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


#: how often a rank waiting out a notice asks Ray whether its group fits again without the draining nodes
REFIT_EVERY_S = 0.5
#: the control actor's event when the ranks end their wait before the deadline
WAIT_ENDED = "preemption_wait_ended"


def group_fits(nodes: Iterable[Mapping], draining: Collection[str], need: Mapping[str, float], count: int) -> bool:
    """Whether ``count`` workers, each of ``need`` (Ray resources), fit on ``nodes`` (what
    ``ray.nodes()`` answers) that are alive and not in ``draining`` (Ray node ids), counting each
    node's total resources (the group's own are given back at the restart). An empty ``need``
    never fits: without knowing what a worker takes, the ranks wait for the deadline."""
    need = {k: float(v) for k, v in need.items() if v and v > 0}
    if not need:
        return False
    room = 0
    for n in nodes:
        if not n.get("Alive") or n.get("NodeID") in draining:
            continue
        total = n.get("Resources") or {}
        room += min(int(float(total.get(k, 0.0)) / v + 1e-9) for k, v in need.items())
    return room >= count


def ray_group_fits(need: Mapping[str, float], count: int) -> bool:
    """:func:`group_fits` on the connected cluster, as Ray's GCS answers now."""
    import ray
    from ray._private.state import state

    return group_fits(ray.nodes(), set(state.get_draining_nodes()), need, count)


def advance_deadline(preemption_context: Any, now_ms: int) -> bool:
    """Move this worker's preemption mark's deadline to ``now_ms`` (never later than it is), so Ray
    Train's controller restarts the group at its next poll; False when the worker is not marked."""
    info = preemption_context.preemption_info
    if info is None:
        return False
    if info.deadline_ms is None or info.deadline_ms > now_ms:
        preemption_context.preemption_info = dataclasses.replace(info, deadline_ms=now_ms)
    return True


def _advance_own_deadline(now_ms: int) -> bool:
    from ray.train.v2._internal.execution.context import get_train_context

    return advance_deadline(get_train_context().preemption_context, now_ms)


def mark_checkpointed(env: Mapping[str, str] = os.environ) -> str | None:
    """The notice's just-in-time checkpoint is committed: create the file the node's environment
    names under :data:`~spotwise.runtime.api.CHECKPOINTED_FILE_ENV` (a Slurm job's batch script
    then ends the job, so the preemptor and the replacement get its nodes at once rather than
    after the GraceTime). Its path, or None where the node asks for none (a cloud node)."""
    from spotwise.runtime.api import CHECKPOINTED_FILE_ENV

    path = env.get(CHECKPOINTED_FILE_ENV)
    if path:
        try:
            with open(path, "a"):
                pass
        except OSError as e:
            log.warning("could not mark the notice's checkpoint committed at %s: %s", path, e)
    return path or None


class NoticeWait:
    """The rule for ending the wait after a notice's checkpoint (module docstring): :meth:`check`
    ends it (``end_wait(now_ms)``, again at every later check: a new mark from Ray Train would
    carry the node's own deadline) once ``committed`` and ``fits()``; never without a committed
    checkpoint. ``fits`` raising (Ray busy) is a no for this time."""

    def __init__(self, *, committed: bool, fits: Callable[[], bool], end_wait: Callable[[int], object],
                 clock: Callable[[], float] = time.time) -> None:
        self.committed, self.fits, self.end_wait, self.clock = committed, fits, end_wait, clock
        self.ended_at: float | None = None

    def check(self) -> bool:
        """One look; True once the wait is ended (now or before)."""
        if not self.committed:
            return False
        if self.ended_at is None:
            try:
                if not self.fits():
                    return False
            except Exception:  # noqa: BLE001 - Ray's GCS busy: asked again at the next look
                log.debug("could not ask Ray whether the group fits", exc_info=True)
                return False
            self.ended_at = self.clock()
        self.end_wait(int(self.ended_at * 1000))
        return True


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
    def __init__(self, control_run_name: str | None, *, poll_s: float = 0.5,
                 need: Mapping[str, float] | None = None) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.need = dict(need or {})    # one worker's Ray resources: what a restarted group needs again
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

    def after_preemption_checkpoint(self, committed: bool = True) -> None:
        """Do no more work that would be lost: wait for Ray Train to tear the group down — at the
        notice's deadline, or at once when the checkpoint is ``committed`` and the group fits
        again without the draining node(s) (:class:`NoticeWait`)."""
        info = _local_preemption_info()
        deadline_ms = getattr(info, "deadline_ms", None)
        log.warning("rank %d: preemption checkpoint %s; waiting for the node to be reclaimed or its replacement "
                    "to join (deadline_ms=%s)", self.rank, "committed" if committed else "NOT committed", deadline_ms)
        if self.actor is not None and self.rank == 0:
            self.actor.report_event.remote("preemption_wait", deadline_ms=deadline_ms, committed=committed)
        if self.output is not None:      # the node goes at the deadline: ship what it printed now
            self.output.flush()
        if committed:
            mark_checkpointed()
        wait = NoticeWait(committed=committed, fits=lambda: ray_group_fits(self.need, self.world_size),
                          end_wait=_advance_own_deadline)
        while not wait.check():
            time.sleep(REFIT_EVERY_S)
        self._wait_ended(info, wait.ended_at or time.time())
        while True:                      # the controller tears the group down at its next poll
            wait.check()
            time.sleep(REFIT_EVERY_S)

    def _wait_ended(self, info: Any, at: float) -> None:
        deadline_ms = getattr(info, "deadline_ms", None)
        ahead = f"{deadline_ms / 1000 - at:.1f} s before the deadline" if deadline_ms else "no deadline known"
        log.warning("rank %d: the worker group fits again without the draining node(s); restarting now (%s)",
                    self.rank, ahead)
        if self.actor is None or self.rank != 0:
            return
        try:
            import ray

            from spotwise.runtime.api import INSTANCE_LABEL

            ids = set(getattr(info, "preempted_node_ids", None) or [])
            instances = sorted((n.get("Labels") or {}).get(INSTANCE_LABEL, n["NodeID"]) for n in ray.nodes()
                               if n["NodeID"] in ids)
        except Exception:  # noqa: BLE001 - the event still says when; which nodes is a nicety
            instances = []
        self.actor.report_event.remote(WAIT_ENDED, at=at, deadline_ms=deadline_ms, instances=instances)

    def close(self) -> None:
        if self.poller:
            self.poller.close()
