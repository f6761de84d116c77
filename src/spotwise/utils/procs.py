"""Is a process still running? (Linux ``/proc``; a zombie is dead, only not yet reaped.)

``os.kill(pid, 0)`` succeeds for a zombie too, so a finished child that its parent has not waited
for would look alive forever; the state letter in ``/proc/PID/stat`` tells them apart.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``Z``…), or None when ``/proc`` cannot tell."""
    try:
        # the command name (field 2) may contain spaces and ")" — the state follows the last ")"
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(probe: Callable[[int, int], None], pid: int) -> bool:
    try:
        probe(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # exists, but belongs to someone else
    return proc_state(pid) != "Z"   # unknown state (no /proc): trust the signal probe


def pid_alive(pid: int | None) -> bool:
    """True when ``pid`` is a running (not zombie) process on this machine; False for None or 0."""
    if not pid:
        return False
    return _alive(os.kill, pid)


def group_alive(pgid: int) -> bool:
    """True when process group ``pgid`` still has members and its leader is not a zombie."""
    return _alive(os.killpg, pgid)


def kill_until_gone(scan, timeout: float = 15.0) -> set[int]:
    """SIGKILL what ``scan()`` finds, again and again, until it finds nothing (or ``timeout``).

    SIGKILL is delivered asynchronously and Ray may fork a worker between a scan and the kill,
    so one pass is not enough: an instance reported "terminated" must really be gone, or `gc`
    would report a lie. Returns every pid it killed.
    """
    killed: set[int] = set()
    deadline = time.time() + timeout
    while True:
        pids = scan()
        if not pids or time.time() > deadline:
            return killed
        for pid in pids:
            killed.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:  # reap our own children so they do not linger as zombies
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.05)
