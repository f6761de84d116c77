"""The training loop, with no Ray in it: sharding, precision, checkpointing, stop/preemption
handling and exact resume around a user's model, data, optimizer and loss.

Public API (see ``docs/runtime.md``)::

    spec = TrainSpec(model_fn=..., batch_fn=..., loss_fn=..., optimizer_fn=..., steps=1000)
    result = run_loop(spec, session)     # inside an initialised process group

``session`` is how the loop talks to where it runs: :class:`LocalSession` (plain torch /
torchrun), or the Ray Train session of :mod:`spotwise.runtime.training.trainer`. This module must not
import ray at top level: the standalone entry point runs where Ray is not installed.

Structure (like torchtitan's ``train -> train_step -> forward_backward_step``): :func:`run_loop`
sets up and then only steps, times and agrees on stop/preemption; :func:`train_step` is one
optimizer step and :func:`forward_backward_step` its micro-batches; which checkpoint a step needs,
and writing it, is :mod:`spotwise.runtime.training.saving`'s :class:`CheckpointPolicy`.

Exactness contract: with the same spec and seed, the final weights are bitwise identical whether
or not the run was interrupted, provided ``batch_fn`` is a pure function of its arguments (the
loop restores model, optimizer, step and per-rank RNG from the newest committed checkpoint).
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from spotwise.runtime.checkpoint.checkpointer import CheckpointInfo, Checkpointer
from spotwise.runtime.checkpoint.digest import model_sha256
from spotwise.runtime.checkpoint.layout import latest_committed
from spotwise.runtime.training.evaluate import eval_due, evaluate
from spotwise.runtime.training.determinism import describe, deterministic_mode, resolve_deterministic
from spotwise.runtime.training.optim import Diverged, NonFiniteGuard, build_optimizer
from spotwise.runtime.training.parallel import device_for_rank, parallelize, resolve_precision
from spotwise.runtime.training.saving import CheckpointPolicy, Saver, load_train_state, train_state
from spotwise.runtime.training.spec import Batch, TrainSpec
from spotwise.runtime.weights.load import RESUMING
from spotwise.runtime.storage.base import Storage

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class LoopResult:
    steps_completed: int
    final_checkpoint: str | None
    model_sha256: str | None
    precision: str                          # what ran: bf16 | fp32
    stopped: str | None = None
    resumed_from: int | None = None
    preempted: bool = False
    losses: list[float] = field(default_factory=list)
    save_stalls: list[float] = field(default_factory=list)   # training-thread seconds per periodic save
    # set when the periodic interval was shortened because a save does not fit the notice window:
    # {"window_s", "save_s", "step_s", "interval_before", "interval"} (the report says so)
    checkpoint_window: dict | None = None
    # the held-out losses this attempt measured: [{"step", "loss", "train_loss"}, ...] (spec.eval_fn;
    # train_loss: the step's training loss averaged over all ranks)
    eval_loss: list[dict] = field(default_factory=list)
    skipped_steps: int = 0                  # updates not applied: a non-finite loss or gradient norm
    diverged: str | None = None             # why the run ended without its checkpoint (NonFiniteGuard)


class Session(Protocol):
    """Where the loop runs. ``local_*`` are this rank's view; the loop agrees on them collectively."""

    def local_stop_reason(self) -> str | None: ...
    def agreed_stop_reason(self) -> str | None:
        """The reason, once the group has agreed to stop: another rank may have seen the request
        first, so this may ask the orchestrator (once; never on the per-step path)."""
        ...
    def local_preempted(self) -> bool: ...
    def report_progress(self, step: int, loss: float, perf: dict | None = None) -> None:
        """``step`` done with training loss ``loss``; ``perf``: :meth:`StepMeter.tick`'s figures."""
        ...
    def report_checkpoint(self, info: CheckpointInfo) -> None: ...
    def report_resume(self, from_step: int, world_size: int) -> None: ...
    def after_preemption_checkpoint(self, committed: bool = True) -> None:
        """After a just-in-time checkpoint (``committed``: False when it failed): no more work."""
        ...


class LocalSession:
    """No orchestrator: never stops early; a preemption flag can be raised by a watcher thread."""

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.preempted = False
        self.checkpoints: list[CheckpointInfo] = []
        self.resumes: list[tuple[int, int]] = []
        self.evals: list[tuple[int, float]] = []
        self.perf: dict | None = None       # the last step's figures (StepMeter)

    def report_eval(self, step: int, loss: float, train_loss: float | None = None) -> None:
        self.evals.append((step, loss))

    def local_stop_reason(self) -> str | None:
        return self.stop_reason

    def agreed_stop_reason(self) -> str | None:
        return self.local_stop_reason()

    def local_preempted(self) -> bool:
        return self.preempted

    def report_progress(self, step: int, loss: float, perf: dict | None = None) -> None:
        self.perf = perf

    def report_checkpoint(self, info: CheckpointInfo) -> None:
        self.checkpoints.append(info)

    def report_resume(self, from_step: int, world_size: int) -> None:
        self.resumes.append((from_step, world_size))

    def after_preemption_checkpoint(self, committed: bool = True) -> None:
        """Standalone: the process exits after the just-in-time checkpoint."""


def _to(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


def _split(batch: Batch, n: int) -> list[Batch]:
    if n == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        if batch.shape[0] % n:
            raise ValueError(f"per-rank batch of {batch.shape[0]} is not divisible by grad_accum {n}")
        return list(batch.chunk(n))
    if isinstance(batch, dict):
        by_key = {k: _split(v, n) for k, v in batch.items()}
        return [{k: by_key[k][i] for k in by_key} for i in range(n)]
    if isinstance(batch, (list, tuple)):
        parts = [_split(v, n) for v in batch]
        return [type(batch)(p[i] for p in parts) for i in range(n)]
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}")


def full_model_sha256(model: nn.Module) -> str | None:
    """sha256 of the full (unsharded) model state dict; collective; the digest on rank 0 only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    rank = dist.get_rank() if dist.is_initialized() else 0
    return model_sha256(sd) if rank == 0 else None


class _Agreement:
    """Every rank sees the same stop/preempt decision, at the same steps.

    One 3-int all-reduce (MAX) every ``every`` steps: ``(stop, preempt, next_every)``, where only
    rank 0 proposes ``next_every`` (from its step time and ``interval_s``) and the others send 0,
    so the reduction hands every rank rank 0's value: the schedule of the next agreement is agreed
    by the agreement itself. The first agreement is after the first step.
    """

    def __init__(self, device: torch.device, interval_s: float) -> None:
        self.buf = torch.zeros(3, dtype=torch.int32, device=device)
        self.interval_s = interval_s
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.next_step = 0
        self.count = 0

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def __call__(self, step: int, stop: bool, preempt: bool, step_time: float | None) -> tuple[bool, bool]:
        every = 1
        if self.interval_s > 0 and step_time:
            every = max(1, min(1000, int(self.interval_s / step_time)))
        self.count += 1
        if not dist.is_initialized():
            self.next_step = step + every
            return stop, preempt
        self.buf[0], self.buf[1] = int(stop), int(preempt)
        self.buf[2] = every if self.rank == 0 else 0
        dist.all_reduce(self.buf, op=dist.ReduceOp.MAX)
        a, b, every = self.buf.tolist()
        self.next_step = step + max(1, every)
        return bool(a), bool(b)


@contextmanager
def _frozen_heap():
    """Keep the collector off the heap that exists before the first step.

    Under Ray Train the worker holds ~370k tracked objects (Ray, torch, boto3) before training
    starts; every full collection walks all of them (~0.2 s on the dev machine), which is about 3 %
    of a 7 s span of small CPU steps when one lands in it, and the loop's per-step garbage
    triggers them. ``gc.freeze`` moves everything alive now to the permanent generation (after a
    collection, so no garbage is frozen); only what the steps allocate is collected. Undone at the
    end unless the caller had frozen the heap itself.
    """
    gc.collect()
    already = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not already:
            gc.unfreeze()


class StepMeter:
    """The run's speed as the progress, curves and ``/metrics`` show it: ``tick(step)`` after each
    step returns ``tokens_per_s`` (the spec's global tokens a step over the wall time of the last
    :attr:`WINDOW` steps, checkpoint and eval pauses included: what the clock gets),
    ``model_flops_per_s`` (that times ``flops_per_token``: the engine divides it by ``world`` GPUs'
    peak for MFU) and ``peak_memory_bytes`` / ``memory_kind``
    (:func:`spotwise.runtime.memory.peak_memory`, this rank's: FSDP ranks are alike). A figure the
    spec cannot give is absent; the first step of an attempt has no rate yet."""

    WINDOW = 20

    def __init__(self, tokens_per_step: int | None, flops_per_token: float | None, device: torch.device,
                 world: int = 1) -> None:
        self.tokens, self.flops, self.device, self.world = tokens_per_step, flops_per_token, device, world
        self._ends: deque[tuple[float, int]] = deque(maxlen=self.WINDOW + 1)

    def tick(self, step: int) -> dict:
        from spotwise.runtime.memory import peak_memory

        self._ends.append((time.monotonic(), step))
        peak, kind = peak_memory(self.device)
        out: dict = {"peak_memory_bytes": peak, "memory_kind": kind, "world": self.world}
        (t0, s0), (t1, s1) = self._ends[0], self._ends[-1]
        if self.tokens and s1 > s0 and t1 > t0:
            rate = self.tokens * (s1 - s0) / (t1 - t0)
            out["tokens_per_s"] = rate
            if self.flops:
                out["model_flops_per_s"] = rate * self.flops
        return out


def forward_backward_step(spec: TrainSpec, model: nn.Module, micro: list[Batch], device: torch.device) -> torch.Tensor:
    """Forward and backward over one step's micro-batches, gradients accumulated in ``model``.

    Each micro-batch's loss is scaled by ``1 / grad_accum`` so the gradient is the full batch's
    mean. Under FSDP2 every micro-batch's backward reduce-scatters its gradients and adds them to
    the sharded ones, as torchtitan's ``Trainer.train_step`` does (``torchtitan/train.py``: no
    ``set_requires_gradient_sync(False)`` between micro-batches): a rank holds ``1/world`` of the
    gradients, not each parameter's unsharded gradient (fp32: 32 GB per GPU for ``8b``) until the
    last micro-batch, for one reduce-scatter per micro-batch instead of one per step
    (``tests/runtime/training/test_grad_memory.py`` measures the peak). Returns the step's loss
    (detached, on ``device``: reading it is left to the caller, it syncs)."""
    total = torch.zeros((), device=device)
    for mb in micro:
        loss = spec.loss_fn(model, mb) / spec.grad_accum
        loss.backward()
        total += loss.detach()
    return total


def train_step(spec: TrainSpec, model: nn.Module, optim: torch.optim.Optimizer, step: int, *,
               rank: int, world: int, device: torch.device, guard: NonFiniteGuard | None = None) -> float:
    """One optimizer step: learning rate for ``step``, this rank's batch, forward/backward,
    gradient clipping, update. Returns the step's loss: with a ``guard``, averaged over all ranks
    (the guard's all-reduce carries it), else this rank's own. A pure function of ``step`` and the
    model/optimizer state, which is what makes a resumed run bitwise identical. With a ``guard``,
    a step whose loss or gradient norm is not finite is not applied (:class:`NonFiniteGuard`)."""
    if spec.lr_fn is not None:
        for g in optim.param_groups:
            g["lr"] = spec.lr_fn(step)
    micro = _split(_to(spec.batch_fn(step, rank, world), device), spec.grad_accum)
    total = forward_backward_step(spec, model, micro, device)
    norm = grad_norm(model, spec.grad_clip) if spec.grad_clip or guard is not None else None
    if guard is None or norm is None or guard.apply(step, total, norm):
        optim.step()
    optim.zero_grad(set_to_none=True)
    return guard.mean_loss if guard is not None and norm is not None else float(total)


def grad_norm(model: nn.Module, clip: float | None) -> torch.Tensor:
    """The global gradient norm, after clipping the gradients to ``clip`` when it is set (as
    ``clip_grad_norm_`` always did here); a sharded (DTensor) norm is made whole, so every rank
    holds the same value."""
    from torch.distributed.tensor import DTensor

    params = [p for p in model.parameters() if p.grad is not None]
    if clip:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def fix_threads(n: int | None, device: torch.device) -> None:
    """``torch.set_num_threads(n)`` on a CPU rank (a fixed count keeps CPU results bitwise
    reproducible, and ranks sharing a machine from oversubscribing it); a GPU rank keeps torch's
    default, since its host threads (data, optimizer launch, checkpoint staging) feed the GPU."""
    if n and device.type == "cpu":
        torch.set_num_threads(n)


def _restore(ckpt: Checkpointer, model: nn.Module, optim: torch.optim.Optimizer) -> CheckpointInfo | None:
    """Load the newest committed checkpoint into ``model`` and ``optim``; None when there is none."""
    state = train_state(model, optim)
    loaded = ckpt.load_latest(state)
    if loaded is not None:
        load_train_state(model, optim, state)
    return loaded


def run_loop(spec: TrainSpec, session: Session, storage: Storage) -> LoopResult:
    """Train ``spec`` to ``spec.steps`` from the newest committed checkpoint in ``storage``.

    Runs on every rank of the default process group (a single process without one). Returns
    early with ``stopped`` set after a stop checkpoint, or with ``preempted=True`` after a
    just-in-time checkpoint (under Ray the session blocks instead, until the node is reclaimed).

    The loop itself only steps, times and agrees: :func:`train_step` does the math and the
    :class:`CheckpointPolicy` decides which save a step needs and writes it.
    """
    device = device_for_rank()
    deterministic = resolve_deterministic(spec.deterministic, device)
    with deterministic_mode(deterministic, device):
        return _run(spec, session, storage, device, deterministic)


def _run(spec: TrainSpec, session: Session, storage: Storage, device: torch.device, deterministic: bool) -> LoopResult:
    fix_threads(spec.num_threads, device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(spec.seed)

    precision = resolve_precision(spec.precision, device)
    if rank == 0:
        log.info("training in %s on %s (precision=%s)", precision, device, spec.precision)
        log.info("%s", describe(deterministic, device))
    resuming = RESUMING.set(latest_committed(storage) is not None)
    try:
        built = spec.model_fn()
    finally:
        RESUMING.reset(resuming)
    model = parallelize(built, device=device, precision=precision,
                        activation_checkpointing=spec.activation_checkpointing, compile=spec.compile,
                        shard_blocks=spec.shard_blocks)
    optim = build_optimizer(spec.optimizer_fn, model)
    # Distinct per-rank RNG streams (used by nothing in the built-in model, but by user code).
    torch.manual_seed(spec.seed * 1_000_003 + rank)
    ckpt = Checkpointer(storage, keep_last=spec.keep_last)
    loaded = _restore(ckpt, model, optim)
    start = loaded.step if loaded is not None else 0
    final_uri = loaded.uri if loaded is not None else None
    if loaded is not None:
        session.report_resume(start, world)

    agree = _Agreement(device, spec.agree_interval_s)
    guard = NonFiniteGuard(limit=spec.max_nonfinite_steps) if spec.max_nonfinite_steps else None
    saver = Saver(spec, ckpt, model, optim, on_commit=session.report_checkpoint)
    policy = CheckpointPolicy(spec, saver)
    step_time: float | None = None
    meter = StepMeter(spec.tokens_per_step, spec.flops_per_token, device, world)
    losses: list[float] = []
    evals: list[dict] = []
    step = start
    stopped = None
    with _frozen_heap():
        if start == 0 and spec.eval_fn is not None:
            evaluate(spec, session, model, 0, rank=rank, world=world, device=device, into=evals)
        while step < spec.steps:
            t0 = time.perf_counter()
            try:
                loss = train_step(spec, model, optim, step, rank=rank, world=world, device=device, guard=guard)
            except Diverged as e:           # every rank raises it at the same step: the guard agreed
                log.error("%s", e)
                saver.close()               # an in-flight periodic save of a good step completes
                return LoopResult(steps_completed=step, final_checkpoint=final_uri, model_sha256=None,
                                  resumed_from=loaded.step if loaded else None, losses=losses,
                                  save_stalls=saver.stalls, precision=precision, checkpoint_window=policy.window,
                                  skipped_steps=guard.skipped if guard else 0, diverged=str(e))
            step += 1
            losses.append(loss)
            session.report_progress(step, loss, meter.tick(step))
            dt = time.perf_counter() - t0
            step_time = dt if step_time is None else 0.9 * step_time + 0.1 * dt
            if eval_due(spec, step):
                evaluate(spec, session, model, step, rank=rank, world=world, device=device, into=evals,
                         train_loss=loss)

            if step >= spec.steps:
                break
            stop = preempt = False
            if agree.due(step):
                stop, preempt = agree(step, session.local_stop_reason() is not None, session.local_preempted(),
                                      step_time)
            kind = policy.due(step, stop=stop, preempt=preempt)
            if kind is None or (kind == "periodic" and guard is not None and guard.streak):
                continue        # no periodic save in a run of skipped steps: it may be the start of a divergence
            info = policy.save(kind, step, step_time)
            if info is not None:
                final_uri = info.uri
            if kind == "preemption":
                saver.close()
                session.after_preemption_checkpoint(committed=info is not None)
                return LoopResult(steps_completed=step, final_checkpoint=final_uri, model_sha256=None,
                                  resumed_from=loaded.step if loaded else None, preempted=True, losses=losses,
                                  save_stalls=saver.stalls, precision=precision, checkpoint_window=policy.window,
                                  eval_loss=evals, skipped_steps=guard.skipped if guard else 0)
            if kind == "stop":
                stopped = session.agreed_stop_reason() or "stop requested"
                break

        if stopped is None and step > start:
            final_uri = saver.save_sync(step, "final").uri
        saver.close()
        sha = full_model_sha256(model)
        return LoopResult(steps_completed=step, final_checkpoint=final_uri, model_sha256=sha, stopped=stopped,
                          resumed_from=loaded.step if loaded else None, losses=losses, save_stalls=saver.stalls,
                          precision=precision, checkpoint_window=policy.window, eval_loss=evals,
                          skipped_steps=guard.skipped if guard else 0)
