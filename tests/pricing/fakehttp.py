"""A tiny wire-level HTTP fake on 127.0.0.1 for the Azure / GCP REST fetchers.

``FakeServer(handler)`` serves ``handler(path_with_query) -> (status, json_body)`` in a thread;
use it as a context manager so it is always shut down (no test leaves a server running).
"""

from __future__ import annotations

from typing import Callable

from httpfake import Exchange, LoopbackServer


class FakeServer:
    def __init__(self, handler: Callable[[str], tuple[int, dict]]) -> None:
        self.handler = handler
        self.requests: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._server = LoopbackServer({"GET": self._get}, name="fake-price-api")
        self.url = self._server.url

    def _get(self, ex: Exchange) -> None:
        self.requests.append(ex.path)
        self.headers.append({k.lower(): v for k, v in ex.headers.items()})
        status, body = self.handler(ex.path)
        ex.send_json(status, body)

    def __enter__(self) -> "FakeServer":
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop()
