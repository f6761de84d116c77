"""An ssh destination as the config file spells it, and the ``ssh`` command line that reaches it.

Two spellings, the two OpenSSH itself takes: ``[user@]host`` (``host`` may be an alias of the
user's ``~/.ssh/config``) and ``ssh://[user@]host[:port]`` (OpenSSH reads such URIs natively from
7.7 on; spotwise passes the port as ``-p`` instead, so an older client works the same).

What spotwise adds to the user's own ssh setup is only what a program needs: ``BatchMode=yes`` (a
password or passphrase prompt would hang a run: keys or an agent are required) and a
``ConnectTimeout``. Everything else (the user, identity, jump host, port, known hosts) is whatever
``~/.ssh/config`` says; nothing there is overridden.

A destination is checked before it reaches a command line: a value starting with ``-`` would be an
ssh option, and spaces or shell characters have no place in a host name, so anything but the
spellings above is refused (:func:`parse_destination` raises ``ValueError`` with the why; the
config file turns it into an error naming ``slurm.clusters.I.ssh``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: the options spotwise always gives: never prompt, and give up on a host that does not answer
BASE_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")

_USER = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_HOST = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_PLAIN = re.compile(rf"^(?:(?P<user>{_USER})@)?(?P<host>{_HOST})$")
_URI = re.compile(rf"^ssh://(?:(?P<user>{_USER})@)?(?:(?P<host>{_HOST})|\[(?P<ipv6>[0-9A-Fa-f:.]+)\])"
                  r"(?::(?P<port>[0-9]{1,5}))?/?$")

WHAT = ("user@login-host, login-host (an alias of ~/.ssh/config), or ssh://user@login-host:port "
        "(no spaces, nothing starting with '-')")


@dataclass(frozen=True, slots=True)
class SshDestination:
    """Where ssh goes: ``host`` (an IPv6 address without brackets), ``user`` and ``port`` (None:
    what ``~/.ssh/config`` says, else ssh's own default)."""

    host: str
    user: str | None = None
    port: int | None = None
    #: ssh options of this destination's own, before the caller's (a cloud head's key and
    #: known-hosts file: :mod:`spotwise.provisioner.head_path`); never from the config file
    options: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        """The ``[user@]host`` argument of the ssh command."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def argv(self, *options: str) -> list[str]:
        """``ssh`` with :data:`BASE_OPTIONS`, ``options``, the port and the target (a remote command,
        when there is one, goes after it)."""
        port = ["-p", str(self.port)] if self.port else []
        return ["ssh", *BASE_OPTIONS, *self.options, *options, *port, self.target]

    def __str__(self) -> str:
        return self.target + (f" (port {self.port})" if self.port else "")


def parse_destination(text: str) -> SshDestination:
    """The destination ``text`` names (see the module's docstring); ``ValueError`` naming what is
    accepted otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(WHAT)
    m = _URI.match(text) if text.startswith("ssh://") else _PLAIN.match(text)
    if not m:
        raise ValueError(WHAT)
    port = m.groupdict().get("port")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"a port 1..65535 in {text!r}: {WHAT}")
    host = m.group("host") or m.groupdict().get("ipv6") or ""
    return SshDestination(host=host, user=m.group("user"), port=int(port) if port else None)
