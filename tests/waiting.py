"""Waiting on a state in a test: poll it with a bound (an upper limit for a loaded machine, never a
timing claim). The suite's rule: no sleep waits for a state (docs/architecture.md, "The test suite")."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(cond: Callable[[], Any], timeout: float, what: str, poll: float = 0.5) -> Any:
    """``cond()``'s first truthy value, polled every ``poll`` s; an assertion naming ``what`` after
    ``timeout`` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
