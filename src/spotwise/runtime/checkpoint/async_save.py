"""Asynchronous checkpoints: training stalls only while the state is copied to host memory.

:class:`AsyncCheckpointer` wraps a :class:`~spotwise.runtime.checkpoint.checkpointer.Checkpointer` that runs
on its OWN gloo process group, created once, collectively, when the saver is built:

1. ``save_async`` (collective, training thread): wait for the previous save to finish, copy the
   model/optimizer state dict to reused host buffers (:class:`~spotwise.runtime.checkpoint.staging.HostStager`)
   and capture the RNG states, then hand the copy to a background thread and return.
2. Background thread, on every rank in the same order: DCP-write this rank's shard, upload it
   (S3), then the commit all-reduce of the checkpointer on the saver's group: it doubles as the
   barrier "every rank's shard is durable" and as the vote "every rank succeeded"; rank 0 writes
   ``COMMITTED`` only after it, and only if all succeeded. So a torn checkpoint is never
   committed and, without a marker, never loaded.

Why a separate group: the background collectives (DCP's plan gather, the commit vote) then never
interleave with the training loop's collectives on the default group, and a GPU job's NCCL
stream is not involved (the staged copy is on the host). Why one save at a time: the host
buffers are reused and the background collectives must be issued in the same order on every
rank; waiting at the next checkpoint boundary (``save_async``/``wait``) guarantees both.

Just-in-time saves (preemption notice, stop, final) are synchronous: ``save_sync`` first waits
for any in-flight async save (so its commit cannot race the JIT one), then saves and commits in
the calling thread. A background save that fails (after the storage retries) is logged and
reported through ``failures``; training goes on and the previous good checkpoint stays.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

from spotwise.runtime.checkpoint.checkpointer import CheckpointInfo, Checkpointer, SaveFailed, rng_state
from spotwise.runtime.checkpoint.staging import HostStager
from spotwise.runtime.storage.base import Storage

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class AsyncTiming:
    """Main-thread stall of the last ``save_async`` and the background write time."""

    wait_s: float = 0.0        # waiting for the previous save at this boundary
    stage_s: float = 0.0       # copy to host memory
    write_s: float = 0.0       # background: write + upload + commit (of the last finished save)

    @property
    def stall_s(self) -> float:
        return self.wait_s + self.stage_s


class AsyncCheckpointer:
    """Collective over the default group's ranks; construct it on every rank at the same point."""

    def __init__(self, storage: Storage, *, keep_last: int = 2,
                 on_commit: Callable[[CheckpointInfo], None] | None = None,
                 staging_root: str | None = None) -> None:
        self._own_pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.ckpt = Checkpointer(storage, keep_last=keep_last, process_group=self._own_pg,
                                 staging_root=staging_root)
        self.on_commit = on_commit
        self.stager = HostStager()
        self.timing = AsyncTiming()
        self.last_committed: CheckpointInfo | None = None
        self.failures: list[str] = []
        self._thread: threading.Thread | None = None

    @property
    def storage(self) -> Storage:
        return self.ckpt.storage

    def save_async(self, state_fn: Callable[[], dict[str, Any]], *, step: int, kind: str = "periodic") -> float:
        """Stage ``state_fn()`` and write it in the background; returns the stall in seconds.

        ``state_fn`` builds the (live) state dict; it is called after the previous save finished.
        """
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        staged = self.stager.stage(state_fn())
        rng = rng_state()
        t2 = time.perf_counter()
        self.timing.wait_s, self.timing.stage_s = t1 - t0, t2 - t1
        self._thread = threading.Thread(target=self._write, args=(staged, step, kind, rng),
                                        name=f"spotwise-ckpt-{step}", daemon=True)
        self._thread.start()
        return t2 - t0

    def _write(self, staged: dict[str, Any], step: int, kind: str, rng: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            info = self.ckpt.save(staged, step=step, kind=kind, rng=rng)
        except SaveFailed as e:
            log.warning("async checkpoint step %d failed; the previous one stays: %s", step, e)
            self.failures.append(str(e))
            return
        except BaseException as e:  # noqa: BLE001 - a dead background thread must not go unnoticed
            log.exception("async checkpoint step %d crashed", step)
            self.failures.append(f"{type(e).__name__}: {e}")
            return
        finally:
            self.timing.write_s = time.perf_counter() - t0
        self.last_committed = info
        if self.on_commit is not None:
            try:
                self.on_commit(info)
            except Exception:  # noqa: BLE001 - reporting is best effort
                log.warning("on_commit callback failed", exc_info=True)

    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> CheckpointInfo | None:
        """Block until the in-flight save (if any) has committed or failed; the newest commit."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.last_committed

    def save_sync(self, state: dict[str, Any], *, step: int, kind: str) -> CheckpointInfo:
        """Just-in-time save: wait for the in-flight one, then save and commit now (collective)."""
        self.wait()
        info = self.ckpt.save(state, step=step, kind=kind)
        self.last_committed = info
        if self.on_commit is not None:
            self.on_commit(info)
        return info

    def close(self) -> None:
        self.wait()
        if self._own_pg is not None:
            dist.destroy_process_group(self._own_pg)
            self._own_pg = None
