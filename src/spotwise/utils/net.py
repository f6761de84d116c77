"""Loopback networking helpers."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago.

    The kernel picks it; the socket is closed again before returning, so another process could
    in principle take it first — fine for local servers and tests, which start right after.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port
