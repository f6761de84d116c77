"""A tiny wire-level HTTP fake on 127.0.0.1 for the Azure / GCP REST fetchers.

``FakeServer(handler)`` serves ``handler(path_with_query) -> (status, json_body)`` in a thread;
use it as a context manager so it is always shut down (no test leaves a server running).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class FakeServer:
    def __init__(self, handler: Callable[[str], tuple[int, dict]]) -> None:
        self.handler = handler
        self.requests: list[str] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests.append(self.path)
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, body = outer.handler(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
