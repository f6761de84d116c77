"""JSON over HTTPS with the stdlib, retried on 429 / 5xx / connection errors (see :mod:`.retry`)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable

from spotwise.pricing.live import FetchError
from spotwise.pricing.live.retry import with_retries

TIMEOUT_S = 30


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: str, url: str) -> None:
        super().__init__(f"HTTP {status} from {url.split('?')[0]}: {body[:300]}")
        self.status = status
        self.body = body


def _retryable(e: BaseException) -> bool:
    if isinstance(e, HTTPStatusError):
        return e.status == 429 or e.status >= 500
    return isinstance(e, (urllib.error.URLError, ConnectionError, TimeoutError))


def get_json(url: str, *, what: str, headers: dict | None = None,
             sleep: Callable[[float], None] = time.sleep, attempts: int = 5) -> dict:
    def once() -> dict:
        req = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            raise HTTPStatusError(e.code, e.read().decode(errors="replace"), url) from None

    try:
        return with_retries(once, retryable=_retryable, attempts=attempts, sleep=sleep, what=what)
    except HTTPStatusError as e:
        raise FetchError(f"{what} failed: {e}; the previous cache is kept") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"{what} failed: {e}; the previous cache is kept") from e
