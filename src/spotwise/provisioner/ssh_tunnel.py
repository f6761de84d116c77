"""Ports of a cluster's head, reached from this machine through ssh port forwards via a login host.

A Slurm cluster named with ``ssh: user@login-host`` is driven from a machine (a laptop) that can
reach only the login host: its compute nodes, where the Ray head runs, are behind it. The
orchestrator talks to the head over HTTP (the Ray dashboard's Jobs and state APIs, the job
driver's control endpoint), so each of those ports is forwarded by one ``ssh -N`` process per
spotwise cluster::

    ssh -N -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 -o ServerAliveCountMax=3 \\
        -L 127.0.0.1:LOCAL1:HEAD:PORT1 -L 127.0.0.1:LOCAL2:HEAD:PORT2 user@login-host

and the head's endpoint is handed to the engine as ``http://127.0.0.1:LOCAL``: the rest of the
engine never knows a tunnel is there (:meth:`SlurmCloud.endpoint
<spotwise.provisioner.clouds.slurm.cloud.SlurmCloud.endpoint>`). ``HEAD`` is the head's address as the cluster
names it, resolved by the login host, not here.

The tunnel is treated like an instance: something that costs (a process, a port) and must never be
left behind.

* It is supervised: one thread per tunnel starts ssh, waits until every local port accepts a
  connection (a failed first start raises :class:`SshTunnelError` with ssh's own last line, e.g.
  ``Permission denied (publickey)``), and when ssh exits (the network dropped, the login host
  rebooted, ``ServerAlive`` gave up) starts it again on the same local ports, backing off from 1 s
  to 30 s, so the URLs the engine holds stay valid. While it is down the engine's requests fail
  and are retried by their own logic, as for a head that does not answer.
* It ends with its cluster (:meth:`SshTunnel.close`: the cloud's ``terminate`` of the head and
  ``cleanup_cluster``), at interpreter exit (``atexit``), and, on Linux, when the thread that
  started it dies with its process (``PR_SET_PDEATHSIG``, set by util-linux's ``setpriv
  --pdeathsig TERM`` which then exec's ssh: a runner killed with SIGKILL leaves no ssh behind).
  No Python runs between fork and exec: a ``preexec_fn`` makes CPython use a plain ``fork()`` that
  runs every loaded library's at-fork handlers in the child, and in a process that has hosted
  Ray, torch and the cloud SDKs that child died with SIGSEGV before exec (seen in CI). It runs in a session of its own, so a Ctrl-C in the terminal does not kill it under
  the orchestrator's graceful stop (which still needs the head's control endpoint).
* Every ssh process carries ``SPOTWISE_SSH_TUNNEL=<name>`` in its environment (:data:`MARKER_ENV`),
  so a test, or an operator, finds the processes of a tunnel by scanning ``/proc``.

The local ports come from :func:`spotwise.utils.net.service_port` (below the kernel's ephemeral
range), bound on 127.0.0.1 only. ssh's options besides those above are the user's
(:mod:`spotwise.utils.ssh`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

from spotwise.errors import SpotwiseError
from spotwise.utils.net import service_port
from spotwise.utils.ssh import SshDestination

log = logging.getLogger(__name__)

MARKER_ENV = "SPOTWISE_SSH_TUNNEL"
#: seconds between ssh's keepalives, and how many unanswered ones end it (then it is restarted)
KEEPALIVE_S = 15
KEEPALIVE_COUNT = 3
#: backoff between restarts of an ssh that exited
MIN_BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0


class SshTunnelError(SpotwiseError):
    """The tunnel could not be started (ssh's own last line says why)."""


@dataclass(frozen=True, slots=True)
class Forward:
    """``127.0.0.1:local_port`` here reaches ``remote_host:remote_port`` as the login host sees it."""

    remote_host: str
    remote_port: int
    local_port: int

    def option(self) -> str:
        host = f"[{self.remote_host}]" if ":" in self.remote_host else self.remote_host
        return f"127.0.0.1:{self.local_port}:{host}:{self.remote_port}"


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when the thread that started it dies (Linux, with
    util-linux's ``setpriv``); unchanged elsewhere, where only ``close``/``atexit`` end it."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


class SshTunnel:
    """One supervised ``ssh -N -L ...`` process (see the module's docstring)."""

    def __init__(self, dest: SshDestination, remotes: list[tuple[str, int]], *, name: str,
                 ready_timeout_s: float = 30.0) -> None:
        self.dest, self.name, self.ready_timeout_s = dest, name, ready_timeout_s
        self.forwards = [Forward(h, p, service_port("127.0.0.1")) for h, p in remotes]
        self.restarts = 0               # how many times ssh was started again after it exited
        self.starts = 0                 # how many times a started ssh's forwards all listened
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._first_error: str | None = None
        self._closed = threading.Event()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    # -- what the engine sees ------------------------------------------------------------------
    @property
    def remotes(self) -> list[tuple[str, int]]:
        return [(f.remote_host, f.remote_port) for f in self.forwards]

    def local_port(self, remote_port: int) -> int:
        return next(f.local_port for f in self.forwards if f.remote_port == remote_port)

    def url(self, remote_port: int) -> str:
        """``http://127.0.0.1:LOCAL`` for the head's ``remote_port``."""
        return f"http://127.0.0.1:{self.local_port(remote_port)}"

    @property
    def pid(self) -> int | None:
        """The running ssh's pid (None while none runs)."""
        with self._cond:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def argv(self) -> list[str]:
        opts = ["-N", "-o", "ExitOnForwardFailure=yes", "-o", f"ServerAliveInterval={KEEPALIVE_S}",
                "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}"]
        for f in self.forwards:
            opts += ["-L", f.option()]
        return self.dest.argv(*opts)

    # -- starting, waiting, ending ---------------------------------------------------------------
    def start(self) -> "SshTunnel":
        """Start ssh and return once every forward listens; :class:`SshTunnelError` (and nothing
        left running) when the first start fails."""
        self._thread = threading.Thread(target=self._supervise, name=f"ssh-tunnel-{self.name}", daemon=True)
        _OPEN.add(self)
        self._thread.start()
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._first_error is not None or self.closed)
            error = self._first_error
        if error is not None:
            self.close()
            raise SshTunnelError(f"could not forward the head's ports over ssh to {self.dest}: {error}")
        return self

    def wait_ready(self, timeout_s: float, *, starts: int = 1) -> bool:
        """Block until a running ssh's forwards all listen, and had done so ``starts`` times in
        all (True: ``starts=restarts_seen + 2`` waits for the next restart), or until
        ``timeout_s`` passes or the tunnel is closed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: (self._ready and self.starts >= starts) or self.closed,
                                       timeout=timeout_s) and not self.closed

    def close(self) -> None:
        """End ssh and its supervisor (idempotent); the local ports are free after."""
        self._closed.set()
        with self._cond:
            proc = self._proc
            self._cond.notify_all()
        if proc is not None:
            _end(proc)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        _OPEN.discard(self)

    # -- the supervisor ------------------------------------------------------------------------
    def _spawn(self, errfile) -> subprocess.Popen:
        env = {**os.environ, MARKER_ENV: self.name}
        return subprocess.Popen(_with_parent_death_signal(self.argv()), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=errfile, env=env, start_new_session=True)

    def _supervise(self) -> None:
        backoff, first = MIN_BACKOFF_S, True
        while not self.closed:
            with tempfile.TemporaryFile() as errfile:
                try:
                    proc = self._spawn(errfile)
                except OSError as e:        # no ssh here at all: nothing to retry
                    self._fail(f"ssh could not be run ({e})")
                    return
                with self._cond:
                    self._proc = proc
                if self.closed:             # closed while spawning: close() may have missed it
                    _end(proc)
                    return
                listening = self._await_listening(proc)
                if listening:
                    with self._cond:
                        self._ready = True
                        self.starts += 1
                        self._cond.notify_all()
                    backoff, first = MIN_BACKOFF_S, False
                    proc.wait()
                else:
                    _end(proc)
                with self._cond:
                    self._ready = False
                why = _last_line(errfile) or f"ssh exited with {proc.returncode}"
            if self.closed:
                return
            if first:
                self._fail(why)
                return
            log.warning("ssh tunnel %s to %s exited (%s); starting it again in %.0f s", self.name, self.dest,
                        why, backoff)
            self._closed.wait(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            self.restarts += 1

    def _fail(self, why: str) -> None:
        with self._cond:
            self._first_error = why
            self._cond.notify_all()

    def _await_listening(self, proc: subprocess.Popen) -> bool:
        """Whether every local port accepts a connection while ssh still runs, within
        :attr:`ready_timeout_s` (False: ssh exited, or never listened)."""
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline and not self.closed:
            if proc.poll() is not None:
                return False
            if all(_accepts(f.local_port) for f in self.forwards):
                return proc.poll() is None
            self._closed.wait(0.05)
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _last_line(errfile) -> str:
    errfile.seek(0)
    lines = [ln.strip() for ln in errfile.read().decode(errors="replace").splitlines() if ln.strip()]
    # the probes' own "channel N: open failed" lines say only that the head did not answer yet
    real = [ln for ln in lines if "open failed" not in ln] or lines
    return real[-1] if real else ""


#: every tunnel started and not yet closed by this process: closed at exit, whatever else happened
_OPEN: "weakref.WeakSet[SshTunnel]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for t in list(_OPEN):
        t.close()
