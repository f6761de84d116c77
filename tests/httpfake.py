"""The loopback HTTP server under every wire-level fake in the tests (and the emulators bench uses).

A fake supplies what it answers — a function per HTTP method, given the :class:`Exchange` (the
request, and the means to answer it) — and :class:`LoopbackServer` does the rest: listen on a
free port of 127.0.0.1, serve each request in a daemon thread, keep quiet, shut down and close.
Methods without a route answer 501, as ``http.server`` does for a missing ``do_<METHOD>``.

    with LoopbackServer({"GET": lambda ex: ex.send_json(200, {"ok": True})}) as srv:
        urllib.request.urlopen(srv.url + "/anything")

Import it as ``httpfake`` (``tests/`` is on ``sys.path`` under pytest, and bench adds it).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping
from urllib.parse import ParseResult, urlparse

Route = Callable[["Exchange"], None]


class Exchange(BaseHTTPRequestHandler):
    """One request: the ``BaseHTTPRequestHandler`` itself (headers, ``path``, ``rfile``, ``wfile``,
    ``connection`` for fakes that must misbehave) plus the few helpers every fake wrote by hand."""

    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.protocol_version = self.server.protocol

    def log_message(self, *args: Any) -> None:   # keep test output clean
        pass

    def _dispatch(self) -> None:
        route = self.server.routes.get(self.command)
        if route is None:
            self.send_error(501, f"Unsupported method ({self.command!r})")
            return
        route(self)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _dispatch

    @property
    def url(self) -> ParseResult:
        return urlparse(self.path)

    def read_body(self) -> bytes:
        """The request body by ``Content-Length`` (``b""`` when there is none)."""
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send(self, status: int, body: bytes | str = b"", ctype: str = "text/plain",
             headers: Mapping[str, str] | None = None) -> None:
        """A complete answer: status, ``Content-Type``, ``Content-Length``, ``headers``, body."""
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send(status, json.dumps(body), "application/json", headers)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], routes: Mapping[str, Route], protocol: str,
                 quiet_errors: bool) -> None:
        self.routes = dict(routes)
        self.protocol = protocol
        self.quiet_errors = quiet_errors
        super().__init__(address, Exchange)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not self.quiet_errors:
            super().handle_error(request, client_address)


class LoopbackServer:
    """``routes`` (``{"GET": fn, ...}``) served on ``host``:``port`` (0: a free one) in a daemon thread.

    ``http11``: keep connections alive (HTTP/1.1), as a proxy in front of S3 must;
    ``quiet_errors``: do not print a traceback when a client goes away mid-request.
    The socket is bound at construction, so :attr:`port` is known before :meth:`start`.
    """

    def __init__(self, routes: Mapping[str, Route], *, host: str = "127.0.0.1", port: int = 0, name: str = "fake-http",
                 http11: bool = False, quiet_errors: bool = False) -> None:
        self._httpd = _HTTPServer((host, port), routes, "HTTP/1.1" if http11 else "HTTP/1.0", quiet_errors)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=name, daemon=True)
        self._started = False

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LoopbackServer:
        self._thread.start()
        self._started = True
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent; safe if never started)."""
        if self._started:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
            self._started = False
        self._httpd.server_close()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
