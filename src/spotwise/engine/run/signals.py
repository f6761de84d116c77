"""How a job's runner treats SIGINT and SIGTERM, so that cleanup always finishes.

* While a run is under way (:func:`sigterm_raises`): SIGTERM raises :class:`Terminated` in the main
  thread — a :class:`KeyboardInterrupt`, so every ``finally`` runs and the orchestrator tears the
  cluster down. SIGTERM is what ``timeout``, systemd and Kubernetes send; the process is expected
  to be gone soon, so a SIGTERM ends the run *without* waiting for a final checkpoint (the last
  periodic one stands). SIGINT (Ctrl-C) keeps Python's meaning: ask training to stop at a
  checkpoint; a second SIGINT ends at once.
* While tearing down (:func:`deferred`): SIGINT and SIGTERM are *deferred* — recorded, not
  raised — so a second Ctrl-C, or a supervisor's SIGTERM, cannot abort the cleanup half-way and
  leave a node, a ``ray start`` or a watcher behind. Once teardown is done the caller says what
  arrived (an event) and the run ends as it was going to. Only SIGKILL can stop a teardown; the
  nodes' dead man's switch and ``spotwise gc`` cover that.

Signal handlers can only be set from the main thread; elsewhere (a test running the orchestrator
in a thread) both context managers change nothing.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: end the run now (teardown still runs)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated by signal {signal.Signals(signum).name}")
        self.signum = signum


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated` (instead of killing the process outright)."""
    if not _main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def deferred() -> Iterator[list[int]]:
    """Within: SIGINT and SIGTERM are recorded in the yielded list instead of interrupting."""
    got: list[int] = []
    if not _main_thread():
        yield got
        return

    def handler(signum, _frame):
        got.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)
