"""A private OpenSSH server on 127.0.0.1 for the tests, and a client set up to log in to it.

Everything lives under one temporary directory: the server's host key and ``sshd_config``
(``127.0.0.1:FREEPORT``, public-key login only, forwarding allowed, its own pid file), a client key
whose public half is the only authorized key, and a client ``ssh_config`` (that identity only, a
``known_hosts`` holding exactly the server's key, ``StrictHostKeyChecking yes``). sshd runs in the
foreground as the current user (``sshd -D -e``: our child, ended by :meth:`TestSshd.stop`); the
machine's own sshd, ``/etc/ssh`` and ``~/.ssh`` are never touched.

OpenSSH reads ``~/.ssh/config`` from the passwd entry's home, not ``$HOME``, so the client side is
a directory put first on ``PATH`` (:attr:`TestSshd.env`) holding an ``ssh`` that runs the real one
with ``-F`` naming our config: spotwise runs plain ``ssh`` and gets exactly what a user's
``~/.ssh/config`` would give it. In that config ``lab-login`` is an alias of the server (host name
and port), as a user would write one, and ``127.0.0.1`` is given the port too.

``scripts/install.sh --test`` installs ``openssh-server``/``openssh-client`` where apt works;
where they are missing the tests using this fixture skip and say why.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
#: the privilege-separation directory Debian's sshd insists on (created empty where missing)
PRIVSEP_DIR = Path("/run/sshd")


def missing() -> str | None:
    """Why a test sshd cannot run here (None: it can)."""
    gone = [b for b in ("ssh", "ssh-keygen") if shutil.which(b) is None] + ([] if os.access(SSHD, os.X_OK) else [SSHD])
    if gone:
        return (f"OpenSSH not installed ({', '.join(gone)} missing): scripts/install.sh --test installs Debian's "
                "openssh-server openssh-client where it can")
    if os.geteuid() != 0 and not PRIVSEP_DIR.is_dir():
        return f"sshd needs {PRIVSEP_DIR}, which only root can create; not root here"
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TestSshd:
    """One private sshd under ``root``; :meth:`start` brings it up, :meth:`stop` ends it."""

    __test__ = False

    root: Path
    port: int = 0
    user: str = field(default_factory=getpass.getuser)
    #: where sshd listens (an emulated head: its external address, port 22)
    listen: str = "127.0.0.1"
    #: whether the client key is authorized (False: the authorized keys start empty, for a boot
    #: script to fill, as an emulated head's)
    authorize_client: bool = True
    #: the client addresses (CIDRs) it admits, as a cloud's port-22 rule does (an emulated head: its
    #: security group's); None: any, an empty tuple: none
    allow_from: tuple[str, ...] | None = None
    #: a prefix for sshd's command line (an emulated head in its region's network namespace:
    #: ``nsenter --net=...``, :mod:`emulator.netns`)
    wrap: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None
    _listening: threading.Event = field(default_factory=threading.Event)

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def destination(self) -> str:
        """``user@127.0.0.1`` (the client config gives the port)."""
        return f"{self.user}@127.0.0.1"

    @property
    def uri(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment whose ``ssh`` logs in to this server (see the module's docstring)."""
        return {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}

    def _keygen(self, name: str) -> Path:
        key = self.root / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"spotwise-test-{name}", "-f", str(key)],
                       check=True, capture_output=True)
        return key

    def write_config(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or _free_port()
        host_key, client_key = self._keygen("host_key"), self._keygen("client_key")
        (self.root / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text() if self.authorize_client else "")
        (self.root / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress {self.listen}
HostKey {host_key}
PidFile {self.root}/sshd.pid
AuthorizedKeysFile {self.root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
AllowTcpForwarding yes
PrintMotd no
LogLevel INFO
{self._admitted()}""")
        (self.root / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {Path(f'{host_key}.pub').read_text()}")
        (self.root / "ssh_config").write_text(f"""\
Host lab-login
  HostName 127.0.0.1
  Port {self.port}
Host 127.0.0.1
  Port {self.port}
Host *
  IdentityFile {client_key}
  IdentitiesOnly yes
  UserKnownHostsFile {self.root}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  LogLevel ERROR
""")
        self.bin_dir.mkdir(exist_ok=True)
        wrapper = self.bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {self.root}/ssh_config "$@"\n')
        wrapper.chmod(0o755)

    def _admitted(self) -> str:
        """sshd_config's lines for :attr:`allow_from` (``AllowUsers USER@CIDR``: sshd matches the
        client's address; a connection from elsewhere is refused at login)."""
        if self.allow_from is None:
            return ""
        if not self.allow_from:
            return "DenyUsers *\n"
        return "AllowUsers " + " ".join(f"{self.user}@{c}" for c in self.allow_from) + "\n"

    def start(self, timeout: float = 30) -> "TestSshd":
        self.write_config()
        if not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
        self.proc = subprocess.Popen([*self.wrap, SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        threading.Thread(target=self._log, daemon=True).start()
        if not self._listening.wait(timeout):
            self.stop()
            raise RuntimeError(f"sshd did not listen within {timeout:.0f} s; see {self.root}/sshd.log")
        return self

    def _log(self) -> None:
        """sshd's log to ``sshd.log``; ``Server listening on 127.0.0.1 port N.`` says it is up."""
        assert self.proc is not None and self.proc.stderr is not None
        with open(self.root / "sshd.log", "a") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                if "Server listening on" in line:
                    self._listening.set()
        self._listening.set()       # sshd exited: start() stops waiting (and finds it dead)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sshd_fixture(tmp_path_factory):
    """The body of the ``sshd`` session fixture: the server, started; skipped, saying why, where
    OpenSSH is missing; stopped after."""
    import pytest

    why = missing()
    if why:
        pytest.skip(why)
    server = TestSshd(tmp_path_factory.mktemp("sshd"))
    try:
        server.start()
        if server.proc is None or server.proc.poll() is not None:
            pytest.fail(f"sshd exited at start: {(server.root / 'sshd.log').read_text()}")
        yield server
    finally:
        server.stop()
