"""``spotwise launch``'s and ``resume``'s live display on a terminal (no command of its own).

When stderr is a terminal, a Rich ``Live`` region at the bottom of it shows the run's progress
(:func:`spotwise.engine.display.progress.progress_lines` of the orchestrator's :attr:`progress`, which the
monitor refreshes each tick) redrawn in place twice a second, cut to the terminal's width. The event
sentences the journal prints to ``sys.stderr`` are redirected above the region, so they scroll as
plain lines. The region is transient: when the run ends it is erased and the summary (or the JSON
report on stdout) follows as before.

Off a terminal (a pipe, a file, ``TERM=dumb``) nothing changes: the same plain lines, no control
code. With ``--format json`` on a terminal the display is shown too (stderr only): the report on
stdout is unchanged, and a script reading stdout never sees the display.

Cheap to import (the CLI imports every module of this package): Rich is imported when used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

#: redraws per second: often enough that the step moves, rarely enough to cost nothing
REFRESH_PER_S = 2


@contextlib.contextmanager
def live_progress(progress: Callable[[], Any]) -> Iterator[None]:
    """While the block runs, the display of ``progress()`` (a :class:`~spotwise.engine.display.progress.Progress`)
    on stderr when stderr is a terminal; otherwise nothing."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal or console.is_dumb_terminal:
        yield
        return
    from rich.live import Live
    from rich.text import Text

    from spotwise.engine.display.progress import progress_lines

    def render() -> Text:
        return Text("\n".join(progress_lines(progress(), width=console.width)), no_wrap=True, overflow="crop")

    with Live(get_renderable=render, console=console, refresh_per_second=REFRESH_PER_S, transient=True,
              redirect_stdout=False, redirect_stderr=True):
        yield
