"""When and how the training loop checkpoints: the :class:`CheckpointPolicy` decides which save
a step needs (preemption, stop, periodic) and owns the periodic interval (configured, or the
Young/Daly optimum measured on a first save, shortened to fit the cloud's notice window); the
:class:`Saver` writes (periodic saves staged and written in the background, the others
synchronously) and records what a save cost.

Every decision that depends on a measurement takes rank 0's (broadcast), so every rank saves at
the same steps: a checkpoint is a collective. Like :mod:`spotwise.runtime.training.loop`, nothing here
imports Ray.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Literal

import torch
import torch.distributed as dist
from torch import nn

from spotwise.runtime.checkpoint.checkpointer import CheckpointInfo, Checkpointer, SaveFailed
from spotwise.runtime.training.spec import TrainSpec

if TYPE_CHECKING:
    from spotwise.runtime.checkpoint.async_save import AsyncCheckpointer

log = logging.getLogger("spotwise.runtime.training.loop")     # the loop's log, as before the split


def train_state(model: nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """The DCP state dict of model + optimizer (sharded; optimizer flattened for resharding).

    An optimizer without state gets a fresh one first (:func:`~spotwise.runtime.training.optim.init_optimizer_state`):
    ``get_state_dict`` would otherwise prime it with a zero-gradient step that AdamW counts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from spotwise.runtime.training.optim import init_optimizer_state

    init_optimizer_state(optim)
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(flatten_optimizer_state_dict=True))
    return {"model": msd, "optim": osd}


def load_train_state(model: nn.Module, optim: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(flatten_optimizer_state_dict=True))


def young_daly_interval(save_s: float, mtbi_s: float, step_s: float) -> int:
    """Optimal steps between checkpoints: ``sqrt(2 * save_s * mtbi_s) / step_s`` (at least 1)."""
    if step_s <= 0:
        return 1
    return max(1, int(math.sqrt(2.0 * max(save_s, 1e-6) * mtbi_s) / step_s))


class Saver:
    """How the loop writes a checkpoint: periodic saves async (or sync), JIT/stop/final saves sync.

    Records the training-thread stall of every periodic save in ``stalls`` (seconds). When to
    save is :class:`CheckpointPolicy`'s business.
    """

    def __init__(self, spec: TrainSpec, ckpt: Checkpointer, model: nn.Module, optim: torch.optim.Optimizer, *,
                 on_commit: Callable[[CheckpointInfo], None]) -> None:
        self.ckpt, self.model, self.optim, self.on_commit = ckpt, model, optim, on_commit
        self.stalls: list[float] = []
        self.async_: AsyncCheckpointer | None = None
        if spec.async_save:
            from spotwise.runtime.checkpoint.async_save import AsyncCheckpointer

            self.async_ = AsyncCheckpointer(ckpt.storage, keep_last=spec.keep_last,
                                            on_commit=on_commit)

    def _state(self) -> dict[str, Any]:
        return train_state(self.model, self.optim)

    def periodic(self, step: int) -> None:
        t0 = time.perf_counter()
        if self.async_ is not None:
            self.async_.save_async(self._state, step=step, kind="periodic")
        else:
            try:
                self.on_commit(self.ckpt.save(self._state(), step=step, kind="periodic"))
            except SaveFailed:
                log.warning("periodic checkpoint step %d failed; the previous one stays", step, exc_info=True)
        self.stalls.append(time.perf_counter() - t0)

    def save_sync(self, step: int, kind: str) -> CheckpointInfo:
        if self.async_ is not None:
            return self.async_.save_sync(self._state(), step=step, kind=kind)
        info = self.ckpt.save(self._state(), step=step, kind=kind)
        self.on_commit(info)
        return info

    def save_cost(self) -> tuple[float, float]:
        """(training stall, full write time) of the last periodic save, in seconds."""
        if self.async_ is not None:
            self.async_.wait()
            return self.async_.timing.stall_s, self.async_.timing.write_s
        t = self.ckpt.last_timing
        return t.upload_s + t.commit_s, t.upload_s + t.commit_s

    def close(self) -> None:
        if self.async_ is not None:
            self.async_.close()


SaveKind = Literal["preemption", "stop", "periodic", "final"]


class CheckpointPolicy:
    """When the loop saves, and which kind of save: the one place that decides.

    :meth:`due` is asked after every step but the last, with the group's agreed stop/preemption
    flags: a preemption outranks a stop, which outranks a periodic save. Periodic saves come every
    ``interval`` steps. The interval is ``spec.checkpoint_interval``, or, when that is None, the
    Young/Daly optimum measured on a first save right after the first step
    (:func:`_interval_from_timing`); with a ``notice_window_s`` the first timed periodic save may
    shorten it once so a lost node loses about one window of work (:func:`_bound_to_window`,
    recorded in :attr:`window`). Every rank takes rank 0's measurements, so every rank saves at
    the same steps. :meth:`save` writes through the :class:`Saver`.
    """

    def __init__(self, spec: TrainSpec, saver: Saver) -> None:
        self.spec, self.saver = spec, saver
        self.interval = spec.checkpoint_interval
        self.window: dict | None = None
        self._window_checked = False

    def due(self, step: int, *, stop: bool, preempt: bool) -> SaveKind | None:
        """The save ``step`` needs (None: none)."""
        if preempt:
            return "preemption"
        if stop:
            return "stop"
        if self.interval is None or step % self.interval == 0:
            return "periodic"
        return None

    def save(self, kind: SaveKind, step: int, step_time: float | None) -> CheckpointInfo | None:
        """Write a ``kind`` checkpoint at ``step``; the committed checkpoint, or None.

        periodic: None (it commits in the background, or a failed one leaves the previous one);
        preemption: None when the just-in-time save fails (a restart resumes from the previous
        checkpoint; the node is about to go, there is nothing better to do); stop and final:
        synchronous, a failure raises :class:`SaveFailed`.
        """
        if kind == "periodic":
            self._periodic(step, step_time)
            return None
        if kind == "preemption":
            try:
                return self.saver.save_sync(step, kind)
            except SaveFailed:
                log.exception("just-in-time checkpoint failed; a restart resumes from the previous one")
                return None
        return self.saver.save_sync(step, kind)

    def _periodic(self, step: int, step_time: float | None) -> None:
        if self.interval is None:
            self.interval = _interval_from_timing(self.saver, self.spec, step_time, step)
            return
        self.saver.periodic(step)
        if not self._window_checked and self.spec.notice_window_s is not None:
            self._window_checked = True          # once, on the first timed save, at the same step everywhere
            self.interval, self.window = _bound_to_window(self.saver, self.spec, step_time, self.interval)


def _bound_to_window(saver: Saver, spec: TrainSpec, step_time: float | None,
                     interval: int) -> tuple[int, dict | None]:
    """Keep the work a lost node costs bounded when a checkpoint cannot be written inside the
    cloud's notice window.

    A just-in-time save takes about one full write (stall + write of the last periodic save). If
    that exceeds the window, the node may be gone before its JIT checkpoint commits, and a restart
    falls back to the last periodic one: so the interval becomes what one window of work is,
    ``window / step_time`` steps — but never shorter than one background write (saves cannot
    overlap) and never longer than it was. Every rank takes rank 0's measurement.
    """
    stall, write = saver.save_cost()
    save_s = stall + write
    st = step_time or 1.0
    window_s = float(spec.notice_window_s or 0.0)
    out: tuple[int, dict | None] = (interval, None)
    if save_s > window_s:
        n = min(interval, max(1, math.floor(window_s / st), math.ceil(write / st)))
        out = (n, {"window_s": window_s, "save_s": round(save_s, 3), "step_s": round(st, 4),
                   "interval_before": interval, "interval": n})
    box = [out]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    if box[0][1] is not None:
        log.warning("a checkpoint takes %.1f s, more than the %.0f s notice window: periodic checkpoints every "
                    "%d steps instead of %d, so a lost node loses about one window of work",
                    save_s, window_s, box[0][0], interval)
    return box[0]


def _interval_from_timing(saver: Saver, spec: TrainSpec, step_time: float | None, step: int) -> int:
    """First periodic save right away (it measures the save cost), then the Young/Daly interval.

    The cost that matters is the training stall (the staging copy when saving asynchronously),
    but saves cannot be closer together than one background write, so the interval is at least
    the write time in steps.
    """
    saver.periodic(step)
    stall, write = saver.save_cost()
    st = step_time or 1.0
    n = max(young_daly_interval(stall, spec.mtbi_s, st), math.ceil(write / st))
    # all ranks must agree on the interval: take rank 0's measurement
    box = [n]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    log.info("checkpoint interval %d steps (stall %.3fs, write %.3fs, step %.3fs, mtbi %.0fs)", box[0],
             stall, write, st, spec.mtbi_s)
    return box[0]
