"""Retries with exponential backoff and jitter for pages of a price API.

Only errors a retry can fix are retried (throttling, 5xx, connection resets); the caller says
which through ``retryable``. ``sleep`` is injectable so tests run without waiting.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def with_retries(fn: Callable[[], T], *, retryable: Callable[[BaseException], bool], attempts: int = 5,
                 base_delay: float = 0.5, max_delay: float = 20.0,
                 sleep: Callable[[float], None] = time.sleep, what: str = "request") -> T:
    """Call ``fn`` up to ``attempts`` times; back off 0.5, 1, 2 … s (± jitter) between tries."""
    from spotwise.pricing.live import FetchError

    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified by ``retryable``
            if not retryable(e):
                raise
            if i == attempts - 1:
                raise FetchError(f"{what} still failing after {attempts} attempts: {e}") from e
            delay = min(max_delay, base_delay * (2 ** i))
            sleep(delay * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")
