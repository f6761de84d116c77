"""The ``spotwise`` command line.

Each command lives in its own module under :mod:`spotwise.commands` and registers itself on the
app through a ``register(app)`` function; this file only discovers them. Every command takes
``--format table|json``. User errors (:class:`~spotwise.errors.SpotwiseError`) print one clear
message and exit non-zero, never with a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
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
    import spotwise.commands as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"spotwise.commands.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    try:
        # non-standalone click returns a command's `typer.Exit(code)` instead of raising it
        rv = app(args=argv, standalone_mode=False)
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
    except Exception as e:
        # Usage errors (unknown option, bad choice) arrive here in non-standalone mode. typer may
        # vendor its own click, so match by shape rather than by click's classes.
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            return e.exit_code
        if type(e).__name__ == "Abort":
            return 1
        # A bug of ours: one line for the user, the traceback in a log file for the report.
        import traceback

        from spotwise.paths import home

        log = home() / "crash.log"
        with open(log, "a") as f:
            f.write(traceback.format_exc() + "\n")
        print(f"internal error: {type(e).__name__}: {e} (traceback in {log})", file=sys.stderr)
        return 70
    return 0


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
