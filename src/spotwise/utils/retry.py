"""Retry with exponential backoff and jitter: the one loop behind every retried cloud call.

The caller decides *what* is worth retrying (``should_retry``: throttling for the provisioner, also 5xx
and connection resets for the price APIs), how long the server asked it to wait (``retry_after``: a
429's ``Retry-After``) and what to raise when the tries run out (``give_up``): a retry loop knows
nothing about clouds. ``sleep`` is injectable so tests run without waiting.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")

MAX_RETRY_AFTER_S = 120.0   # a Retry-After longer than this is capped (a bad header must not hang a run)


def retry_after_header(headers) -> float | None:
    """Seconds from a ``Retry-After`` header value in delta-seconds form (what ARM and Google send);
    None when absent or not a non-negative number (the HTTP-date form is not used by these APIs)."""
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        value = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and value >= 0 else None


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
                 give_up: Callable[[BaseException], BaseException] | None = None,
                 retry_after: Callable[[BaseException], float | None] | None = None) -> T:
    """Call ``fn`` up to ``attempts`` times, sleeping ``jitter(min(cap_s, base_s * 2**i))`` between tries.

    An error ``should_retry`` rejects is raised at once, unchanged. When the last try fails with a
    retryable error, ``give_up(error)`` is raised from it if given, else the error itself.
    ``retry_after(error)``: the seconds the server asked for (a 429's ``Retry-After``), or None;
    when it names a wait, the next try comes no sooner (at most :data:`MAX_RETRY_AFTER_S` later):
    a server that says when to come back is listened to, since asking earlier only earns another 429.
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
            wait = jitter(min(cap_s, base_s * 2 ** attempt))
            asked = retry_after(e) if retry_after is not None else None
            if asked is not None:
                wait = max(wait, min(MAX_RETRY_AFTER_S, asked))
            sleep(wait)
    raise AssertionError("unreachable")
