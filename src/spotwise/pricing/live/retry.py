"""Retries for pages of a price API: :func:`spotwise.utils.retry.with_backoff` with the pricing policy.

Only errors a retry can fix are retried (throttling, 5xx, connection resets); the caller says
which through ``retryable``. Each wait is 0.5, 1, 2 … s, cut by up to half (never shorter, so a
throttled page is not hammered), and running out of tries is a :class:`FetchError` naming the
request. ``sleep`` is injectable so tests run without waiting.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from spotwise.utils.retry import half_jitter, with_backoff

T = TypeVar("T")


def with_retries(fn: Callable[[], T], *, retryable: Callable[[BaseException], bool], attempts: int = 5,
                 base_delay: float = 0.5, max_delay: float = 20.0,
                 sleep: Callable[[float], None] = time.sleep, what: str = "request") -> T:
    """Call ``fn`` up to ``attempts`` times; back off 0.5, 1, 2 … s (± jitter) between tries."""
    from spotwise.pricing.live import FetchError

    def give_up(e: BaseException) -> BaseException:
        return FetchError(f"{what} still failing after {attempts} attempts: {e}")

    return with_backoff(fn, should_retry=retryable, attempts=attempts, base_s=base_delay, cap_s=max_delay,
                        jitter=half_jitter, sleep=sleep, give_up=give_up)
