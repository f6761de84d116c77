"""Copy a run's last committed checkpoint from one store to another (another cloud's bucket).

A run may keep its checkpoints in a different store on each cloud it lands on (``s3://`` on AWS,
``gs://`` on GCP: each cloud's nodes reach only their own with their own identity). When the
run moves to a cloud whose store does not hold its newest checkpoint, the launcher copies that
checkpoint across with its own credentials before training is submitted there, so the nodes load
it from their own store as from any other checkpoint (:meth:`Checkpointer.load_latest`).

Contract (:func:`copy_latest`):

* only the newest **committed** checkpoint of the source is copied (a torn one is never a resume
  point), every object of its step directory (DCP shards, ``.metadata``, RNG, ``train_state.json``)
  and the ``COMMITTED`` marker **last**: a copy cut short leaves a torn directory in the
  destination, which the loader never loads and deletes once it loads an older one;
* a destination that already holds that step committed (or a newer one) is left alone: copying
  is idempotent, and a retry after a partial copy starts the step over (its torn objects are
  overwritten, objects of that step that the source lacks are deleted first);
* the destination's older committed checkpoints are pruned to ``keep_last`` after the commit, as
  the trainer's own saves prune them (never before: a failed copy destroys nothing).

Objects pass through a local temporary file (bounded memory for multi-GB shards; each backend's
``put_file`` already uploads in parts); the bytes moved are returned so the caller can record
what the copy cost in egress.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from spotwise.runtime.checkpoint.layout import COMMIT_MARKER, PREFIX, committed_steps, newest_step, step_dir  # noqa: F401
from spotwise.runtime.storage.base import Storage

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class Copied:
    """One checkpoint copied: its step, how many objects and bytes crossed, and how long it took."""

    step: int
    objects: int
    bytes: int
    seconds: float


def copy_latest(src: Storage, dst: Storage, *, keep_last: int = 2, work_dir: Path | None = None) -> Copied | None:
    """Copy ``src``'s newest committed checkpoint into ``dst`` (both a run's root: ``<uri>/<run>``),
    its commit marker last (see the module docstring). None when there is nothing to copy: ``src``
    has no committed checkpoint, or ``dst`` already holds that step (or a newer one) committed.
    Raises what the stores raise (after their own retries): the destination then holds at most a
    torn directory, never a half checkpoint that loads."""
    step = newest_step(src)
    if step is None:
        return None
    have = newest_step(dst)
    if have is not None and have >= step:
        return None
    t0 = time.monotonic()
    key = step_dir(step)
    keys = src.list(key + "/")
    marker = f"{key}/{COMMIT_MARKER}"
    if marker not in keys:             # pruned between the listings: the caller asks again
        raise FileNotFoundError(f"{src.uri}: checkpoint step {step} vanished while being copied")
    dst.delete_prefix(key + "/")       # a torn earlier try of this step: start it over
    moved = 0
    tmp = Path(tempfile.mkdtemp(prefix=f"spotwise-copy-{step}-", dir=work_dir))
    try:
        for k in [k for k in keys if k != marker] + [marker]:     # the marker last
            local = tmp / "obj"
            src.get_file(k, local)
            moved += local.stat().st_size
            dst.put_file(local, k)
            local.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(dst, keep_last)
    out = Copied(step=step, objects=len(keys), bytes=moved, seconds=time.monotonic() - t0)
    log.info("copied checkpoint step %d (%d objects, %d bytes) from %s to %s in %.1f s", step, out.objects,
             out.bytes, src.uri, dst.uri, out.seconds)
    return out


def _prune(storage: Storage, keep_last: int) -> None:
    """Older checkpoints than the ``keep_last``-th newest committed one go (as the trainer prunes)."""
    committed = committed_steps(storage)
    if len(committed) <= keep_last:
        return
    oldest_kept = committed[-keep_last]
    for key in {k.split("/")[1] for k in storage.list(PREFIX + "/") if k.count("/") >= 2}:
        if key.startswith("step_") and int(key[5:]) < oldest_kept:
            storage.delete_prefix(f"{PREFIX}/{key}/")
