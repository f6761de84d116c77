"""Retry-with-backoff for throttled cloud API calls (shared by the cloud modules).

Only *throttling* is retried here — each cloud module decides what counts as throttling by error
code. Capacity, quota and auth errors are never retried in place: failover handles them.
The sleep function is injectable so tests run without waiting.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def with_backoff(fn: Callable[[], T], *, is_throttle: Callable[[BaseException], bool],
                 attempts: int = 6, base_s: float = 0.5, cap_s: float = 20.0,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``; on a throttling error sleep (full-jitter exponential) and try again.

    After ``attempts`` throttled tries the last error is raised for the caller to map.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - re-raised unless it is throttling
            if not is_throttle(e) or attempt == attempts - 1:
                raise
            sleep(random.uniform(0, min(cap_s, base_s * 2 ** attempt)))
    raise AssertionError("unreachable")
