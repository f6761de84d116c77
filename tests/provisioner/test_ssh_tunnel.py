"""The head's ports through ssh port forwards (provisioner/ssh_tunnel.py), against a real sshd
on 127.0.0.1 (tests/sshd.py): the forward reaches a server behind the "login host", a killed ssh is
started again on the same local port, and no ssh process outlives its tunnel, its closing, its
process's exit, or a SIGKILL of its process."""

from __future__ import annotations

import http.server
import os
import select
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from httpfake import LoopbackServer

from spotwise.provisioner.ssh_tunnel import MARKER_ENV, SshTunnel, SshTunnelError
from spotwise.utils.procs import pid_alive
from spotwise.utils.ssh import parse_destination

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def ssh_env(sshd, monkeypatch):
    """This process's ``ssh`` is the one set up for the test server."""
    monkeypatch.setenv("PATH", sshd.env["PATH"])
    return sshd


@pytest.fixture
def web():
    """An HTTP server on 127.0.0.1 standing in for the head's dashboard: answers its own port."""
    holder: list[LoopbackServer] = []
    with LoopbackServer({"GET": lambda ex: ex.send(200, f"hello from {holder[0].port}")}) as server:
        holder.append(server)
        yield server.port


def _marked(name: str) -> list[int]:
    want = f"{MARKER_ENV}={name}".encode()
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and want in (d / "environ").read_bytes().split(b"\0"):
                out.append(int(d.name))
        except OSError:
            continue
    return [p for p in out if pid_alive(p)]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _wait_gone(pid: int, timeout_s: float = 15) -> bool:
    """Whether ``pid`` (not our child) ends within ``timeout_s``: its pidfd becomes readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_forwards_reach_the_servers_behind_the_login_host_and_close_leaves_nothing(ssh_env, web, tmp_path):
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        t = SshTunnel(parse_destination(ssh_env.uri), [("127.0.0.1", web), ("127.0.0.1", other.server_address[1])],
                      name="t-forward").start()
        try:
            assert t.url(web).startswith("http://127.0.0.1:") and t.local_port(web) != web
            assert _get(t.url(web)) == f"hello from {web}"
            assert _get(t.url(other.server_address[1]))            # both ports, one ssh process
            assert _marked("t-forward") == [t.pid]
            argv = t.argv()
            assert {"ExitOnForwardFailure=yes", "ServerAliveInterval=15", "BatchMode=yes"} <= set(argv)
        finally:
            t.close()
        assert _marked("t-forward") == [] and t.pid is None
        with pytest.raises(OSError):
            _get(t.url(web))
    finally:
        other.shutdown()
        other.server_close()


def test_a_killed_ssh_is_started_again_on_the_same_local_port(ssh_env, web):
    # the plain spelling: the port comes from the client's ssh config, as a user's would
    t = SshTunnel(parse_destination(ssh_env.destination), [("127.0.0.1", web)], name="t-restart").start()
    try:
        url, first = t.url(web), t.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert t.wait_ready(60, starts=2), "the tunnel was not started again"
        assert t.pid not in (None, first) and t.restarts == 1
        assert t.url(web) == url and _get(url) == f"hello from {web}"
    finally:
        t.close()
    assert _marked("t-restart") == []


def test_a_refused_login_is_an_error_with_sshs_reason_and_leaves_nothing(ssh_env, web):
    dest = parse_destination(f"ssh://spotwise-no-such-user@127.0.0.1:{ssh_env.port}")
    with pytest.raises(SshTunnelError, match="Permission denied"):
        SshTunnel(dest, [("127.0.0.1", web)], name="t-refused").start()
    assert _marked("t-refused") == []


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_no_ssh_outlives_its_process(ssh_env, web, end):
    """A process that exits without closing its tunnel (atexit closes it), or is SIGKILLed (the
    kernel's parent-death signal ends ssh), leaves no ssh behind."""
    name = f"t-owner-{end}"
    code = (f"import sys; from spotwise.provisioner.ssh_tunnel import SshTunnel; "
            f"from spotwise.utils.ssh import parse_destination as p; "
            f"t = SshTunnel(p({ssh_env.uri!r}), [('127.0.0.1', {web})], name={name!r}).start(); "
            f"print(t.pid, flush=True); "
            + ("sys.exit(0)" if end == "exit" else "sys.stdin.read()"))
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**ssh_env.env, "PYTHONPATH": str(SRC)})
    assert owner.stdout is not None
    ssh_pid = int(owner.stdout.readline())
    if end == "sigkill":
        owner.kill()
    owner.wait(30)
    assert _wait_gone(ssh_pid), f"ssh {ssh_pid} outlived its owner ({end})"
    assert _marked(name) == []


def test_a_ctrl_c_reaches_the_owner_not_its_ssh(ssh_env, web):
    """Ctrl-C (SIGINT to the terminal's foreground process group) stops the orchestrator gracefully,
    which still talks to the head: the tunnel, in a session of its own, keeps forwarding until it
    is closed."""
    code = (f"import sys, urllib.request; from spotwise.provisioner.ssh_tunnel import SshTunnel; "
            f"from spotwise.utils.ssh import parse_destination as p; "
            f"t = SshTunnel(p({ssh_env.uri!r}), [('127.0.0.1', {web})], name='t-ctrl-c').start()\n"
            # the pid is printed inside the try: the test's SIGINT follows it at once (CI once
            # delivered it before the try was entered). The main thread sleeps in short steps, as
            # the orchestrator's loop does (CI hung there for minutes, the worker's SIGINT ignored)
            # a shell starts a command with SIGINT at its default; the test worker had it ignored
            # (SigIgn in /proc), the child inherited that and Python then installs no handler
            f"import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"try:\n    print(t.pid, flush=True)\n    while True:\n        time.sleep(0.05)\n"
            f"except KeyboardInterrupt:\n"
            f"    print(urllib.request.urlopen(t.url({web}), timeout=10).read().decode(), flush=True)\n"
            f"    t.close()\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**ssh_env.env, "PYTHONPATH": str(SRC)}, start_new_session=True)
    assert owner.stdout is not None
    ssh_pid = int(owner.stdout.readline())
    os.killpg(owner.pid, signal.SIGINT)               # what the terminal does on Ctrl-C
    assert owner.stdout.readline().strip() == f"hello from {web}"
    owner.wait(30)
    assert _wait_gone(ssh_pid) and _marked("t-ctrl-c") == []


def test_a_process_whose_fork_handlers_crash_a_child_still_starts_its_tunnel(ssh_env, web):
    """No Python runs between fork and exec of ssh. In CI, a test worker that had hosted Ray,
    torch and the cloud SDKs got ``ssh exited with -11`` from every tunnel: a ``preexec_fn`` makes
    CPython ``fork()`` and run the loaded libraries' at-fork handlers in the child. Here an
    at-fork handler that crashes the child stands in for those libraries."""
    code = (f"import os, signal, urllib.request; from spotwise.provisioner.ssh_tunnel import SshTunnel; "
            f"from spotwise.utils.ssh import parse_destination as p; "
            f"os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGSEGV)); "
            f"t = SshTunnel(p({ssh_env.uri!r}), [('127.0.0.1', {web})], name='t-atfork').start(); "
            f"print(urllib.request.urlopen(t.url({web}), timeout=10).read().decode(), flush=True); "
            f"t.close()")
    owner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**ssh_env.env, "PYTHONPATH": str(SRC)})
    assert owner.returncode == 0, owner.stderr[-2000:]
    assert owner.stdout.strip() == f"hello from {web}"
    assert _marked("t-atfork") == []
