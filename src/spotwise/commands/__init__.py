"""CLI commands, one module each: those that run or inspect a run in ``run/``, those about money
(prices, catalog, estimates, spend, simulation) in ``money/``, the rest (config, data, schedules,
serve, tokens, version) here.

A module registers a ``register(app)`` function in :data:`COMMANDS` under the name of the command
(or command group) it adds; :mod:`spotwise.cli` calls every registered one. Adding a command is one
new module in the folder it belongs to. The CLI imports every module of this package at start, so
each must stay cheap to import (typer and the stdlib; the rest inside the command's function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from spotwise.registry import Registry

if TYPE_CHECKING:
    import typer

#: Command name -> the function that adds it to the ``spotwise`` app.
COMMANDS: Registry[Callable[[typer.Typer], None]] = Registry("command", ("spotwise.commands",))
