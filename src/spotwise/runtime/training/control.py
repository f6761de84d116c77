"""The channel between the orchestrator and a running training job.

A named Ray actor (namespace ``spotwise``, name ``control-<run_name>``) created by the
orchestrator before ``fit``. Training ranks report progress, checkpoints and resumes to it, and
poll it for a stop request (budget exhausted, user cancel). It is a plain class so unit tests and
the Ray-less training loop can use it in-process.

It also holds the job's own output on its way to the orchestrator (:meth:`Control.append_output`,
from every process's :mod:`spotwise.runtime.training.joboutput` shipper; :meth:`Control.output`, read through
the control endpoint): each line gets the next sequence number, and at most :data:`OUTPUT_KEEP`
unread-or-recent lines are held, so a run whose orchestrator is away cannot fill the head's memory
(the lines that fell out are reported as a gap when read).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

NAMESPACE = "spotwise"
#: lines of the job's output the control actor holds (read or not); older ones are dropped
OUTPUT_KEEP = 20000
#: most lines one :meth:`Control.output` call returns
OUTPUT_PAGE = 2000


def actor_name(run_name: str) -> str:
    return f"control-{run_name}"


@dataclass
class _State:
    stop_reason: str | None = None
    started_at: float | None = None          # wall time of the first progress report
    step: int = 0                            # highest step completed so far
    loss: float | None = None                # the training loss last reported (averaged over the ranks)
    step_time: float | None = None
    perf: dict | None = None                 # its speed and memory figures (StepMeter.tick)
    checkpoints: list[dict] = field(default_factory=list)
    resumes: list[dict] = field(default_factory=list)
    # the held-out losses, one per step (a step measured again after a resume replaces its value)
    eval_loss: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    user_errors: dict[str, dict] = field(default_factory=dict)   # attempt id -> its first user error
    output: deque = field(default_factory=lambda: deque(maxlen=OUTPUT_KEEP))   # records with their seq
    output_seq: int = 0                      # the last sequence number given
    output_read: int = 0                     # the highest ``after`` a reader has passed (all before it read)


class Control:
    """State of one run as training reports it. All methods are cheap and idempotent-friendly."""

    def __init__(self) -> None:
        self._s = _State()

    # -- orchestrator side ---------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if self._s.stop_reason is None:
            self._s.stop_reason = reason
            self._s.events.append({"t": time.time(), "event": "stop_requested", "reason": reason})

    def snapshot(self) -> dict:
        s = self._s
        return {
            "stop_reason": s.stop_reason,
            "started_at": s.started_at,
            "step": s.step,
            "loss": s.loss,
            "step_time": s.step_time,
            "perf": dict(s.perf) if s.perf else None,
            "checkpoints": list(s.checkpoints),
            "resumes": list(s.resumes),
            "eval_loss": [{"step": k, "loss": v, "train_loss": tr} for k, (v, tr) in sorted(s.eval_loss.items())],
            "events": list(s.events),
            "user_errors": [{k: v for k, v in e.items() if k != "tail"} for e in s.user_errors.values()],
        }

    # -- training side -------------------------------------------------------------------------
    def stop_requested(self) -> str | None:
        return self._s.stop_reason

    def report_progress(self, step: int, loss: float | None = None, perf: dict | None = None) -> None:
        """``step`` completed, with training loss ``loss`` (when known: kept as the last loss even
        when ``step`` is not above the highest, since a resumed run reports again from its
        checkpoint) and ``perf``, the step's speed and memory figures
        (:class:`spotwise.runtime.training.loop.StepMeter`: finite numbers only are kept)."""
        if isinstance(perf, dict):
            self._s.perf = {k: (float(v) if not isinstance(v, str) else v) for k, v in perf.items()
                            if isinstance(v, str) or (isinstance(v, (int, float)) and math.isfinite(v))}
        now = time.time()
        if self._s.started_at is None:
            self._s.started_at = now
        if step > self._s.step:
            self._s.step = step
            self._s.step_time = now
        if loss is not None and math.isfinite(loss):
            self._s.loss = float(loss)

    def poll(self, step: int | None = None, loss: float | None = None, perf: dict | None = None) -> str | None:
        """One round trip for the worker's poller: record ``step``, its ``loss`` and ``perf`` (when
        given) and return the stop reason. Progress rides on the stop poll so a training step never
        pays for an actor call."""
        if step is not None:
            self.report_progress(step, loss, perf)
        return self._s.stop_reason

    def report_checkpoint(self, step: int, uri: str, kind: str = "periodic") -> None:
        """``kind``: periodic | preemption | final | stop. A checkpoint at ``step`` also proves the
        run reached ``step``, so progress is raised to it (the just-in-time save of a preemption is
        then the highest step before the resume, even if the last poll was earlier)."""
        self.report_progress(step)
        self._s.checkpoints.append({"t": time.time(), "step": step, "uri": uri, "kind": kind})

    def report_eval(self, step: int, loss: float, train_loss: float | None = None) -> None:
        """The held-out loss measured at ``step``, and the step's training loss averaged over all
        ranks (None at step 0); a non-finite value is kept as None (JSON has no NaN)."""
        def fin(v: float | None) -> float | None:
            return float(v) if v is not None and math.isfinite(v) else None
        self._s.eval_loss[int(step)] = (fin(loss), fin(train_loss))

    def report_resume(self, from_step: int, world_size: int) -> None:
        self._s.resumes.append({"t": time.time(), "from_step": from_step, "world_size": world_size,
                                "max_step_before": self._s.step})

    def report_user_error(self, attempt: str, rank: int, error: str, tail: str) -> None:
        """An exception in user code ended worker-group attempt ``attempt``; the first rank's
        report of an attempt counts (every rank of it may report the same error)."""
        if attempt not in self._s.user_errors:
            self._s.user_errors[attempt] = {"t": time.time(), "rank": rank, "error": error, "tail": tail}
            self._s.events.append({"t": time.time(), "event": "user_error", "rank": rank, "error": error})

    def user_errors(self) -> list[dict]:
        """Every attempt that failed in user code, oldest first (with its traceback's tail)."""
        return list(self._s.user_errors.values())

    def report_event(self, event: str, **info) -> None:
        self._s.events.append({"t": time.time(), "event": event, **info})

    # -- the job's own output ----------------------------------------------------------------------
    def append_output(self, records: list[dict]) -> int:
        """Keep ``records`` (``t``, ``rank``, ``node``, ``stream``, ``line``) in order, each with
        the next ``seq``; the last ``seq`` given."""
        s = self._s
        for r in records:
            s.output_seq += 1
            s.output.append({**r, "seq": s.output_seq})
        return s.output_seq

    def output(self, after: int = 0, limit: int = OUTPUT_PAGE) -> dict:
        """The lines after ``seq`` ``after`` (at most ``limit``) and ``next``, the cursor to pass
        next time. Passing ``after`` says every line up to it was read (what :meth:`output_unread`
        counts). Lines that were dropped before they were read come back as one note (``rank``
        ``"spotwise"``) in their place."""
        s = self._s
        s.output_read = max(s.output_read, min(after, s.output_seq))
        lines = [r for r in s.output if r["seq"] > after][:max(0, limit)]
        first = s.output[0]["seq"] if s.output else s.output_seq + 1
        if first > after + 1 and lines:
            gap = first - after - 1
            lines.insert(0, {"t": lines[0]["t"], "rank": "spotwise", "node": "", "stream": "stderr",
                             "line": f"[spotwise: {gap} lines dropped on the head before they were read]",
                             "seq": first - 1})
        return {"lines": lines, "next": lines[-1]["seq"] if lines else after}

    def output_unread(self) -> int:
        """Lines not yet acknowledged by a reader (see :meth:`output`)."""
        return self._s.output_seq - self._s.output_read


HEAD_RESOURCE = "spotwise-head"


def create_actor(run_name: str, *, pin_to_head: bool = False):
    """Create (or get) the control actor for ``run_name``.

    ``pin_to_head``: place it on the node that offers the ``spotwise-head`` resource (the cluster's
    on-demand head), so that a spot worker being reclaimed never takes the run's state with it.
    """
    import ray

    cls = ray.remote(num_cpus=0, max_restarts=0)(Control)
    opts: dict = {"name": actor_name(run_name), "namespace": NAMESPACE, "get_if_exists": True}
    if pin_to_head:
        opts["resources"] = {HEAD_RESOURCE: 0.01}
    return cls.options(**opts).remote()


def get_actor(run_name: str):
    """The control actor of ``run_name``, or None when not running under a spotwise orchestrator."""
    import ray

    try:
        return ray.get_actor(actor_name(run_name), namespace=NAMESPACE)
    except ValueError:
        return None
