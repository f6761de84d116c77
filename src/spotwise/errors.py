"""Errors that reach a user.

Every error a user can cause is a :class:`SpotwiseError`; the CLI prints its message (never a
traceback) and exits with its ``exit_code``. Input problems are :class:`InputError`s that name the
field, what was given and what is allowed, so a bad file or flag can be fixed in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass


class SpotwiseError(Exception):
    """A failure with a message meant for the user."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem with user input: where, what was given, what is allowed."""

    field: str
    given: object
    allowed: str

    def __str__(self) -> str:
        return f"{self.field}: got {self.given!r}; allowed: {self.allowed}"


class InputError(SpotwiseError):
    """Bad user input (a task file, a flag, an API payload). Exit code 2, like a usage error."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | Problem, *, source: str = "input") -> None:
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        self.source = source
        lines = [f"{source}: {len(self.problems)} problem(s)"] + [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class Conflict(InputError):
    """The input is well-formed but names something that already exists (a schedule name, a
    budget id), possibly created a moment ago by a concurrent request. The CLI exits 2 like any
    input error; the API answers 409, so a client racing another one can tell "taken" from "bad"."""


def number(field: str, value, *, allow_zero: bool = False, maximum: float | None = None,
           source: str = "input") -> float | None:
    """``value`` as a float when it is a finite number > 0 (>= 0 with ``allow_zero``, <= ``maximum``
    when given); ``None`` passes through. Else an :class:`InputError` naming ``field``.

    Why one helper: money, hours, tokens and prices reach spotwise through flags, task files and
    API bodies; a NaN makes every comparison false (a cap that never stops anything) and an
    infinity stored in a database breaks every later JSON answer that contains it."""
    import math

    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            v = float(value)
        except OverflowError:     # an int too large for a float
            ok = False
        else:
            ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0) and (maximum is None or v <= maximum)
    if not ok:
        rule = "a finite number " + (">= 0" if allow_zero else "> 0") + (f" and <= {maximum:g}" if maximum else "")
        raise InputError(Problem(field, value, rule), source=source)
    return v
