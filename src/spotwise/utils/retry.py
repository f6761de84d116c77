"""Retry with exponential backoff and jitter: the one loop behind every retried cloud call.

The caller decides *what* is worth retrying (``should_retry``: throttling for the provisioner, also 5xx
and connection resets for the price APIs) and what to raise when the tries run out (``give_up``):
a retry loop knows nothing about clouds. ``sleep`` is injectable so tests run without waiting.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def full_jitter(delay: float) -> float:
    """Anywhere in ``[0, delay]`` (AWS "full jitter"): spreads many throttled clients the most."""
    return random.uniform(0, delay)


def half_jitter(delay: float) -> float:
    """Anywhere in ``[delay/2, delay]``: always waits at least half the backoff."""
    return delay * (0.5 + random.random() / 2)


def with_backoff(fn: Callable[[], T], *, should_retry: Callable[[BaseException], bool],
                 attempts: int = 6, base_s: float = 0.5, cap_s: float = 20.0,
                 jitter: Callable[[float], float] = full_jitter,
                 sleep: Callable[[float], None] = time.sleep,
                 give_up: Callable[[BaseException], BaseException] | None = None) -> T:
    """Call ``fn`` up to ``attempts`` times, sleeping ``jitter(min(cap_s, base_s * 2**i))`` between tries.

    An error ``should_retry`` rejects is raised at once, unchanged. When the last try fails with a
    retryable error, ``give_up(error)`` is raised from it if given, else the error itself.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified by ``should_retry``, re-raised otherwise
            if not should_retry(e):
                raise
            if attempt == attempts - 1:
                if give_up is not None:
                    raise give_up(e) from e
                raise
            sleep(jitter(min(cap_s, base_s * 2 ** attempt)))
    raise AssertionError("unreachable")
