"""The ``spotwise`` command line.

Each command lives in its own module under :mod:`spotwise.commands` and registers its
``register(app)`` function in :data:`spotwise.commands.COMMANDS` (a :class:`~spotwise.registry.
Registry`); this file only calls them. Every command that prints takes ``--format table|json``
(:func:`spotwise.output.format_option`: one choice, one message for a bad value). User errors (:class:`~spotwise.errors.SpotwiseError`) print one clear
message and exit non-zero, never with a traceback.

Numbers on the command line are checked once, here, for every command: each float flag
(money, hours, tokens, prices, seconds) must be a finite number >= 0 and each integer argument
(counts, ids, ports, seeds) a whole number in 0..2**63-1, else a usage error naming the flag
(exit 2). Commands add their own stricter bounds (``> 0``, ``<= 1``).
"""

from __future__ import annotations

import sys

import typer

from spotwise.errors import SpotwiseError

app = typer.Typer(
    name="spotwise",
    help="Train models on cloud GPUs for the least money.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    """Add every command registered in :data:`spotwise.commands.COMMANDS` (name order)."""
    from spotwise.commands import COMMANDS

    for name in COMMANDS.names():
        COMMANDS.get(name)(app)


_register_commands()

INT_MAX = 2**63 - 1


def _check_numbers(cmd, values: dict) -> None:
    """Refuse a non-finite or negative float, or an out-of-range int, in a command's parsed
    arguments, naming the flag (:class:`~spotwise.errors.InputError`, exit 2)."""
    import math

    from spotwise.errors import InputError, Problem

    names = {p.name: (p.name.upper() if getattr(p, "param_type_name", "") == "argument" or not getattr(p, "opts", None)
                      else p.opts[0]) for p in cmd.params}
    probs = []
    for name, v in values.items():
        items = v if isinstance(v, (list, tuple)) else [v]
        for x in items:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue
            if isinstance(x, float) and not math.isfinite(x):
                probs.append(Problem(names.get(name, name), x, "a finite number"))
            elif x < 0:
                probs.append(Problem(names.get(name, name), x, "a number >= 0"))
            elif isinstance(x, int) and x > INT_MAX:
                probs.append(Problem(names.get(name, name), x, f"a whole number <= {INT_MAX}"))
    if probs:
        raise InputError(probs, source=cmd.name or "spotwise")


def _harden(cmd) -> None:
    """Wrap every command's callback (recursively) in :func:`_check_numbers`.

    Why here and not per command: ``float("nan")``, ``float("inf")`` and ``-1`` all parse as
    numbers, and one forgotten check (``--budget nan`` disabled the cap) is enough to break a
    promise; no flag or argument of spotwise takes a negative or non-finite number. Checked on
    the parsed values, so it holds whatever parser typer uses."""
    import functools

    cb = getattr(cmd, "callback", None)
    if cb is not None and not getattr(cb, "_sw_checked", False):
        @functools.wraps(cb)
        def checked(*args, _cb=cb, _cmd=cmd, **kwargs):
            _check_numbers(_cmd, kwargs)
            return _cb(*args, **kwargs)

        setattr(checked, "_sw_checked", True)      # marks a wrapped callback (a function attribute)
        cmd.callback = checked
    for sub in (getattr(cmd, "commands", None) or {}).values():
        _harden(sub)


def command():
    """The click command of the app, its commands wrapped by :func:`_harden` (number checks)."""
    from typer.main import get_command

    cmd = get_command(app)
    _harden(cmd)
    return cmd


def main(argv: list[str] | None = None) -> int:
    try:
        # non-standalone click returns a command's `typer.Exit(code)` instead of raising it
        rv = command().main(args=argv, prog_name="spotwise", standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool):
            return rv
    except SpotwiseError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # typer/click exit paths
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    except Exception as e:  # noqa: BLE001 - the last resort: one line for the user, never a traceback
        # Usage errors (unknown option, bad choice) arrive here in non-standalone mode. typer may
        # vendor its own click, so match by shape rather than by click's classes.
        show, code = getattr(e, "show", None), getattr(e, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        if type(e).__name__ == "Abort":
            return 1
        # A bug of ours: one line for the user, the traceback in a log file for the report.
        import traceback

        import tempfile
        from pathlib import Path

        from spotwise.paths import home

        try:
            log = home() / "crash.log"
        except (OSError, SpotwiseError):   # the state directory is unusable (a bad config file, a full disk)
            log = Path(tempfile.gettempdir()) / "spotwise-crash.log"
        with open(log, "a") as f:
            f.write(traceback.format_exc() + "\n")
        print(f"internal error: {type(e).__name__}: {e} (traceback in {log})", file=sys.stderr)
        return 70
    return 0


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
