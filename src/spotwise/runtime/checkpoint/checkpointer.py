"""Sharded checkpoints with a commit protocol: one DCP shard per rank, a marker written last.

Layout, relative to the run's storage root (``<storage_uri>/<run_name>``)::

    checkpoints/step_000000120/
        .metadata               DCP global metadata (coordinator rank)
        __<rank>_0.distcp       one shard file per rank (torch.distributed.checkpoint)
        rng/rank_<r>.json       per-rank RNG states (torch, numpy, python) as plain JSON
        train_state.json        step, world size, seed, kind
        COMMITTED               written LAST by rank 0, after every rank's files are stored

Contract:

* A checkpoint without ``COMMITTED`` is torn (the writer died mid-save) and is never loaded; the
  next :meth:`Checkpointer.load_latest` deletes torn directories newer than what it loaded.
* Only committed checkpoints count toward ``keep_last``; older directories are deleted only after
  a newer commit, so a failed save never destroys the previous good checkpoint.
* What is saved: model and optimizer state via ``get_state_dict`` (FSDP2 DTensors, optimizer
  flattened with ``StateDictOptions(flatten_optimizer_state_dict=True)`` so it reshards to any
  world size), the step (= data position: data is a pure function of the step), per-rank RNG.
* Shards are written with DCP's ``FileSystemWriter`` straight into the destination for
  ``file://`` storage, or into a per-rank local staging directory that is then uploaded (S3).

Trust boundary (what loading a checkpoint executes): nothing. A checkpoint store is shared with
whoever can write to the bucket or directory, so a load must not run code found there. Python's
pickle runs code by design, and stock DCP unpickles ``.metadata`` and loads non-tensor items with
``torch.load(weights_only=False)``. Here every file is read without arbitrary unpickling:
``.metadata`` through :class:`RestrictedUnpickler` (only DCP's own metadata classes, ``torch.Size``,
dtypes, layouts and ``pathlib`` paths; anything else is refused with :class:`UnsafeCheckpoint`),
non-tensor items through ``torch.load(weights_only=True)`` (:class:`SafeLoadPlanner`), tensors as
DCP already does (``weights_only=True``), and the RNG state spotwise writes itself is JSON of
ints. Someone who can write to the store can still change the *weights* a run resumes from
(integrity is not authenticated); they cannot run code on the workers.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torch.distributed.checkpoint.api import CheckpointException

# the layout and its torch-free reads (the launcher, the copy and the watcher use them without torch)
from spotwise.runtime.checkpoint.layout import (  # noqa: F401
    COMMIT_MARKER,
    PREFIX,
    CheckpointInfo,
    committed_steps,
    latest_committed,
    run_storage,
    step_dir,
)
from spotwise.runtime.storage.base import Storage

log = logging.getLogger(__name__)


class SaveFailed(RuntimeError):
    """A checkpoint could not be stored on every rank (after retries); it was not committed."""


@dataclass(kw_only=True, slots=True)
class SaveTiming:
    """Seconds spent in each phase of the last save (for the Young/Daly interval and benchmarks)."""

    stage_s: float = 0.0      # state dict to host memory (async) / DCP write (sync)
    upload_s: float = 0.0     # write + upload to storage
    commit_s: float = 0.0     # barrier + marker


def rng_state() -> dict[str, Any]:
    """This rank's RNG states: torch's CPU generator, numpy's, python's, and, on a rank that has
    used CUDA, its current device's CUDA generator (dropout and any ``torch.rand`` on the GPU draw
    from that one, so a resume without it would not be exact)."""
    out = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(s: dict[str, Any]) -> None:
    """The inverse of :func:`rng_state`; a CUDA state is restored where CUDA is (a checkpoint
    written on a GPU and loaded on a CPU has no CUDA generator to give it to)."""
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state(s["cuda"])


def rng_to_json(s: dict[str, Any]) -> bytes:
    """RNG states as JSON of plain ints/floats/strings: loading them back needs no unpickling.

    torch (and cuda, when present): the generator's byte state; numpy: ``('MT19937', keys[624], pos, has_gauss, cached)``;
    python: ``(version, internal state tuple, gauss_next)``. Exact: every value round-trips.
    """
    kind, keys, pos, has_gauss, cached = s["numpy"]
    version, internal, gauss_next = s["python"]
    doc = {"format": 1,
           "torch": s["torch"].tolist(),
           "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
           "python": [int(version), [int(x) for x in internal], gauss_next]}
    if "cuda" in s:
        doc["cuda"] = s["cuda"].tolist()
    return json.dumps(doc).encode()


def rng_from_json(raw: bytes) -> dict[str, Any]:
    """The inverse of :func:`rng_to_json`; a malformed document raises :class:`UnsafeCheckpoint`."""
    try:
        d = json.loads(raw)
        if d.get("format") != 1:
            raise ValueError(f"unknown rng format {d.get('format')!r}")
        kind, keys, pos, has_gauss, cached = d["numpy"]
        version, internal, gauss_next = d["python"]
        out = {"torch": torch.tensor(d["torch"], dtype=torch.uint8),
               "numpy": (str(kind), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
               "python": (int(version), tuple(int(x) for x in internal),
                          None if gauss_next is None else float(gauss_next))}
        if "cuda" in d:
            out["cuda"] = torch.tensor(d["cuda"], dtype=torch.uint8)
        return out
    except (ValueError, KeyError, TypeError) as e:
        raise UnsafeCheckpoint(f"{UNSAFE}: rng state is not spotwise's JSON format: {e}") from None


UNSAFE = "unsafe checkpoint"


class UnsafeCheckpoint(RuntimeError):
    """A checkpoint file asked for something loading must never do (run code, import a module
    outside the allowlist) or is not in the format spotwise writes; nothing of it was loaded."""


_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                    ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` and nothing else: ``find_class`` allows only DCP's metadata
    types, ``torch.Size``, torch dtypes/memory formats, the layout helper and POSIX paths, so a
    crafted file (``os.system`` in a ``__reduce__``) raises :class:`UnsafeCheckpoint` instead of
    running. Why not plain ``pickle``: the store is writable by more people than the workers trust."""

    def find_class(self, module: str, name: str):
        import importlib

        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, name)
        if module in _DCP_MODULES and not name.startswith("__"):
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type):
                return obj
        raise UnsafeCheckpoint(f"{UNSAFE}: metadata refers to {module}.{name}, which spotwise never writes; "
                               "refusing to load it (it could run code)")


def _safe_reader(path: str):
    """A DCP ``FileSystemReader`` whose ``.metadata`` goes through :class:`RestrictedUnpickler`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rank = kwargs.get("rank")
            with self.fs.create_stream(self._get_metadata_path(rank), "rb") as f:
                try:
                    metadata = RestrictedUnpickler(f).load()
                except UnsafeCheckpoint:
                    raise
                except Exception as e:  # noqa: BLE001 - truncated or garbage: not a checkpoint we wrote
                    raise UnsafeCheckpoint(f"{UNSAFE}: metadata is unreadable: {type(e).__name__}: {e}") from None
            if not isinstance(metadata, Metadata):
                raise UnsafeCheckpoint(f"{UNSAFE}: metadata is a {type(metadata).__name__}, not DCP Metadata")
            storage_meta = getattr(metadata, "storage_meta", None)     # absent in older pickles
            if storage_meta is None:
                storage_meta = metadata.storage_meta = StorageMeta()
            storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(path)


def _safe_planner():
    """DCP's default load planner, but non-tensor items load with ``weights_only=True``."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner()


def all_steps(storage: Storage) -> list[int]:
    """Steps of every checkpoint directory, committed or torn, ascending."""
    steps = set()
    for key in storage.list(PREFIX + "/"):
        parts = key.split("/")
        if len(parts) >= 3 and parts[1].startswith("step_"):
            steps.add(int(parts[1][5:]))
    return sorted(steps)


class Checkpointer:
    """Saves and restores one run's training state; every method is collective over the group.

    ``process_group``: the group DCP and the commit barrier use (default group when None). An
    async saver passes a separate gloo group so background collectives never interleave with the
    training loop's.
    """

    def __init__(self, storage: Storage, *, keep_last: int = 2, process_group=None,
                 staging_root: str | None = None) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.storage = storage
        self.keep_last = keep_last
        self.pg = process_group
        self.staging_root = staging_root
        self.last_timing = SaveTiming()

    # -- save ------------------------------------------------------------------------------------
    def save(self, state: dict[str, Any], *, step: int, kind: str, extra: dict | None = None,
             rng: dict[str, Any] | None = None) -> CheckpointInfo:
        """Write ``state`` (a DCP state dict: ``{"model": ..., "optim": ...}``) as step ``step``.

        Returns once the checkpoint is committed (marker written) on every rank. The ranks agree
        on success with one all-reduce after every rank has stored its files: the marker is
        written only when ALL succeeded; otherwise every rank raises :class:`SaveFailed`, the
        partial directory is removed (best effort) and the previous committed checkpoint is
        untouched. ``rng``: the RNG states to store (default: the current ones).
        """
        t0 = time.perf_counter()
        rank, world = self._rank(), self._world()
        key = step_dir(step)
        error: BaseException | None = None
        t1 = t0
        try:
            t1 = self._write_files(state, key, rank, rng if rng is not None else rng_state())
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - CheckpointException is a BaseException
            error = e
            log.warning("rank %d: writing checkpoint step %d failed: %s", rank, step, e)
        t2 = time.perf_counter()
        if not self._all_ok(error is None):
            if rank == 0:
                try:
                    self.storage.delete_prefix(key + "/")
                except Exception:  # noqa: BLE001 - storage may be down; load ignores torn dirs
                    log.warning("could not remove failed checkpoint %s", key, exc_info=True)
            raise SaveFailed(f"checkpoint step {step} ({kind}) not committed: "
                             f"{error or 'another rank failed to store its shard'}") from error
        info = CheckpointInfo(step=step, uri=self.storage.child_uri(key), kind=kind, world_size=world)
        if rank == 0:
            meta = {"step": step, "kind": kind, "world_size": world, "time": time.time(), **(extra or {})}
            try:
                self.storage.put_bytes(f"{key}/train_state.json", json.dumps(meta).encode())
                self.storage.put_bytes(f"{key}/{COMMIT_MARKER}", json.dumps(meta).encode())
                error = None
            except Exception as e:  # noqa: BLE001 - any storage failure: every rank must hear it (_all_ok below)
                error = e
        if not self._all_ok(error is None):
            raise SaveFailed(f"checkpoint step {step} ({kind}): commit marker not written: {error}") from error
        if rank == 0:
            try:
                self.prune()
            except Exception:  # noqa: BLE001 - pruning is retried after the next commit
                log.warning("pruning old checkpoints failed", exc_info=True)
        t3 = time.perf_counter()
        self.last_timing = SaveTiming(stage_s=t1 - t0, upload_s=t2 - t0, commit_s=t3 - t2)
        return info

    def _write_files(self, state: dict[str, Any], key: str, rank: int, rng: dict[str, Any]) -> float:
        """DCP-write this rank's shard (+ rng) under ``key``; returns when it is stored."""
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint import save as dcp_save

        local = self.storage.local_path(key)
        staging = None
        if local is None:
            staging = Path(tempfile.mkdtemp(prefix=f"spotwise-ckpt-r{rank}-", dir=self.staging_root))
            target = staging
        else:
            target = local
            target.mkdir(parents=True, exist_ok=True)
        try:
            dcp_save(state, storage_writer=FileSystemWriter(str(target), sync_files=False),
                     process_group=self.pg, no_dist=not dist.is_initialized())
            t1 = time.perf_counter()
            self.storage.put_bytes(f"{key}/rng/rank_{rank}.json", rng_to_json(rng))
            if staging is not None:
                for p in sorted(staging.rglob("*")):
                    if p.is_file():
                        self.storage.put_file(p, f"{key}/{p.relative_to(staging).as_posix()}")
            return t1
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _all_ok(self, ok: bool) -> bool:
        """True when ``ok`` on every rank (one all-reduce; also the barrier before the marker)."""
        if not dist.is_initialized():
            return ok
        dev = "cuda" if dist.get_backend(self.pg) == "nccl" else "cpu"
        t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.pg)
        return bool(t.item())

    def prune(self) -> None:
        """Delete checkpoints older than the ``keep_last``-th newest committed one (rank 0 only)."""
        committed = committed_steps(self.storage)
        if len(committed) <= self.keep_last:
            return
        oldest_kept = committed[-self.keep_last]
        for s in all_steps(self.storage):
            if s < oldest_kept:
                self.storage.delete_prefix(step_dir(s) + "/")

    # -- load ------------------------------------------------------------------------------------
    def load_latest(self, state: dict[str, Any]) -> CheckpointInfo | None:
        """Load the newest committed checkpoint into ``state`` (in place); None when there is none.

        All ranks agree on the step (rank 0 decides). RNG states are restored when the checkpoint
        was written at the same world size (a resharded run keeps its freshly seeded RNG). Torn
        checkpoint directories newer than the loaded one are deleted by rank 0.
        """
        from torch.distributed.checkpoint import load as dcp_load

        rank, world = self._rank(), self._world()
        info = latest_committed(self.storage) if rank == 0 else None
        if dist.is_initialized():
            box = [info]
            dist.broadcast_object_list(box, src=0, group=self.pg)
            info = box[0]
        if info is None:
            return None
        key = step_dir(info.step)
        local = self.storage.local_path(key)
        staging = None
        if local is None:
            staging = Path(tempfile.mkdtemp(prefix=f"spotwise-load-{info.step}-r{rank}-", dir=self.staging_root))
            for k in self.storage.list(key + "/"):
                rel = k[len(key) + 1:]
                if rel.startswith("rng/") or rel in (COMMIT_MARKER, "train_state.json"):
                    continue
                self.storage.get_file(k, staging / rel)
            src = staging
        else:
            src = local
        try:
            try:
                dcp_load(state, storage_reader=_safe_reader(str(src)), planner=_safe_planner(),
                         process_group=self.pg, no_dist=not dist.is_initialized())
            except CheckpointException as e:   # DCP wraps each rank's error; say which kind it was
                if UNSAFE in str(e):
                    raise UnsafeCheckpoint(f"{UNSAFE}: step {info.step} in {info.uri}: "
                                           f"{str(e).split(UNSAFE, 1)[1].split(chr(10))[0].strip(': ')}") from None
                raise
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        if info.world_size == world:
            raw = self.storage.get_bytes(f"{key}/rng/rank_{rank}.json")
            if raw is not None:
                set_rng_state(rng_from_json(raw))
            elif self.storage.get_bytes(f"{key}/rng/rank_{rank}.pt") is not None:
                # written by an older spotwise as a pickle: never unpickled; the run keeps its
                # freshly seeded RNG (the weights and step still resume)
                log.warning("checkpoint step %d: rng/rank_%d.pt is a pickle from an older spotwise; "
                            "not loaded (RNG restarts from the seed)", info.step, rank)
        if rank == 0:
            for s in all_steps(self.storage):
                if s > info.step:
                    self.storage.delete_prefix(step_dir(s) + "/")
        self._barrier()
        return info

    # -- helpers ---------------------------------------------------------------------------------
    def _rank(self) -> int:
        return dist.get_rank(self.pg) if dist.is_initialized() else 0

    def _world(self) -> int:
        return dist.get_world_size(self.pg) if dist.is_initialized() else 1

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier(group=self.pg)
