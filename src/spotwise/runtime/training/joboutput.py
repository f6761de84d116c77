"""The job's own output: what the driver and every rank print, as line records shipped off the node.

A Ray worker's stdout and stderr go to log files on its own node, which a spot preemption or the
run's teardown deletes with the node; the driver's go to the Jobs API, which dies with the head.
So each process of the job (the driver on the head, every Ray Train rank) runs inside
:func:`captured`: ``sys.stdout`` and ``sys.stderr`` become :class:`Tee` s that still write where
they wrote before (Ray's files, the terminal) and also cut what passes into complete lines, each
a record::

    {"t": 1800000000.0, "rank": "1", "node": "sw1a2b3c4d5e-worker-ab12", "stream": "stdout", "line": "..."}

(``rank`` is ``"driver"`` for the driver). The logging handlers that held the old streams are
pointed at the tees, so ``logging`` output (a user's traceback logged by the trainer included) is
captured too. A :class:`Shipper` thread hands the records to ``send`` (the run's control actor,
:meth:`spotwise.runtime.training.control.Control.append_output`) every :data:`SHIP_EVERY_S`; the
orchestrator reads them from the control endpoint into its database and the run's storage.

Bounds, so that a chatty loop cannot exhaust a worker's memory: a line longer than
:data:`MAX_LINE_CHARS` is cut (with a note of how much was cut), and at most :data:`BUFFER_LINES`
unsent lines are held; past that the oldest are dropped and one record says how many. What is
not yet shipped when the process ends (or gets its preemption notice: the trainer calls
:meth:`Shipper.flush`) is shipped before it goes: :func:`captured` flushes on the way out, a
partial last line included. Output written below Python (a C library writing to fd 1) is not
seen: it still reaches the node's own log file.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

#: the longest line kept whole (characters); a longer one is cut and says by how much
MAX_LINE_CHARS = 2000
#: unsent lines one process holds at most; past it the oldest go (and a record says how many)
BUFFER_LINES = 5000
#: how often the shipper sends what was printed
SHIP_EVERY_S = 0.5
#: at most this many records per send (one actor call), so a burst is sent in bounded pieces
SEND_BATCH = 1000

#: the lines Ray itself writes into a worker's streams to name its actor or task (its log monitor
#: reads them); not the job's output
RAY_MARKERS = (":actor_name:", ":task_name:")

Send = Callable[[list[dict]], Any]


def clip(line: str, limit: int = MAX_LINE_CHARS) -> str:
    """``line`` cut to ``limit`` characters, saying how many were cut."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} [... {len(line) - limit} more characters cut]"


class LineBuffer:
    """Complete lines from writes to each stream, as records; thread safe and bounded.

    ``write`` keeps a stream's unfinished line until its newline (or :meth:`end_partial`); ``take``
    hands over the records so far, oldest first, preceded by a note when some were dropped."""

    def __init__(self, *, rank: str, node: str, max_lines: int = BUFFER_LINES,
                 max_chars: int = MAX_LINE_CHARS) -> None:
        self.rank, self.node = rank, node
        self.max_chars = max_chars
        self._lines: deque[dict] = deque(maxlen=max_lines)
        self._partial: dict[str, str] = {}
        self._dropped = 0
        self._lock = threading.Lock()

    def _add(self, stream: str, line: str, t: float) -> None:
        if line.startswith(RAY_MARKERS):
            return
        if len(self._lines) == self._lines.maxlen:
            self._dropped += 1
        self._lines.append({"t": t, "rank": self.rank, "node": self.node, "stream": stream,
                            "line": clip(line.rstrip("\r"), self.max_chars)})

    def write(self, stream: str, text: str) -> None:
        if not text:
            return
        t = time.time()
        with self._lock:
            pending = self._partial.pop(stream, "") + text
            *done, rest = pending.split("\n")
            for line in done:
                self._add(stream, line, t)
            if rest:
                # an unfinished line is held, but never grows past what would be kept of it
                self._partial[stream] = rest if len(rest) <= 4 * self.max_chars else rest[:4 * self.max_chars]

    def end_partial(self) -> None:
        """Unfinished lines become records (the process is ending: nothing will finish them)."""
        with self._lock:
            for stream, rest in sorted(self._partial.items()):
                self._add(stream, rest, time.time())
            self._partial.clear()

    def take(self, most: int = SEND_BATCH) -> list[dict]:
        with self._lock:
            out: list[dict] = []
            if self._dropped:
                out.append({"t": time.time(), "rank": self.rank, "node": self.node, "stream": "stderr",
                            "line": f"[spotwise: {self._dropped} lines of this process dropped: it printed "
                                    "faster than they could be shipped]"})
                self._dropped = 0
            while self._lines and len(out) < most:
                out.append(self._lines.popleft())
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._lines) + bool(self._dropped)


class Tee(io.TextIOBase):
    """A text stream that writes to ``original`` and copies what it writes into ``buffer`` as
    ``stream``'s lines. Everything else (``fileno``, ``isatty``, ``encoding``) is the original's,
    so code that looks at ``sys.stdout`` sees the stream it had."""

    def __init__(self, original: TextIO, stream: str, buffer: LineBuffer) -> None:
        super().__init__()
        self.original, self.stream, self.buffer = original, stream, buffer

    def write(self, s: str) -> int:
        n = self.original.write(s)
        try:
            self.buffer.write(self.stream, s)
        except Exception:  # noqa: BLE001 - copying output must never break the program printing it
            pass
        return len(s) if n is None else n

    def flush(self) -> None:
        self.original.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.original.isatty()

    def fileno(self) -> int:
        return self.original.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.original, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        if name == "original":                 # not set yet (or being copied): never recurse
            raise AttributeError(name)
        return getattr(self.original, name)


class Shipper:
    """A daemon thread that sends ``buffer``'s records to ``send`` every ``every_s`` seconds.

    ``send`` is called from one thread at a time (the shipper's, or :meth:`flush`'s caller), so
    records arrive in the order they were printed; a failed send is retried with the next batch
    (the records stay in the buffer), since the control actor may be briefly unreachable."""

    def __init__(self, buffer: LineBuffer, send: Send, *, every_s: float = SHIP_EVERY_S) -> None:
        self.buffer, self.send, self.every_s = buffer, send, every_s
        self._held: list[dict] = []             # taken, not yet accepted by ``send``
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="spotwise-output", daemon=True)

    def start(self) -> "Shipper":
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.flush()

    def flush(self) -> bool:
        """Send everything buffered now; whether it all went."""
        with self._lock:
            while True:
                if not self._held:
                    self._held = self.buffer.take()
                if not self._held:
                    return True
                try:
                    self.send(self._held)
                except Exception:  # noqa: BLE001 - kept, tried again on the next flush
                    return False
                self._held = []

    def close(self) -> bool:
        """Stop the thread and send what is left (the unfinished lines included)."""
        self._stop.set()
        if self._t.is_alive():
            self._t.join(timeout=5.0)
        self.buffer.end_partial()
        return self.flush()


def _repoint_handlers(old: object, new: Any) -> list[logging.StreamHandler]:
    """Point every logging handler writing to ``old`` at ``new``; the handlers moved."""
    moved = []
    for lg in [logging.getLogger(), *[v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger)]]:
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is old:
                h.setStream(new)
                moved.append(h)
    return moved


@contextmanager
def captured(send: Send, *, rank: str, node: str, every_s: float = SHIP_EVERY_S) -> Iterator[Shipper]:
    """Inside: ``sys.stdout``/``sys.stderr`` (and the logging handlers on them) are copied, line by
    line, to ``send``; on the way out everything is shipped and the streams are put back."""
    buffer = LineBuffer(rank=rank, node=node)
    old_out, old_err = sys.stdout, sys.stderr
    tee_out, tee_err = Tee(old_out, "stdout", buffer), Tee(old_err, "stderr", buffer)
    sys.stdout, sys.stderr = tee_out, tee_err
    moved = [(h, old_out) for h in _repoint_handlers(old_out, tee_out)]
    moved += [(h, old_err) for h in _repoint_handlers(old_err, tee_err)]
    shipper = Shipper(buffer, send, every_s=every_s).start()
    try:
        yield shipper
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a closed stream: what was buffered is shipped anyway
            pass
        sys.stdout, sys.stderr = old_out, old_err
        for h, stream in moved:
            if h.stream in (tee_out, tee_err):
                h.setStream(stream)
        shipper.close()


def node_label() -> str:
    """This process's node as the orchestrator names it: the instance id the node's
    ``spotwise-instance`` Ray label carries (the boot script sets it), else Ray's node id, cut;
    the host name outside Ray (never starting Ray for it)."""
    import socket

    import ray

    from spotwise.runtime.api import INSTANCE_LABEL

    if not ray.is_initialized():
        return socket.gethostname()
    ctx = ray.get_runtime_context()
    try:
        label = (ctx.get_node_labels() or {}).get(INSTANCE_LABEL)
    except Exception:  # noqa: BLE001 - an older Ray: the node id says as much
        label = None
    return str(label or ctx.get_node_id()[:12])
