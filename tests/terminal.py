"""A pseudo-terminal read by a terminal emulator (pyte), for tests of what a person sees on a
terminal: ``spotwise launch``'s live display (tests/e2e/test_launch.py, tests/engine/display/test_progress.py)."""

from __future__ import annotations

import os
import threading


class Terminal:
    """An 80x24 pseudo-terminal: what the process writes to :attr:`slave` is read on a thread and
    fed to a terminal emulator (pyte) as it comes. :attr:`display_rows` keeps every ``(row, line)``
    the screen showed that starts with ``step `` (the live display's first line), in order;
    :attr:`raw` the bytes as written. The screen keeps its scrolled-off lines (``history``)."""

    COLUMNS, ROWS = 80, 24

    def __init__(self) -> None:
        import fcntl
        import struct
        import termios

        import pyte

        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.ROWS, self.COLUMNS, 0, 0))
        self.screen = pyte.HistoryScreen(self.COLUMNS, self.ROWS, history=100_000)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.display_rows: list[tuple[int, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._ended = threading.Event()
        self._changed = threading.Condition()

    def start(self) -> None:
        os.close(self.slave)      # the child holds it now
        self._reader.start()

    def _read(self) -> None:
        """Read while the process runs; once :meth:`close` says it ended, what is left (node
        processes that inherited the terminal may outlive it: their later output is not waited for)."""
        import select

        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                if self._ended.is_set():
                    return
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:       # EIO: every writer is gone
                return
            if not chunk:
                return
            with self._changed:   # the screen changes under the lock wait_for reads it with
                self.raw += chunk
                self.stream.feed(chunk)
                for row, line in enumerate(self.screen.display):
                    seen = (row, line.rstrip())
                    if line.startswith("step ") and (not self.display_rows or self.display_rows[-1] != seen):
                        self.display_rows.append(seen)
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60) -> bool:
        """Wait until the screen shows ``text`` (an event, not a sleep); whether it did."""
        with self._changed:
            return self._changed.wait_for(lambda: any(text in line for line in self.screen.display), timeout)

    def close(self) -> None:
        """After the process ended: drain what it wrote, stop reading."""
        self._ended.set()
        self._reader.join()
        os.close(self.master)

    def text(self) -> str:
        """Every line the terminal showed, scrolled off or still on the screen, oldest first."""
        def line(chars) -> str:
            return "".join(chars[x].data for x in range(self.COLUMNS)).rstrip()

        return "\n".join([*(line(c) for c in self.screen.history.top), *(s.rstrip() for s in self.screen.display)])
