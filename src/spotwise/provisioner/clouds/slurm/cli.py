"""How spotwise runs Slurm's commands for one cluster: here, or on a login host over ``ssh``.

Every Slurm command spotwise uses (``scontrol``, ``squeue``, ``sbatch``, ``scancel``) goes through
:class:`SlurmRunner`, which adds the cluster's ``SLURM_CONF`` (the config file's ``slurm_conf``)
and, for a cluster reached over ``ssh: user@login-host`` (or ``ssh://user@login-host:port``),
prefixes ``ssh -o BatchMode=yes -o ConnectTimeout=10`` (:mod:`spotwise.utils.ssh`: nothing else of
the user's ``~/.ssh/config`` is overridden) and quotes the remote command (the same commands, run
there; a batch script goes over stdin, so no file is copied and no shared filesystem is assumed).

Two failures are told apart, because they mean different things to a run:

* :class:`SlurmUnreachable`: the cluster cannot be asked at all (ssh fails, a command is missing,
  the controller does not answer, a timeout). The site is skipped with this one line.
* :class:`SlurmCommandError`: Slurm answered and refused (``sbatch: error: ...``): the caller maps
  it onto the typed provisioning errors (:mod:`spotwise.provisioner.slurm_errors`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

from spotwise.errors import SpotwiseError
from spotwise.utils.ssh import parse_destination

#: what ``ssh`` exits with when it, not the remote command, failed
SSH_FAILED = 255
#: a shell's "command not found"
NOT_FOUND = 127


class SlurmUnreachable(SpotwiseError):
    """The cluster cannot be asked (no ssh, no Slurm commands, no controller): skip this site."""


class SlurmCommandError(SpotwiseError):
    """A Slurm command ran and failed; ``stderr`` is Slurm's own message, ``returncode`` its code."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        self.argv, self.returncode, self.stderr = argv, returncode, stderr.strip()
        super().__init__(f"{argv[0]} failed ({returncode}): {self.stderr.splitlines()[-1] if self.stderr else ''}")


#: Slurm's messages for "the controller did not answer" (no code is printed for them): the
#: cluster is down or unreachable, not the request wrong
_NO_CONTROLLER = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
                  "Could not establish a configuration source", "Zero Bytes were transmitted",
                  "Unable to establish controller machine")


@dataclass(frozen=True, slots=True)
class SlurmRunner:
    """Runs Slurm commands for one cluster (see the module's docstring)."""

    ssh: str | None = None
    slurm_conf: str | None = None
    timeout_s: float = 30.0

    @property
    def where(self) -> str:
        return f"over ssh to {self.ssh}" if self.ssh else "on this machine"

    def argv(self, args: list[str]) -> list[str]:
        """The command line that runs ``args`` on the cluster."""
        if not self.ssh:
            return list(args)
        remote = " ".join(shlex.quote(a) for a in args)
        if self.slurm_conf:
            remote = f"SLURM_CONF={shlex.quote(self.slurm_conf)} {remote}"
        return [*parse_destination(self.ssh).argv(), remote]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf and not self.ssh:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def run(self, *args: str, stdin: str | None = None, timeout_s: float | None = None) -> str:
        """``args``' stdout; :class:`SlurmUnreachable` or :class:`SlurmCommandError` otherwise."""
        argv = self.argv(list(args))
        try:
            proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=self.env(),
                                  timeout=timeout_s or self.timeout_s)
        except FileNotFoundError:
            raise SlurmUnreachable(f"{argv[0]} is not installed {self.where}") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"{args[0]} did not answer within {timeout_s or self.timeout_s:.0f} s "
                                   f"{self.where}") from None
        if proc.returncode == 0:
            return proc.stdout
        err = proc.stderr.strip()
        last = err.splitlines()[-1] if err else f"exit code {proc.returncode}"
        if self.ssh and proc.returncode == SSH_FAILED:
            raise SlurmUnreachable(f"ssh to {self.ssh} failed: {last}")
        if proc.returncode == NOT_FOUND:
            raise SlurmUnreachable(f"{args[0]} is not installed {self.where}: {last}")
        if any(m in err for m in _NO_CONTROLLER):
            raise SlurmUnreachable(f"the Slurm controller does not answer {self.where}: {last}")
        raise SlurmCommandError(list(args), proc.returncode, err)
