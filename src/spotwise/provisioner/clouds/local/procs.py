"""The local cloud's processes: finding and ending what a local "instance" started.

A local instance is a ``ray start --block`` process group plus its watcher, and every process of it
(Ray re-parents some helpers away from the group) inherits the marker variable :data:`MARKER_ENV`
naming its instance: the local equivalent of a cloud's instance tags. Finding a node's processes
is scanning ``/proc`` for that marker; ending them is killing until the scan finds nothing.

Split from :mod:`spotwise.provisioner.clouds.local.cloud` (which re-exports :data:`MARKER_ENV`,
:func:`marked_pids` and :func:`cluster_of`): these functions know processes, not clouds, and are
what ``down``/``gc`` and the test emulators use without a :class:`LocalCloud`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from spotwise.utils.procs import group_alive as _alive
from spotwise.utils.procs import kill_until_gone  # noqa: F401 - re-exported: the local cloud's name for it
from spotwise.utils.procs import proc_state

MARKER_ENV = "SPOTWISE_LOCAL_INSTANCE"   # inherited by every process of a node: the local "tag"

#: What a node's environment needs besides the marker for the marker to stay readable. Ray renames
#: its processes (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``, the dashboard's
#: ``ray-dashboard-*Head`` modules) with setproctitle, which by default writes the longer title over
#: the process's original environment block, the one ``/proc/PID/environ`` shows: 11 of a head's 20
#: processes lost the marker, so ``down``, ``gc``, the dead man's switch (``--self-end local``) and
#: the test emulators never saw them, and an orphaned agent went on spinning. ``SPT_NOENV``
#: (honoured by setproctitle and by Ray's vendored copy) keeps the environment where it is.
KEEP_MARKER_ENV = {"SPT_NOENV": "1"}


def marked_pids(instance_id: str | None = None, *, prefix: str | None = None,
                home_prefix: str | None = None) -> list[int]:
    """PIDs of processes started for a local instance (any instance when ``instance_id`` is None).

    Ray re-parents some helpers (agents, workers) away from the ``ray start`` process; they all
    inherit the marker variable, so scanning ``/proc`` finds every one of them. ``home_prefix``
    keeps only processes whose ``SPOTWISE_HOME`` starts with it (one test's or one user's nodes).
    """
    if prefix is not None:
        want = f"{MARKER_ENV}={prefix}".encode()
        instance_id = None
    else:
        want = f"{MARKER_ENV}={instance_id}".encode() if instance_id else f"{MARKER_ENV}=".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if _zombie(d):  # already dead, only waiting for its parent to reap it
            continue
        items = env.split(b"\0")
        if home_prefix is not None and not any(
                i.startswith(b"SPOTWISE_HOME=" + home_prefix.encode()) for i in items):
            continue
        for item in items:
            if item == want or (instance_id is None and item.startswith(want)):
                out.append(int(d.name))
                break
    return out


def cluster_of(instance_id: str) -> str:
    """The cluster id of a local instance id (``<cluster>-<role>-<hex>``)."""
    parts = instance_id.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else instance_id


def marked_instances(spotwise_home: str) -> dict[int, str]:
    """{pid: instance id} of live processes of local nodes whose ``SPOTWISE_HOME`` is exactly
    ``spotwise_home`` (other users' and other test sessions' nodes are not ours to end)."""
    want_home = f"SPOTWISE_HOME={spotwise_home}".encode()
    marker = f"{MARKER_ENV}=".encode()
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or _zombie(d):
            continue
        try:
            items = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want_home not in items:
            continue
        for item in items:
            if item.startswith(marker):
                out[int(d.name)] = item[len(marker):].decode(errors="replace")
                break
    return out


def _zombie(proc_dir: Path) -> bool:
    """A zombie, or gone while we looked (no state to read): either way nothing left to end."""
    return proc_state(int(proc_dir.name)) in ("Z", None)


def kill_marked(instance_id: str) -> None:
    """SIGKILL every process of the instance; returns once none is left."""
    kill_until_gone(lambda: marked_pids(instance_id))


def kill_groups(pgids: list[int], grace: float = 3.0) -> None:
    """End several process groups at once: SIGTERM to each, up to ``grace`` seconds (shared, not
    one per group) for all of them to go, then SIGKILL to whatever is left. Ending a cluster's
    nodes one after the other cost the grace period once per node."""
    live = []
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGTERM)
            live.append(pgid)
        except ProcessLookupError:
            continue
    deadline = time.time() + grace
    while time.time() < deadline and any(_alive(p) for p in live):
        time.sleep(0.05)
    for pgid in live:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:  # reap our own child if it is one
            os.waitpid(pgid, os.WNOHANG)
        except ChildProcessError:
            pass
