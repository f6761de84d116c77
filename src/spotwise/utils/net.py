"""Loopback networking helpers."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

# Where a port chosen now for a server that binds it later is safe from others taking it first:
# above Ray's default worker port range (10002-19999: every Ray worker binds one) and below the
# kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by default), from which
# every outgoing connection and every server that binds port 0 (Ray's agents, gRPC) is given one.
SERVICE_PORTS_LO = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago.

    The kernel picks it; the socket is closed again before returning, so another process could
    in principle take it first — fine for local servers and tests, which start right after.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768                       # Linux's default; elsewhere a guess, checked by binding


_service_lock = threading.Lock()
_service_next: list[int] = []          # where this process's next search starts (random at first)


def service_port(host: str = "0.0.0.0") -> int:
    """A TCP port free on ``host`` now, for a server that binds it seconds to a minute later (a
    local Ray head's GCS, dashboard and agents, a job's control endpoint), never one this process
    handed out before.

    :func:`free_port`'s kernel-chosen port comes from the ephemeral range, where every outgoing
    connection and every server that binds port 0 is given one at random: on a busy machine (two
    local clusters booting at once) one of them took a control port before the job bound it, and
    the runner's lease pushes met another server's 403; a dashboard agent died with "Address
    already in use". This walks the ports between :data:`SERVICE_PORTS_LO` and the start of the
    ephemeral range, where nothing is handed out unasked, from a random start per process (two
    processes rarely walk the same stretch), checking each by binding it; where that range is too
    small, :func:`free_port`."""
    lo, hi = SERVICE_PORTS_LO, _ephemeral_low()
    if hi - lo < 1000:
        return free_port(host)
    with _service_lock:
        if not _service_next:
            _service_next.append(random.SystemRandom().randrange(lo, hi))
        for _ in range(hi - lo):
            port = _service_next[0]
            _service_next[0] = lo + (port + 1 - lo) % (hi - lo)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
    return free_port(host)
