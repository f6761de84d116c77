"""CLI commands, one module each.

A module registers a ``register(app)`` function in :data:`COMMANDS` under the name of the command
(or command group) it adds; :mod:`spotwise.cli` calls every registered one. Adding a command is one
new module here. The CLI imports every module of this package at start, so each must stay cheap to
import (typer and the stdlib; the rest inside the command's function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from spotwise.registry import Registry

if TYPE_CHECKING:
    import typer

#: Command name -> the function that adds it to the ``spotwise`` app.
COMMANDS: Registry[Callable[[typer.Typer], None]] = Registry("command", ("spotwise.commands",))
