"""Every command the CLI has takes ``--format table|json`` (the README promises it)."""

from __future__ import annotations

import typer.main

from spotwise.cli import app


def _leaves(cmd, path: tuple[str, ...] = ()):
    # typer may vendor its own click: walk by shape (a group has ``commands``), not by class
    if getattr(cmd, "commands", None):
        for name, sub in cmd.commands.items():
            yield from _leaves(sub, path + (name,))
    else:
        yield " ".join(path), cmd


def test_every_command_takes_format():
    root = typer.main.get_command(app)
    leaves = dict(_leaves(root))
    assert len(leaves) >= 15, sorted(leaves)          # the walk really found the commands
    missing = [name for name, cmd in leaves.items()
               if not any("--format" in getattr(p, "opts", ()) for p in cmd.params)]
    assert not missing, f"commands without --format: {missing}"
